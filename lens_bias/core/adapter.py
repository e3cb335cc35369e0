"""One adapter for every TransformerLens model: TL 4.x ``TransformerBridge``, TL 3.x ``HookedTransformer``, or
any ``HookedRootModule`` with the standard hook names.

Analyses never touch the model directly. They hand the adapter :class:`Probe` s (a hook name plus a reduction
applied *inside* the hook, e.g. "keep the last position"), and the adapter runs batched forward passes under
``torch.inference_mode`` with the probes and any interventions attached through the model's own scoped
``model.hooks(...)`` context. Only the reduced tensors are kept, so memory does not grow with the sequence
length; a probe that sums or maxes over sequences (``combine``) is folded into one running total, so it does not
grow with the number of sequences either. The forward pass stops as soon as every probe has fired (the
unembedding over all positions is never computed when nothing reads it).
"""

from __future__ import annotations

import logging
import weakref
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence, Union

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from lens_bias.core import attention_layout, memory, offload, tl
from lens_bias.core.errors import LensBiasError, WrongType
from lens_bias.core.inputs import Inputs, RandomEmbeddings, RandomTokens, check_context
from lens_bias.core.serialise import Serialisable
from lens_bias.core.stats import unit

__all__ = ["ModelAdapter", "ModelInfo", "Probe", "COMBINES", "HookFn", "FwdHook", "last_position", "last_unit_sum", "counting", "NORMALIZED", "REGIME_ATTRIBUTE", "REGIMES", "NAME_ATTRIBUTE"]

logger = logging.getLogger(__name__)

HookFn = Callable[..., Union[Tensor, None]]  # TransformerLens hook signature: fn(activation, hook) -> tensor | None
FwdHook = tuple[str, HookFn]

# The final norm before its gain (and bias), on TL 4 and TL 3 alike. The readout, what the model unembeds, is the
# state after the gain: ModelAdapter.readout_probe reads it.
NORMALIZED = "ln_final.hook_normalized"
"""The final norm's output *before* its gain: not what the model unembeds (see :meth:`ModelAdapter.readout_probe`);
kept where a reading must not depend on the gain (SeedPrint's aligned modes)."""
# What a hook function does with its activation, for the composition check (lens_bias.hooks.base) and the check
# that edits act.
ROLE_ATTRIBUTE = "_lens_bias_role"
READS = "reads"
"""The role of a hook function that only reads its activation: it need not reach the output, so
:meth:`ModelAdapter.check_edits_act` does not check it."""
# Per model: the hooks where an edit was seen to change the logits (lens_bias.core.adapter.ModelAdapter.check_edits_act).
_EDITS_ACT: "weakref.WeakKeyDictionary[Any, set[str]]" = weakref.WeakKeyDictionary()
# Per model: the (dtype, device) at which unembed(readout) was seen to equal the model's own logits.
_READOUT_CHECKED: "weakref.WeakKeyDictionary[Any, tuple[str, str]]" = weakref.WeakKeyDictionary()
# The attribute lens_bias.models records a model's regime in ("init" or "trained").
REGIME_ATTRIBUTE = "lens_bias_regime"
REGIMES = ("init", "trained")
# ... and the name a report shows for it (a GGUF file's general.name, a Hugging Face name_or_path).
NAME_ATTRIBUTE = "lens_bias_name"


COMBINES = ("rows", "sum", "max", "first")


@dataclass(frozen=True)
class Probe:
    """Read one hook point: ``fn`` reduces the activation ``[batch, ...]`` to what is kept.

    ``combine`` says how batches add up: ``"rows"`` keeps one row per sequence (``fn`` returns ``[batch, ...]``,
    the pass returns ``[n, ...]``: memory grows with n); ``"sum"`` and ``"max"`` fold each batch into one running
    total (``fn`` returns the batch's sum or max ``[...]``, the pass returns the total over every sequence, summed
    in float64; memory flat in n); ``"first"`` keeps the first batch's rows only (a bounded sample).

    Probes with the same ``key`` are computed once, so two analyses asking for the same reduction share it; a key
    therefore names one reduction, and two probes with one key and different functions are refused.
    """

    hook: str
    reduction: str  # a name for what fn keeps, e.g. "last"; part of the key
    fn: Callable[[Tensor], Tensor]
    combine: str = "rows"

    def __post_init__(self) -> None:
        if self.combine not in COMBINES:
            raise LensBiasError(f"Probe combine must be one of {COMBINES}, got {self.combine!r}")

    @property
    def key(self) -> str:
        return f"{self.hook}:{self.reduction}"


def _same_reduction(f: Callable[..., Any], g: Callable[..., Any]) -> bool:
    """One function, or closures of one definition over equal values (two ``last_position(hook)`` probes)."""
    if f is g:
        return True
    code = getattr(f, "__code__", None)
    if code is None or code is not getattr(g, "__code__", None):
        return False
    try:
        cells_f, cells_g = (tuple(c.cell_contents for c in h.__closure__ or ()) for h in (f, g))
        same_cells = len(cells_f) == len(cells_g) and all(
            _same_reduction(a, b) if callable(a) and callable(b) and hasattr(a, "__code__") else a == b for a, b in zip(cells_f, cells_g)
        )
        return bool(f.__defaults__ == g.__defaults__ and same_cells)  # type: ignore[attr-defined]
    except (RuntimeError, TypeError, ValueError):  # values without a plain ==, e.g. tensors: not provably equal
        return False


def _unique_probes(probes: Sequence[Probe]) -> dict[str, Probe]:
    unique: dict[str, Probe] = {}
    for probe in probes:
        kept = unique.setdefault(probe.key, probe)
        if kept.combine != probe.combine or not _same_reduction(kept.fn, probe.fn):
            raise LensBiasError(
                f"two probes share the key {probe.key!r} but reduce differently "
                f"({getattr(kept.fn, '__qualname__', kept.fn)!r} combined by {kept.combine!r}, "
                f"{getattr(probe.fn, '__qualname__', probe.fn)!r} by {probe.combine!r}); "
                "only one would be computed: give one of them another reduction name"
            )
    return unique


def counting(name: str, fn: HookFn, fired: set[str]) -> HookFn:
    """``fn`` as a hook that adds ``name`` to ``fired`` whenever it runs: how lens_bias tells an edit that never fired."""

    def hook_fn(activation: Tensor, hook: Any) -> Union[Tensor, None]:
        fired.add(name)
        return fn(activation, hook)

    return hook_fn


def _check_hooks(hooks: Sequence[Any]) -> list[FwdHook]:
    pairs = list(hooks)
    for item in pairs:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and callable(item[1])):
            raise WrongType(
                f"hooks are (hook_name, fn) pairs, got {type(item).__name__}; for interventions pass "
                "lens_bias.hooks.edit_hooks(model, interventions)"
            )
    return pairs


def last_position(hook: str) -> Probe:
    """A probe that keeps the last position of ``hook``: ``[batch, pos, d] -> [batch, d]``."""
    return Probe(hook, "last", lambda x: x[:, -1])


def last_unit_sum(hook: str) -> Probe:
    """A probe that sums the unit vectors of the last position over every sequence: ``[batch, pos, d] -> [d]``.

    The mean direction, and through ``‖Σ u‖² − n`` the mean pairwise cosine, without a row per sequence.
    """
    return Probe(hook, "last_unit_sum", lambda x: unit(x[:, -1]).sum(dim=0), combine="sum")


class _FinalAffine:
    """A TL 3 final norm's gain and bias, applied to its ``hook_normalized`` (which TL 3 reads before them).

    Equal for one norm module, so two readout probes of one model share their key."""

    def __init__(self, norm: torch.nn.Module):
        self.norm = norm

    def __call__(self, x: Tensor) -> Tensor:
        w, b = self.norm.w, getattr(self.norm, "b", None)
        x = x * w.to(x.device)
        return x if b is None else x + b.to(x.device)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _FinalAffine) and other.norm is self.norm

    def __hash__(self) -> int:
        return id(self.norm)


def _after(gain: Callable[[Tensor], Tensor], fn: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    return lambda x: fn(gain(x))


@dataclass(frozen=True)
class ModelInfo(Serialisable):
    """What lens_bias knows about a model: its architecture (read from ``model.cfg``) and whether its weights are a
    random init or trained (``regime``)."""

    family: str  # "bridge" (TL 4.x TransformerBridge), "hooked" (TL 3.x HookedTransformer) or "hooked-root"
    architecture: str | None
    n_layers: int
    d_model: int
    n_heads: int
    d_head: int
    d_mlp: int | None
    d_vocab: int
    n_ctx: int
    act_fn: str | None
    gated_mlp: bool
    normalization: str | None  # "LN", "RMS", ... or None
    positional_embedding: str  # "learned", "rotary", "none", ...
    attn_only: bool
    device: str
    dtype: str
    tl_version: str
    # "init" (random_init, a redrawn model, a fresh config) or "trained" (pretrained, from_hf, a checkpoint, a model
    # lens_bias trained): which laws a report compares the model with. Models lens_bias did not make count as trained.
    regime: str = "trained"
    # Experts per mixture-of-experts MLP (None: a dense MLP), from the model's config.
    n_experts: int | None = None
    # What the model is called: the recorded name (GGUF general.name, HF name_or_path), a random init's spec, or
    # TL's cfg.model_name.
    name: str | None = None
    # Whether the attention declares a learned sink: a softmax logit per head that no key owns (GPT-OSS).
    learned_sinks: bool = False


class _StopForward(Exception):
    """Raised inside the last probe hook to end a forward pass whose remaining layers nobody reads."""


def _nonfinite(activation: Tensor, hook_name: str) -> Tensor:
    """A 0-dim bool tensor: does ``activation`` hold a NaN or an inf? (no device sync; read once per batch)"""
    if not activation.is_floating_point():
        return torch.zeros((), dtype=torch.bool, device=activation.device)
    if hook_name.endswith("hook_attn_scores"):  # the causal mask writes -inf there on purpose
        return torch.isnan(activation).any() | torch.isposinf(activation).any()
    return ~torch.isfinite(activation).all()


class _FiniteCheck:
    """Whether each probed activation held a NaN or an inf, as flags left on the device batch by batch and read once,
    after the pass (a read per batch would stop the device there): the first one found is named."""

    def __init__(self) -> None:
        self.current: list[tuple[str, Tensor]] = []
        self.batches: list[tuple[int, int, list[str], Tensor]] = []  # (start, stop, hooks in firing order, their flags)

    def flag(self, hook_name: str, activation: Tensor) -> None:
        self.current.append((hook_name, _nonfinite(activation, hook_name)))

    def end_batch(self, start: int, stop: int) -> None:
        if self.current:
            device = self.current[0][1].device  # a model split over devices flags each layer where it runs
            self.batches.append((start, stop, [h for h, _ in self.current], torch.stack([on_device(f, device) for _, f in self.current])))
        self.current = []

    def raise_first(self, dtype: str) -> None:
        if not self.batches:
            return
        flags = torch.cat([on_device(f, self.batches[0][3].device) for *_, f in self.batches]).cpu()
        if not flags.any():
            return
        first = int(flags.nonzero()[0])
        for start, stop, hooks, batch in self.batches:
            if first < len(hooks):
                cause = (
                    f"{dtype} overflowed: run the model in bfloat16 or float32" if dtype == "float16"
                    else "the weights or an intervention produced it: check the checkpoint (torch.isfinite on its parameters) and the edits"
                )
                raise LensBiasError(f"NaN/inf first appeared at hook {hooks[first]} (sequences {start}-{stop - 1}) with finite inputs; {cause}")
            first -= len(hooks)


def on_device(value: Tensor, device: torch.device, dtype: torch.dtype | None = None) -> Tensor:
    """``value`` on ``device`` (and in ``dtype``), copied only where it is elsewhere: hooks move their small constant
    tensors (indices, values) to the activation's device this way, never bringing anything back to the host."""
    if value.device == device and (dtype is None or value.dtype == dtype):
        return value
    return value.to(device=device, dtype=dtype)


def _own(value: Tensor) -> Tensor:
    """``value`` in storage of its own: a probe's view (e.g. the last position of ``[batch, pos, d]``) would keep the
    whole batch's activation alive, and memory would grow with the number of batches."""
    return value.clone() if value.untyped_storage().nbytes() > value.numel() * value.element_size() else value


class _Kept:
    """What a pass keeps, batch by batch, where the activations are: each ``"rows"`` probe's rows written into one
    ``[n, ...]`` tensor (allocated once the first batch shows the shape, so nothing is held twice; on the model's
    device when it fits there, else in CPU memory), the running totals of the ``"sum"`` (float64) and ``"max"``
    probes and the first batch of the ``"first"`` probes on the device. :meth:`result` brings each to the host once."""

    def __init__(self, probes: Mapping[str, Probe], n: int, device: torch.device):
        self.probes, self.n, self.device = probes, n, device
        self.batch: dict[str, Tensor] = {}  # this batch's values, by key
        self.out: dict[str, Tensor] = {}
        self.rows_device = torch.device("cpu")

    def check(self, batch: int) -> None:
        """After the first batch: refuse before the totals outgrow the device or the rows of all ``n`` sequences
        outgrow CPU memory (where they end), and keep the rows on the device when they fit beside the totals."""
        per_seq = sum(v.numel() * v.element_size() for k, v in self.batch.items() if self.probes[k].combine == "rows") / batch
        fixed = sum(v.numel() * (8 if self.probes[k].combine == "sum" else 4) for k, v in self.batch.items() if self.probes[k].combine != "rows")
        where = "CPU" if self.device.type == "cpu" else str(self.device)
        device_budget = memory.MEMORY_FRACTION * memory.available_bytes(self.device)
        if fixed > device_budget:
            raise LensBiasError(
                f"the probes' running totals alone need {memory.format_bytes(fixed)} of {where} memory but only {memory.format_bytes(device_budget)} "
                "can be used, whatever the number of sequences; leave out the sections (probes) that keep the largest totals"
            )
        budget = memory.MEMORY_FRACTION * memory.available_bytes("cpu")
        if per_seq * self.n + fixed > budget:
            fits = max(0, int((budget - fixed) // per_seq))  # per_seq > 0 here: the rows alone are over
            totals = f" and {memory.format_bytes(fixed)} of running totals" if fixed else ""
            raise LensBiasError(
                f"the probes keep {memory.format_bytes(per_seq)} per sequence{totals}: {self.n} sequences need about {memory.format_bytes(per_seq * self.n + fixed)} of CPU memory but only "
                f"{memory.format_bytes(budget)} can be used; pass at most {fits} sequences, or probes that reduce more inside the hook"
            )
        if per_seq * self.n + fixed <= device_budget:
            self.rows_device = self.device

    def add_batch(self, start: int, stop: int) -> None:
        for key, value in self.batch.items():
            probe, total = self.probes[key], self.out.get(key)
            if probe.combine == "rows":
                if value.shape[0] != stop - start:
                    raise LensBiasError(f"probe {key!r} returned {value.shape[0]} rows for a batch of {stop - start} sequences; a 'rows' probe keeps one per sequence")
                if total is None:
                    device = value.device if self.rows_device.type != "cpu" else self.rows_device  # a model split over devices keeps each where it is
                    total = self.out[key] = torch.empty((self.n, *value.shape[1:]), dtype=value.dtype, device=device)
                total[start:stop] = value
            elif probe.combine == "first":
                if total is None:
                    self.out[key] = value
            elif total is not None and total.shape != value.shape:
                raise LensBiasError(f"probe {key!r} returned shape {tuple(value.shape)} after {tuple(total.shape)}; a '{probe.combine}' probe returns one shape for every batch")
            elif probe.combine == "sum":
                self.out[key] = value.to(_SUM_DTYPE.get(value.device.type, torch.float64)) if total is None else total.add_(value)
            else:  # "max"
                self.out[key] = value if total is None else torch.maximum(total, value, out=total)
        self.batch.clear()

    def result(self) -> dict[str, Tensor]:
        """The kept values in CPU memory: one copy each, at the end of the pass."""
        return {key: value.cpu() for key, value in self.out.items()}


# Running sums are float64 except where the device has none (Apple's MPS).
_SUM_DTYPE = {"mps": torch.float32}


def _family(model: Any) -> str:
    bridge = tl.bridge_class()
    if bridge is not None and isinstance(model, bridge):
        return "bridge"
    hooked = tl.hooked_transformer_classes()
    if hooked is not None and isinstance(model, hooked[0]):
        return "hooked"
    if isinstance(model, torch.nn.Module) and hasattr(model, "hook_dict") and hasattr(model, "hooks"):
        return "hooked-root"
    raise WrongType(
        f"lens_bias needs a TransformerLens model (TransformerBridge on TL 4.x, HookedTransformer on TL 3.x, or a "
        f"HookedRootModule with the standard hook names); got {type(model).__module__}.{type(model).__name__}. "
        "Build one with lens_bias.models.random_init(...), or wrap a Hugging Face model with "
        "TransformerBridge.boot_transformers(name) / build_bridge_from_module(hf_model, architecture)."
    )


def _name(model: Any, cfg: Any) -> str | None:
    recorded = getattr(model, NAME_ATTRIBUTE, None)
    if recorded:
        return str(recorded)
    spec = getattr(model, "lens_bias_spec", None)
    if spec is not None:
        return f"random init {spec.text}"
    return getattr(cfg, "model_name", None)


def _architecture(model: Any, cfg: Any) -> str | None:
    spec = getattr(model, "lens_bias_spec", None)
    if spec is not None:
        return spec.arch
    return getattr(cfg, "original_architecture", None) or getattr(cfg, "architecture", None)


def _d_mlp(model: Any, configured: int | None) -> int | None:
    """The MLP width read from the first block's ``W_out`` ([d_mlp, d_model]), not the config: TL 4.3's OPT bridge
    reports cfg.d_mlp 256 for a W_out of 128 × 64. Its shape only, so an offloaded (meta) weight is never loaded.
    The config's value where the MLP exposes no ``W_out`` (a mixture of experts)."""
    blocks = getattr(model, "blocks", None)
    try:
        return int(blocks[0].mlp.W_out.shape[0])
    except Exception:  # noqa: BLE001 - no blocks, no MLP, or an MLP without a single W_out
        return configured


def _experts(model: Any, cfg: Any) -> int | None:
    """Experts per MLP of a mixture-of-experts model (its TL or Hugging Face config), else None."""
    hf_cfg = getattr(getattr(model, "original_model", None), "config", None)
    for source in (cfg, hf_cfg):
        for key in ("num_experts", "num_local_experts", "n_routed_experts"):
            value = getattr(source, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 1:
                return value
    return None


def _positional(model: Any, cfg: Any) -> str:
    spec = getattr(model, "lens_bias_spec", None)
    if spec is not None:  # lens_bias factories record "none", which TL configs cannot express
        return spec.positional_embedding
    kind = getattr(cfg, "positional_embedding_type", None) or "standard"
    return "learned" if kind == "standard" else kind


class ModelAdapter:
    """Reads a TransformerLens model's configuration and runs hooked, batched forward passes on it.

    >>> import lens_bias
    >>> m = lens_bias.models.random_init("gpt2", d_model=64, n_layers=2, n_heads=4, d_vocab=100, n_ctx=16)
    >>> adapter = ModelAdapter(m)
    >>> adapter.info.n_layers, adapter.info.positional_embedding
    (2, 'learned')
    >>> out = adapter.collect(lens_bias.random_tokens(3, 16, 100), [last_position("ln_final.hook_normalized")],
    ...                       progress=False)
    >>> out["ln_final.hook_normalized:last"].shape
    torch.Size([3, 64])

    Args:
        model: the model; it is never modified (hooks are scoped, weights are not written).
    """

    def __init__(self, model: Any):
        self.family = _family(model)
        self.model = model
        cfg = getattr(model, "cfg", None)
        if cfg is None:
            raise WrongType(f"{type(model).__name__} has no .cfg; lens_bias reads the architecture from a TL config")
        param = next(model.parameters(), None)
        if param is None:
            raise WrongType(f"{type(model).__name__} has no parameters")
        if param.is_meta and not offload.is_dispatched(model):
            raise LensBiasError(f"{type(model).__name__}'s weights are on the meta device (shapes, no data); load real weights first, e.g. model.to_empty(device='cpu') and a state dict")
        n_heads = int(cfg.n_heads)
        d_model = int(cfg.d_model)
        self.info = ModelInfo(
            family=self.family,
            architecture=_architecture(model, cfg),
            n_layers=int(cfg.n_layers),
            d_model=d_model,
            n_heads=n_heads,
            d_head=int(getattr(cfg, "d_head", 0) or d_model // n_heads),
            d_mlp=None if getattr(cfg, "attn_only", False) else _d_mlp(model, getattr(cfg, "d_mlp", None)),
            d_vocab=int(cfg.d_vocab),
            n_ctx=int(cfg.n_ctx),
            act_fn=getattr(cfg, "act_fn", None),
            gated_mlp=bool(getattr(cfg, "gated_mlp", False)),
            normalization=getattr(cfg, "normalization_type", None),
            positional_embedding=_positional(model, cfg),
            attn_only=bool(getattr(cfg, "attn_only", False)),
            device=str(param.device),
            dtype=str(param.dtype).removeprefix("torch."),
            tl_version=tl.tl_version(),
            regime=getattr(model, REGIME_ATTRIBUTE, None) or "trained",
            n_experts=_experts(model, cfg),
            name=_name(model, cfg),
            learned_sinks=attention_layout.declares_learned_sinks(model),
        )

    # ---- hook names ---------------------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return offload.execution_device(self.model)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def windows(self) -> tuple[int | None, ...]:
        """Each layer's sliding window, None where the layer sees every earlier key (read from the model's config by
        :func:`~lens_bias.core.attention_layout.layer_windows`, which refuses layer types it cannot read)."""
        return attention_layout.layer_windows(self.model, self.info.n_layers)

    def has_hook(self, name: str) -> bool:
        return name in self.model.hook_dict

    def require(self, names: Iterable[str], purpose: str) -> None:
        """Raise a clear error if any hook in ``names`` is missing from the model."""
        missing = [n for n in names if not self.has_hook(n)]
        if missing:
            raise LensBiasError(
                f"{purpose} needs hook point(s) {missing} that this {type(self.model).__name__} does not have. "
                "lens_bias works with TransformerLens models that use the standard hook names "
                "(see model.hook_dict for what yours has)."
            )

    # ---- the readout: the state the model unembeds ---------------------------------------------------------

    @property
    def readout_hook(self) -> str:
        """The hook the readout is read at: ``unembed.hook_in`` on a TL 4 bridge (what the model's head reads),
        ``ln_final.hook_normalized`` on TL 3 (before the gain, which :meth:`readout_probe` applies), or the last
        block's output for a model without a final norm."""
        if self.has_hook("unembed.hook_in"):
            return "unembed.hook_in"
        if self.has_hook(NORMALIZED):
            return NORMALIZED
        return f"blocks.{self.info.n_layers - 1}.hook_resid_post"

    def readout_probe(self, make: Callable[[str], Probe] = last_position) -> Probe:
        """``make(hook)`` (e.g. :func:`last_position`) applied to the readout: the state after the final norm and
        its gain, the one the model's unembedding reads, so ``unembed(readout)`` is the model's own logits.

        >>> import lens_bias
        >>> m = lens_bias.models.random_init("llama", d_model=64, n_layers=1, n_heads=4, d_vocab=100, n_ctx=16)
        >>> adapter = ModelAdapter(m)
        >>> probe = adapter.readout_probe()
        >>> rows = adapter.collect(lens_bias.random_tokens(2, 8, 100), [probe], progress=False)[probe.key]
        >>> bool((adapter.unembed(rows) - m(lens_bias.random_tokens(2, 8, 100))[:, -1]).abs().max() < 1e-4)
        True

        Args:
            make: builds the probe from a hook name.

        Returns:
            The probe; its key names the readout hook.
        """
        probe = make(self.readout_hook)
        norm = getattr(self.model, "ln_final", None)
        if probe.hook != NORMALIZED or not isinstance(getattr(norm, "w", None), torch.nn.Parameter):
            return probe  # the hook already holds the state after the gain (or the norm has none)
        return Probe(probe.hook, probe.reduction + "+gain", _after(_FinalAffine(norm), probe.fn), probe.combine)

    def _logit_transform(self) -> Callable[[Tensor], Tensor]:
        """What the model does to its head's output: Cohere's ``logit_scale``, Granite's ``logits_scaling``,
        Gemma 2/3's final soft cap (TL's ``output_logits_soft_cap`` or the Hugging Face config's)."""
        hf = getattr(self.model, "original_model", None)
        hf_cfg = getattr(hf, "config", None)
        scale = getattr(hf, "logit_scale", None)  # Cohere keeps the config's float on the model
        scale = float(scale) if isinstance(scale, (int, float)) and not isinstance(scale, bool) else 1.0
        divide = float(getattr(hf_cfg, "logits_scaling", None) or 1.0)
        cap = float(getattr(self.model.cfg, "output_logits_soft_cap", -1.0) or -1.0)
        if cap <= 0:
            cap = float(getattr(hf_cfg, "final_logit_softcapping", None) or -1.0)

        def transform(logits: Tensor) -> Tensor:
            logits = logits * (scale / divide) if scale != divide else logits
            return cap * torch.tanh(logits / cap) if cap > 0 else logits

        return transform

    def check_readout(self) -> None:
        """Make sure :meth:`unembed` of the readout is the model's own last-position logits, on one short sequence;
        the answer is kept for the model's lifetime, per dtype and device.

        Raises:
            LensBiasError: when they differ: the model transforms its logits in a way lens_bias does not know, so
                every number read from its logits would be wrong.
        """
        key = (self.info.dtype, str(self.device))
        try:
            if _READOUT_CHECKED.get(self.model) == key:
                return
        except TypeError:  # a model that cannot be weakly referenced is checked every time
            pass
        seq_len = min(6, self.info.n_ctx)
        generator = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, self.info.d_vocab, (2, seq_len), generator=generator)
        probe, read = self.readout_probe(), []
        with torch.inference_mode(), self.model.hooks(fwd_hooks=[(probe.hook, lambda x, hook: read.append(probe.fn(x)))]):
            own = self.model(tokens.to(self.device))[:, -1].float().cpu()  # one pass gives both the readout and the logits
        ours = self._unembed(read[0]).cpu()
        tolerance = (1e-4 if self.dtype in (torch.float32, torch.float64) else 3e-2) * (1.0 + float(own.abs().max()))
        gap = float((ours - own).abs().max())
        if not gap <= tolerance:
            raise LensBiasError(
                f"logits computed from this {self.info.architecture or type(self.model).__name__}'s readout ({self.readout_hook}) differ from "
                f"its own by up to {gap:.3g}: its head transforms the logits in a way lens_bias does not know, so readout numbers would be wrong; "
                "please report it with the model's architecture"
            )
        try:
            _READOUT_CHECKED[self.model] = key
        except TypeError:
            pass

    # ---- edits that act ------------------------------------------------------------------------------------

    def check_edits_act(self, hooks: Iterable[FwdHook]) -> None:
        """Make sure an edit at each of ``hooks`` ((name, fn) pairs) reaches the model's output: on one short
        sequence, a perturbation there alone must change the logits. Functions marked :data:`READS` only read, so
        they are not checked. The answer is kept for the model's lifetime.

        Some TransformerLens bridges expose a read-only copy (``hook_pattern`` on GPT-J, GPT-Neo and OPT): an edit
        there fires but changes nothing, and a measurement under it would report an effect the model never computed.

        Raises:
            LensBiasError: naming the first hook whose edit does not act, and why (not on the forward path, or a
                copy the model does not read back).
        """
        try:
            acting = _EDITS_ACT.setdefault(self.model, set())
        except TypeError:  # a model that cannot be weakly referenced is checked every time
            acting = set()
        todo = sorted({name for name, fn in hooks if getattr(fn, ROLE_ATTRIBUTE, None) != READS} - acting)
        if not todo:
            return
        # One pass for every hook: row 0 runs unedited, row i + 1 is perturbed at hook i alone (sequences of a
        # batch do not interact), so row i + 1's logits differ from row 0's exactly when an edit at hook i acts.
        seq_len = min(6, self.info.n_ctx)
        row = torch.randint(0, self.info.d_vocab, (1, seq_len), generator=torch.Generator().manual_seed(0))
        tokens = row.expand(len(todo) + 1, seq_len).to(self.device)
        fired: set[str] = set()

        def perturb(i: int, name: str) -> HookFn:
            def hook_fn(x: Tensor, hook: Any) -> Tensor | None:
                fired.add(name)
                if not x.is_floating_point():
                    return None
                g = torch.Generator(device=x.device).manual_seed(i)
                one = x[i + 1]
                finite = one[torch.isfinite(one)]
                size = float(finite.abs().mean()) + 1e-3 if finite.numel() else 1.0
                factor = 0.5 + torch.rand(one.shape, generator=g, device=x.device, dtype=x.dtype)
                x = x.clone()
                x[i + 1] = one * factor + 0.1 * size * torch.randn(one.shape, generator=g, device=x.device, dtype=x.dtype)
                return x

            return hook_fn

        with torch.inference_mode(), self.model.hooks(fwd_hooks=[(name, perturb(i, name)) for i, name in enumerate(todo)]):
            logits = self.model(tokens).float()
        scale = 1.0 + float(logits[0].abs().max())
        for i, name in enumerate(todo):
            if name not in fired:
                raise LensBiasError(
                    f"hook {name} never fired in a forward pass of this {type(self.model).__name__}: it is not on the model's computation "
                    "path, so an edit there would have no effect"
                )
            if not float((logits[i + 1] - logits[0]).abs().max()) > 1e-4 * scale:
                raise LensBiasError(
                    f"an edit at {name} does not change this {self.info.architecture or type(self.model).__name__}'s output: TransformerLens "
                    f"{self.info.tl_version} exposes that hook as a copy the model does not read back, so the edit cannot act on this architecture"
                )
            acting.add(name)

    def default_batch_size(self, seq_len: int, n: int | None = None, *, logits: bool = False) -> int:
        """Sequences per forward pass: the most whose estimated peak fits the device's free memory
        (:func:`lens_bias.core.memory.plan_batch`); a :class:`LensBiasError` when not even one sequence fits."""
        return memory.plan_batch(
            self.info, n=n or memory.MAX_TOKENS_PER_BATCH, seq_len=seq_len, dtype=self.dtype, device=self.device, logits=logits
        )

    # ---- running ------------------------------------------------------------------------------------------

    def check_inputs(self, inputs: Inputs) -> None:
        """Raise a clear error for inputs this model cannot take."""
        check_context(inputs.shape[1], self.info.n_ctx)
        if isinstance(inputs, RandomEmbeddings) or (isinstance(inputs, Tensor) and inputs.ndim == 3):
            self.require(["hook_embed"], "embedding inputs")
            if inputs.shape[2] != self.info.d_model:
                raise LensBiasError(f"embedding inputs have width {inputs.shape[2]}, the model's d_model is {self.info.d_model}")
        if isinstance(inputs, Tensor) and inputs.is_floating_point():
            bad = ~torch.isfinite(inputs)
            if bad.any():
                first = tuple(int(i) for i in bad.nonzero()[0])
                raise LensBiasError(
                    f"the input embeddings hold {int(bad.sum())} NaN/inf value(s), the first at index {first}; "
                    "pass finite values (check how they were computed)"
                )

    def collect(
        self,
        inputs: Inputs,
        probes: Sequence[Probe],
        *,
        batch_size: int | None = None,
        hooks: Sequence[FwdHook] = (),
        progress: bool = True,
        desc: str = "lens_bias",
    ) -> dict[str, Float[Tensor, "n ..."]]:
        """Run ``inputs`` through the model in batches and return each probe's kept values, by probe key.

        Results are CPU tensors: a ``"rows"`` probe's float32 rows in input order, a ``"sum"`` probe's float64 total
        over every sequence, a ``"max"`` probe's float32 maximum, a ``"first"`` probe's first batch. They are reduced
        on the model's device and cross to the host once, after the last batch. Hooks are attached with the
        model's scoped ``model.hooks(...)`` context, so they are gone afterwards even on an exception or
        KeyboardInterrupt; the model's train/eval mode is restored.

        Args:
            inputs: token IDs ``[n, seq]`` or :class:`RandomTokens`, embeddings ``[n, seq, d_model]`` or
                :class:`RandomEmbeddings` (the lazy ones are drawn batch by batch).
            probes: what to read; probes sharing a key are computed once (one key, one reduction).
            batch_size: sequences per forward pass (default: :meth:`default_batch_size`).
            hooks: edits of the pass as ``(hook_name, fn)`` forward hooks, attached in order before the probes
                (interventions give theirs through :func:`lens_bias.hooks.base.edit_hooks`).
            progress: show a tqdm bar over batches.
            desc: label of the progress bar.

        Returns:
            ``{probe.key: tensor}``: ``[n, ...]`` for ``"rows"`` probes, the running total ``[...]`` for the others.
        """
        unique = _unique_probes(probes)
        self.check_inputs(inputs)
        edits = _check_hooks(hooks)
        self.require({p.hook for p in unique.values()} | {name for name, _ in edits}, "this analysis")
        is_embedding = not (isinstance(inputs, RandomTokens) or (isinstance(inputs, Tensor) and inputs.ndim == 2))
        n, seq_len = inputs.shape[0], inputs.shape[1]
        if n < 1:
            raise LensBiasError("the inputs hold no sequences; pass at least one")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
            raise LensBiasError(f"batch_size must be a positive int or None, got {batch_size!r}")

        by_hook: dict[str, list[Probe]] = defaultdict(list)
        for probe in unique.values():
            by_hook[probe.hook].append(probe)
        probe_hooks = set(by_hook)
        # The pass runs through the unembedding only when no probe stops it earlier.
        logits = not probe_hooks or any(h.startswith("unembed") for h in probe_hooks)
        batch_size = memory.plan_batch(
            self.info, n=n, seq_len=seq_len, dtype=self.dtype, device=self.device, logits=logits, batch_size=batch_size, what=desc
        )
        kept = _Kept(unique, n, self.device)
        fired_this_batch: set[str] = set()
        current: dict[str, Tensor] = {}
        finite = _FiniteCheck()

        def make_probe_hook(hook_name: str, group: list[Probe]) -> HookFn:
            def hook_fn(activation: Tensor, hook: Any) -> None:
                finite.flag(hook_name, activation)
                for probe in group:
                    if probe.combine == "first" and probe.key in kept.out:  # kept already: not computed again
                        continue
                    # reduced here, on the activation's device; compact, so the activation itself is not held
                    kept.batch[probe.key] = _own(probe.fn(activation).detach().float())
                fired_this_batch.add(hook_name)
                if fired_this_batch >= probe_hooks:
                    raise _StopForward

            return hook_fn

        def replace_embedding(activation: Tensor, hook: Any) -> Tensor:
            emb = current["embeddings"]
            if emb.shape != activation.shape:
                raise LensBiasError(f"embedding batch {tuple(emb.shape)} does not match hook_embed {tuple(activation.shape)}")
            return emb.to(device=activation.device, dtype=activation.dtype)

        # Order: the embedding replacement first, interventions next, probes last, so a probe on the same hook
        # point as an intervention reads the edited activation.
        # Edits, the embedding replacement included, must reach the output; hooks that only read need not.
        self.check_edits_act(edits + ([("hook_embed", replace_embedding)] if is_embedding else []))
        fwd_hooks: list[FwdHook] = []
        if is_embedding:
            fwd_hooks.append(("hook_embed", replace_embedding))
        fwd_hooks += edits
        fwd_hooks += [(name, make_probe_hook(name, group)) for name, group in by_hook.items()]

        was_training = self.model.training
        if was_training:  # train()/eval() walk every submodule of a bridge: only switch when needed
            self.model.eval()
        try:
            with torch.inference_mode(), self.model.hooks(fwd_hooks=fwd_hooks):
                starts = range(0, n, batch_size)
                for start in tqdm(starts, desc=desc, disable=not progress, unit="batch"):
                    stop = min(start + batch_size, n)
                    if is_embedding:
                        current["embeddings"] = inputs[start:stop]
                        tokens = torch.zeros(stop - start, seq_len, dtype=torch.long, device=self.device)
                    else:
                        tokens = on_device(inputs[start:stop], self.device)
                    fired_this_batch.clear()
                    try:
                        self.model(tokens)
                    except _StopForward:
                        pass
                    memory.release_freed()
                    if fired_this_batch != probe_hooks:
                        raise LensBiasError(
                            f"hook point(s) {sorted(probe_hooks - fired_this_batch)} never fired during the forward "
                            f"pass of this {type(self.model).__name__}: they exist but are not on its computation path"
                        )
                    finite.end_batch(start, stop)
                    if start == 0:
                        kept.check(stop - start)
                    kept.add_batch(start, stop)
            finite.raise_first(self.info.dtype)
            return kept.result()
        finally:
            if was_training:
                self.model.train()

    def unembed(self, resid: Float[Tensor, "batch d_model"]) -> Float[Tensor, "batch d_vocab"]:
        """The model's logits from readout states (:meth:`readout_probe`), as float32: its head, then whatever it
        does to the head's output (logit scale, soft cap). Checked once per model against the model's own logits
        (:meth:`check_readout`).

        Lets analyses compute logits at the readout position only, never ``[n, seq, d_vocab]``.
        """
        self.check_readout()
        return self._unembed(resid)

    def _unembed(self, resid: Tensor) -> Tensor:
        x = resid.to(device=self.device, dtype=self.dtype)[:, None, :]
        with torch.inference_mode():
            logits = self.model.unembed(x)[:, 0].float()
        return self._logit_transform()(logits)
