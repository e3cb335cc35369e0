"""The architecture matrix (tests/architecture_matrix.py) on the installed TransformerLens, and the docs page made from it.

Every public function on a tiny model of every architecture: a result checked against the model's own computation,
or a one-line LensBiasError; the model unchanged afterwards. The rows that must give results, not refusals, are
pinned below, so a regression cannot hide as a refusal.
"""

from __future__ import annotations

import pathlib

import pytest

from lens_bias.core import tl

from .architecture_matrix import CELLS, Row, page, rows, run_row

_DONE: dict[str, Row] = {}
# Cells that must be results on every row of the installed TL (the readout, fingerprints and the default calls).
ALWAYS = ("analyze", "section token_preference", "section contraction", "fingerprint", "compare", "ablate", "intervention ZeroSublayer",
          "intervention HeadwiseRMSNorm")
# Rows whose every cell but the per-expert ones must be a result: the attention edits act there (hook_pattern is live).
COMPLETE = ("hf:gpt2", "hf:gpt_bigcode") if tl.tl_major() >= 4 else ("tl3:gpt2 (LN, learned positions)", "tl3:shortformer")
# Architectures TL 4.3 bridges with a read-only hook_pattern: every attention edit must be refused, never accepted.
READ_ONLY_PATTERN = ("hf:gptj", "hf:gpt_neo", "hf:opt")
ATTENTION_EDITS = ("intervention MaskToSelf", "intervention UniformAttention", "intervention SelfOnlyAttention")
# Mixtures of experts, whose experts are read one at a time; these cells are results there and refusals on one MLP per layer.
MOE = ("hf:mixtral", "hf:qwen2_moe", "hf:qwen3_moe", "hf:olmoe", "hf:granitemoe", "hf:gpt_oss", "hf:deepseek_v3")
PER_EXPERT = ("section super_experts", "super_experts", "intervention RemoveWeight(expert=0)")
# The architectures whose attention declares a learned sink (a softmax logit no key owns); RemoveLearnedSinks acts there only.
LEARNED_SINK = ("hf:gpt_oss",)


# The rows the inner loop runs (each kind of bridge once: a native one whose attention edits act, an HF-built rotary
# one, a read-only hook_pattern, a mixture of experts); every other row is ``wide``, run by the README's command.
REPRESENTATIVE = ("hf:gpt2", "hf:llama", "hf:gptj", "hf:mixtral", "tl3:gpt2 (LN, learned positions)", "tl3:gated RMS rotary (llama-like)")


@pytest.mark.parametrize("row", [row if row in REPRESENTATIVE else pytest.param(row, marks=pytest.mark.wide) for row in rows()])
def test_every_function_on_every_architecture(row):
    result = run_row(row)  # raises on anything but a checked result or a one-line refusal
    _DONE[row] = result
    if result.refused is not None:
        assert row == "hf:codegen" and "cannot run its own forward pass" in result.refused, result.refused
        return
    refused = {name: why for name, why in result.cells.items() if why.startswith("refused")}
    if row == "hf:deepseek_v3":  # its hook_z is not split by its (value) heads: head-wise norms are refused, in one line
        assert "multi-head latent attention" in refused.pop("intervention HeadwiseRMSNorm"), result.cells
    assert not refused.keys() & set(ALWAYS), refused
    if row in COMPLETE:
        assert refused.keys() == {*PER_EXPERT, "intervention RemoveLearnedSinks"}, refused
    if row in MOE:
        assert not refused.keys() & {*PER_EXPERT, "sink_attribution"} and "super_experts" in result.cells["analyze"], refused
    declared = row in LEARNED_SINK
    assert ("intervention RemoveLearnedSinks" in refused) != declared, result.cells["intervention RemoveLearnedSinks"]
    assert result.cells["attention rows sum to"].startswith("learned sink") == declared, result.cells["attention rows sum to"]
    if row in READ_ONLY_PATTERN:
        assert all("copy the model does not read back" in result.cells[name] for name in ATTENTION_EDITS), result.cells
        assert "sink_attribution" not in refused  # the default conditions skip the edits that cannot act


@pytest.mark.wide
def test_the_supported_architectures_page_is_generated_from_the_matrix():
    path = pathlib.Path(__file__).parents[1] / "docs" / f"architectures-tl{tl.tl_major()}.md"
    if f"TransformerLens {tl.tl_version()} " not in path.read_text():  # the page names the version it was made with
        pytest.skip(f"{path.name} was made with another TransformerLens than {tl.tl_version()}: write it again with `python -m tests.architecture_matrix`")
    table = [_DONE.get(row) or run_row(row) for row in rows()]
    assert path.read_text() == page(table), f"{path.name} is stale: write it again with `python -m tests.architecture_matrix`"


def test_the_matrix_has_a_column_per_public_function():
    import lens_bias
    from lens_bias.hooks.base import INTERVENTIONS

    columns = set(CELLS)
    assert {f"section {s}" for s in lens_bias.extend.SECTIONS} <= columns
    assert {f"intervention {name}" for name in INTERVENTIONS} - {"intervention Compose", "intervention RemoveWeights"} <= columns


@pytest.mark.skipif(tl.tl_major() < 4, reason="Hugging Face heads that scale their logits are bridged on TL 4")
@pytest.mark.parametrize("model_type, scaling", [("cohere", {"logit_scale": 0.3}), ("granite", {"logits_scaling": 8.0}),
                                                 ("gemma2", {"final_logit_softcapping": 3.0})])
def test_token_preference_reads_heads_that_scale_their_logits(model_type, scaling):
    """Cohere multiplies its logits, Granite divides them (8 in real checkpoints), Gemma 2 soft-caps them."""
    import torch

    import lens_bias

    from .architecture_matrix import tiny_hf

    hf = tiny_hf(model_type)
    for key, value in scaling.items():
        setattr(hf.config, key, value)
    if hasattr(hf, "logit_scale"):  # Cohere copies the config's value onto the model
        hf.logit_scale = scaling["logit_scale"]
    model = lens_bias.from_hf(hf)
    tokens = lens_bias.random_tokens(16, 8, 512, seed=2)
    p_bar = lens_bias.analyze(model, inputs=tokens, sections=["token_preference"], progress=False).token_preference.p_bar
    with torch.no_grad():
        own = model(tokens)[:, -1].double().softmax(-1).mean(0)
    assert (p_bar - own).abs().max().item() < 1e-6
