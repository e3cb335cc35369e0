"""The architecture matrix: every public function of lens_bias on a tiny random model of every architecture listed
here, each cell a result checked against the model's own computation or a one-line :class:`LensBiasError`.

TL 4 rows are Hugging Face causal LMs built from their config (d 64, 2 layers, 4 heads, vocab 512) and bridged by
``from_hf``; TL 3 rows are ``HookedTransformerConfig`` variants. ``tests/test_architectures.py`` runs it, and
``docs/architectures-tl4.md`` and ``docs/architectures-tl3.md`` are generated from it (``python -m tests.architecture_matrix``).
"""

from __future__ import annotations

import inspect
import logging
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch

import lens_bias
from lens_bias.core import tl
from lens_bias.core.errors import LensBiasError
from lens_bias.hooks import (
    AmplifyVariance,
    HeadwiseRMSNorm,
    MaskToSelf,
    MeanCenterMLP,
    OddActivation,
    RemoveLearnedSinks,
    RemoveWeight,
    ScaleNorm,
    SelfOnlyAttention,
    SetActivations,
    SubtractPositionEmbedding,
    SwapActivation,
    UniformAttention,
    ZeroOutputDims,
    ZeroSublayer,
)

VOCAB = 512
# Sizes every config takes under one of these names.
_SMALL = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
    max_position_embeddings=64, head_dim=16, n_embd=64, n_layer=2, n_head=4, d_model=64, ffn_dim=128, n_positions=64, num_layers=2,
    num_heads=4, moe_intermediate_size=32, num_experts=4, num_local_experts=4, num_experts_per_tok=2, n_routed_experts=4,
    shared_expert_intermediate_size=32, n_inner=128, rotary_dim=8, word_embed_proj_dim=64, n_kv_heads=2, num_kv_heads=2,
)
# Per architecture: what its config needs beyond the sizes above.
_EXTRA: dict[str, dict[str, Any]] = {
    "gpt_neo": dict(attention_types=[[["global", "local"], 1]], attention_layers=["global", "local"]),
    # multi-head latent attention (its rotary width is head_dim) and a dense first block before the experts
    "deepseek_v3": dict(head_dim=8, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, kv_lora_rank=16, q_lora_rank=32,
                        n_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=1),
}
# Hugging Face config names (model_type) of the TL 4 rows: the families TransformerLens 4 bridges, the MoE ones
# included, and CodeGen, whose bridge cannot run.
HF_ARCHITECTURES = (
    "gpt2", "gpt_neox", "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi", "phi3", "bloom", "falcon",
    "stablelm", "olmo", "olmo2", "olmo3", "granite", "starcoder2", "smollm3", "gpt_bigcode", "mpt", "gptj", "gpt_neo", "opt", "cohere",
    "codegen", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "granitemoe", "gpt_oss", "deepseek_v3",
)
# TL 3 rows: HookedTransformerConfig variants (the fields that differ from the gpt2-like base).
TL3_VARIANTS: dict[str, dict[str, Any]] = {
    "gpt2 (LN, learned positions)": {},
    "gated RMS rotary (llama-like)": dict(normalization_type="RMS", positional_embedding_type="rotary", gated_mlp=True, act_fn="silu"),
    "grouped-query attention": dict(normalization_type="RMS", positional_embedding_type="rotary", n_key_value_heads=2, act_fn="silu"),
    "parallel attention + MLP": dict(parallel_attn_mlp=True, positional_embedding_type="rotary"),
    "alibi": dict(positional_embedding_type="alibi"),
    "shortformer": dict(positional_embedding_type="shortformer"),
    "LNPre (folded norms)": dict(normalization_type="LNPre"),
    "split qkv input": dict(use_split_qkv_input=True),
    "no normalization": dict(normalization_type=None),
    "solu_ln activation": dict(act_fn="solu_ln"),
}


def tiny_hf(model_type: str) -> Any:
    """A tiny random Hugging Face causal LM of ``model_type``, built from its config offline."""
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    params = inspect.signature(cls.__init__).parameters
    config = cls(**{**{k: v for k, v in _SMALL.items() if k in params}, **_EXTRA.get(model_type, {})})
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:2]
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(getattr(config, key, None), int) and getattr(config, key) >= VOCAB:
            setattr(config, key, 0)
    config.tie_word_embeddings = False
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config).eval()


def tiny_hooked(variant: str) -> Any:
    """A tiny TL 3 ``HookedTransformer`` of one :data:`TL3_VARIANTS` entry."""
    HookedTransformer, HookedTransformerConfig = tl.hooked_classes()
    fields = dict(d_model=64, d_head=16, n_heads=4, n_layers=2, n_ctx=64, d_vocab=VOCAB, d_mlp=128, act_fn="gelu", normalization_type="LN", seed=0)
    fields.update(TL3_VARIANTS[variant])
    with torch.random.fork_rng(devices=[]):
        return HookedTransformer(HookedTransformerConfig(**fields)).eval()


def with_trained_norms(model: Any) -> Any:
    """Every norm's gain and bias redrawn away from 1 and 0, as training leaves them: a random init's unit gain hides
    a readout that reads a norm before its gain."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if p.ndim == 1 and ("norm" in name or "ln" in name) and leaf in ("weight", "w"):
                p.copy_(torch.rand(p.shape, generator=g) * 2.5 + 0.25)
            elif p.ndim == 1 and ("norm" in name or "ln" in name) and leaf in ("bias", "b"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return model


def build(row: str) -> Any:
    """The model of a matrix row ("hf:llama" or "tl3:alibi"), with trained-looking norms."""
    kind, name = row.split(":", 1)
    if kind == "hf":
        return with_trained_norms(lens_bias.from_hf(tiny_hf(name)))
    return with_trained_norms(tiny_hooked(name))


def rows() -> list[str]:
    """The rows the installed TransformerLens can hold."""
    return [f"hf:{name}" for name in HF_ARCHITECTURES] if tl.tl_major() >= 4 else [f"tl3:{name}" for name in TL3_VARIANTS]


# ---- the cells ------------------------------------------------------------------------------------------------

TOKENS = torch.randint(0, VOCAB, (4, 12), generator=torch.Generator().manual_seed(3))


def _own_last_logits(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens)[:, -1].double()


def _analyze(model: Any) -> str:
    report = lens_bias.analyze(model, inputs=TOKENS, progress=False)
    p_bar = _own_last_logits(model, TOKENS).softmax(-1).mean(0)
    gap = float((report.token_preference.p_bar - p_bar).abs().max())
    assert gap < 1e-5, f"token preference differs from the model's own softmax by {gap:.3g}"
    _finite(report)
    return ", ".join(report.sections)


def _section(name: str) -> Callable[[Any], str]:
    def cell(model: Any) -> str:
        report = lens_bias.analyze(model, inputs=TOKENS, sections=[name], progress=False)
        _finite(report)
        return "ok"

    return cell


def _finite(report: Any) -> None:
    for name, result in report.sections.items():
        table = result.to_pandas()
        numbers = table.select_dtypes("number")
        assert not numbers.isna().to_numpy().any(), f"{name} returned NaN: {table.head()}"


def _fingerprint(model: Any) -> str:
    fp = lens_bias.fingerprint(model, inputs=TOKENS, progress=False)
    logits = lens_bias.extend.ModelAdapter(model).unembed(fp.features).double()
    gap = float((logits - _own_last_logits(model, TOKENS)).abs().max())
    assert gap < 1e-3, f"the fingerprint's features are not the state the model unembeds (logits off by {gap:.3g})"
    return "ok"


def _compare(model: Any) -> str:
    result = lens_bias.compare(model, model, n=12, seq_len=8, m=8, progress=False)
    assert result.tau_bar > 0.99, result
    return "ok"


def _sink_attribution(model: Any) -> str:
    from lens_bias.analyses.sink_attribution import sink_attribution

    result = sink_attribution(model, TOKENS, n_random=2, position=8, progress=False)
    assert not result.to_pandas().select_dtypes("number").isna().to_numpy().any()
    return "ok"


def _super_weights(model: Any) -> str:
    lens_bias.super_weights(model, TOKENS)
    return "ok"


def _super_experts(model: Any) -> str:
    result = lens_bias.super_experts(model, TOKENS)
    assert int(result.n_routed.sum()) == len(TOKENS) * result.n_routed.shape[0] * _top_k(model), result.n_routed
    return "ok"


def _top_k(model: Any) -> int:
    config = model.original_model.config
    return next(getattr(config, k) for k in ("num_experts_per_tok", "experts_per_token", "top_k") if hasattr(config, k))


def _massive(model: Any) -> str:
    lens_bias.massive_activations(model, TOKENS)
    return "ok"


def _ablate(model: Any) -> str:
    lens_bias.ablate(model, inputs=TOKENS, progress=False)
    return "ok"


def _attention_rows(model: Any) -> str:
    """What a row of the attention pattern sums to over the keys: 1, or less where a learned sink (a softmax logit no
    key owns) takes the rest; a row the model does not account for fails the cell."""
    sums: list[torch.Tensor] = []
    n_layers = int(model.cfg.n_layers)
    with torch.no_grad():
        model.run_with_hooks(TOKENS, fwd_hooks=[(f"blocks.{layer}.attn.hook_pattern", lambda p, hook: sums.append(p.float().sum(dim=-1)))
                                                for layer in range(n_layers)])
    low, high = min(s.min().item() for s in sums), max(s.max().item() for s in sums)
    assert high < 1 + 1e-4, f"attention rows sum to up to {high}"
    if lens_bias.extend.ModelAdapter(model).info.learned_sinks:
        assert low < 1 - 1e-3, f"a declared learned sink that takes nothing: rows sum to at least {low}"
        return f"learned sink: {low:.2f}–{high:.2f}"
    assert low > 1 - 1e-4, f"rows sum to as little as {low} without a declared sink"
    return "1"


def _sliding_layers(model: Any) -> str:
    from lens_bias.core.attention_layout import describe_windows

    return describe_windows(lens_bias.extend.ModelAdapter(model).windows) or "none"


def _acts(intervention: Any) -> Callable[[Any], str]:
    """The intervention is refused in one line, or changes the model's logits."""

    def cell(model: Any) -> str:
        with torch.no_grad():
            plain = model(TOKENS)
            with lens_bias.intervene(model, intervention):
                edited = model(TOKENS)
        assert not torch.equal(plain, edited), f"{intervention} was accepted but left the logits unchanged"
        return "ok"

    return cell


INTERVENTION_CELLS = {
    "MaskToSelf": MaskToSelf(4), "UniformAttention": UniformAttention(), "SelfOnlyAttention": SelfOnlyAttention(),
    "AmplifyVariance": AmplifyVariance(4), "ScaleNorm": ScaleNorm(4), "HeadwiseRMSNorm": HeadwiseRMSNorm(gain=False),
    "ZeroSublayer": ZeroSublayer(), "ZeroOutputDims": ZeroOutputDims(), "SetActivations": SetActivations(values=(100.0,)),
    "RemoveWeight": RemoveWeight(), "RemoveWeight(expert=0)": RemoveWeight(layer=1, expert=0), "MeanCenterMLP": MeanCenterMLP(), "OddActivation": OddActivation(),
    "SwapActivation": SwapActivation("tanh"), "SubtractPositionEmbedding": SubtractPositionEmbedding(), "RemoveLearnedSinks": RemoveLearnedSinks(),
}
# Columns that state a fact of the architecture, written as measured, not as ✓ / ✗.
FACTS: dict[str, Callable[[Any], str]] = {"attention rows sum to": _attention_rows, "sliding layers": _sliding_layers}
CELLS: dict[str, Callable[[Any], str]] = {
    **FACTS,
    "analyze": _analyze,
    **{f"section {name}": _section(name) for name in lens_bias.extend.SECTIONS},
    "fingerprint": _fingerprint,
    "compare": _compare,
    "sink_attribution": _sink_attribution,
    "super_weights": _super_weights,
    "super_experts": _super_experts,
    "massive_activations": _massive,
    "ablate": _ablate,
    **{f"intervention {name}": _acts(iv) for name, iv in INTERVENTION_CELLS.items()},
}


@dataclass
class Row:
    """One architecture's cells: "ok" (or what a default call ran), or "refused: " and the one-line refusal;
    ``refused`` is set when the model itself was refused."""

    row: str
    cells: dict[str, str]
    refused: str | None = None


def run_row(row: str) -> Row:
    """Every cell of one row. A cell raising anything but a one-line :class:`LensBiasError` fails the call."""
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    try:
        try:
            model = build(row)
        except LensBiasError as err:
            return Row(row, {}, _one_line(err))
        w_out = getattr(getattr(model.blocks[0], "mlp", None), "W_out", None)
        if isinstance(w_out, torch.Tensor):  # facts from the weights, not the config (TL 4.3's OPT cfg.d_mlp is twice W_out's)
            assert lens_bias.extend.ModelAdapter(model).info.d_mlp == w_out.shape[0], (row, w_out.shape)
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        with torch.no_grad():
            model(TOKENS[:1])  # TL 4 bridges wire their own capture hooks on the first forward
        hooks = _hook_counts(model)
        cells = {}
        for name, cell in CELLS.items():
            try:
                cells[name] = cell(model)
            except LensBiasError as err:
                cells[name] = "refused: " + _one_line(err)
            except Exception as err:
                raise AssertionError(f"{row} / {name}: {type(err).__name__}: {err}") from err
        after = model.state_dict()
        changed = [k for k, v in weights.items() if not torch.equal(after[k], v)]
        assert not changed, f"{row}: weights changed: {changed[:3]}"
        assert _hook_counts(model) == hooks, f"{row}: hooks left on the model"
        return Row(row, cells)
    finally:
        logging.disable(logging.NOTSET)


def _one_line(err: Exception) -> str:
    text = str(err)
    assert "\n" not in text, f"a refusal must be one line: {text!r}"
    return text


def _hook_counts(model: Any) -> dict[str, int]:
    return {name: len(m._forward_hooks) + len(m._forward_pre_hooks) for name, m in model.named_modules()}


# ---- the docs page --------------------------------------------------------------------------------------------

PAGE_HEAD = """# Supported architectures

Generated from the architecture matrix (`tests/architecture_matrix.py`, run in CI by `tests/test_architectures.py`;
write this page again with `python -m tests.architecture_matrix`). Each row is a tiny random model of the architecture
(d 64, 2 layers, 4 heads, vocabulary 512) with its norms' gains and biases drawn away from 1 and 0, as training leaves
them. Columns: what a row of the attention pattern sums to over the keys (1, or the range where a learned sink, a
softmax logit no key owns, takes the rest) and which layers slide (window as in the model's config), then `analyze()`
with its defaults, then `analyze(sections=[...])` for each section alone, then the other functions, then each
intervention inside `intervene`. Each cell ran it: ✓ is a result checked against the model's own computation (token
preference equals the mean softmax of the model's logits; a fingerprint's features unembed to the model's logits; an
intervention changes the logits; no NaN), ✗ is a refusal in one line, whose reason is listed under the table. After
every cell the model's weights are bit-identical and its hooks are as before.

"""


# Refusals by the start of their text, in the order they are numbered on both pages, so that ✗N means one reason on the
# TL 3 and the TL 4 page alike (a reason one TL never gives leaves its number unused there); others follow, as met.
REFUSAL_NUMBERS = (
    "section super_experts cannot run", "super_experts reads the experts", "RemoveWeight reads a Hugging Face sparse",
    "RemoveLearnedSinks: this model declares no learned sink", "SubtractPositionEmbedding needs hook point(s) ['hook_pos_embed']",
    "hook hook_pos_embed never fired", "section super_neurons cannot run on this model: super_neurons reads", "the model's act_fn",
    "an edit at blocks.L.attn.hook_pattern does not change", "the TransformerLens",
)


class _Numbers(dict):
    """Reason -> its number: that of its entry in REFUSAL_NUMBERS, else the next after them, in the order met."""

    def number(self, reason: str) -> int:
        if reason not in self:
            taken = set(self.values())
            known = next((i + 1 for i, start in enumerate(REFUSAL_NUMBERS) if reason.startswith(start) and i + 1 not in taken), None)
            self[reason] = known if known is not None else len(REFUSAL_NUMBERS) + 1 + sum(n > len(REFUSAL_NUMBERS) for n in self.values())
        return self[reason]


def render(table: list[Row], title: str) -> str:
    """One Markdown section: a table of ✓/✗ and the refusals, numbered."""
    columns = list(CELLS)
    reasons = _Numbers()
    lines = [f"## {title}", "", "| architecture | " + " | ".join(map(_header, columns)) + " |", "|---" * (len(columns) + 1) + "|"]
    for row in table:
        name = row.row.split(":", 1)[1]
        if row.refused is not None:
            number = reasons.number(_generic(row.refused))
            lines.append(f"| {name} | " + " | ".join([f"✗{number}"] * len(columns)) + " |")
            continue
        marks = []
        for column in columns:
            value = row.cells[column]
            if column in FACTS and not value.startswith("refused: "):
                marks.append(value)
            elif value.startswith("refused: "):
                reason = _generic(value.removeprefix("refused: "))
                marks.append(f"✗{reasons.number(reason)}")
            else:
                marks.append("✓")
        lines.append(f"| {name} | " + " | ".join(marks) + " |")
    lines += ["", "Refusals (a number means one reason on the TL 3 and the TL 4 page alike):", ""]
    lines += [f"- ✗{number}: {reason}" for reason, number in sorted(reasons.items(), key=lambda item: item[1])] + [""]
    return "\n".join(lines)


def _header(column: str) -> str:
    """A column's heading: a section of ``analyze`` by its name, a function with ``()``, an intervention by its class."""
    kind, _, name = column.partition(" ")
    if column in FACTS:
        return column
    return name if kind in ("section", "intervention") else f"`{column}()`"


def _generic(reason: str) -> str:
    """A refusal with the architecture's own names taken out, so rows refused for one reason share its number."""
    import re

    reason = re.sub(r"blocks\.\d+\.", "blocks.L.", reason)
    return re.sub(r"\b[A-Z]\w*For(?:CausalLM|ConditionalGeneration)('s)?( model)?", lambda m: "model" + (m.group(1) or ""), reason)


def page(table: list[Row]) -> str:
    title = f"TransformerLens {tl.tl_version()} (`{'TransformerBridge' if tl.tl_major() >= 4 else 'HookedTransformer'}`)"
    return PAGE_HEAD + render(table, title)


if __name__ == "__main__":  # python -m tests.architecture_matrix: write the docs page for the installed TL
    import pathlib

    path = pathlib.Path(__file__).parents[1] / "docs" / f"architectures-tl{tl.tl_major()}.md"
    path.write_text(page([run_row(row) for row in rows()]))
