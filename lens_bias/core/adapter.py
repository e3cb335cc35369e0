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

import contextlib
import contextvars
import functools
import logging
import weakref
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar, cast

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from lens_bias.core import attention_layout, memory, offload
from lens_bias.core.errors import LensBiasError
from lens_bias.core.inputs import Inputs, check_context, is_tokens
from lens_bias.core.model_facts import read_model_info
from lens_bias.core.pass_state import Reading, StopForward
from lens_bias.core.probes import READS, ROLE_ATTRIBUTE, FwdHook, HookFn, Probe, check_hooks, last_position, on_device, unique_probes

__all__ = ["ModelAdapter", "NORMALIZED", "shared_adapters", "one_adapter_per_call"]

logger = logging.getLogger(__name__)

# The final norm before its gain (and bias), on TL 4 and TL 3 alike. The readout, what the model unembeds, is the
# state after the gain: ModelAdapter.readout_probe reads it.
NORMALIZED = "ln_final.hook_normalized"
"""The final norm's output *before* its gain: not what the model unembeds (see :meth:`ModelAdapter.readout_probe`);
kept where a reading must not depend on the gain (SeedPrint's aligned modes)."""

# Per model: the hooks where an edit was seen to change the logits (lens_bias.core.adapter.ModelAdapter.check_edits_act).
_EDITS_ACT: "weakref.WeakKeyDictionary[Any, set[str]]" = weakref.WeakKeyDictionary()
# Per model: the (dtype, device) at which unembed(readout) was seen to equal the model's own logits.
_READOUT_CHECKED: "weakref.WeakKeyDictionary[Any, tuple[str, str]]" = weakref.WeakKeyDictionary()
# The adapters of the call in progress, by id(model): one per model and call (shared_adapters), so a call and every
# helper it reaches read the model's facts and its hook_dict once. None outside any call.
_SHARED: "contextvars.ContextVar[dict[int, ModelAdapter] | None]" = contextvars.ContextVar("lens_bias_adapters", default=None)

F = TypeVar("F", bound=Callable[..., Any])


class _FinalAffine:
    """A TL 3 final norm's gain and bias, applied to its ``hook_normalized`` (which TL 3 reads before them).

    Equal for one norm module, so two readout probes of one model share their key."""

    def __init__(self, norm: Any):  # a final norm with a gain ``w`` (and perhaps a bias ``b``)
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


def _check_counts(n: int, batch_size: int | None) -> None:
    if n < 1:
        raise LensBiasError("the inputs hold no sequences; pass at least one")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise LensBiasError(f"batch_size must be a positive int or None, got {batch_size!r}")


@contextlib.contextmanager
def shared_adapters(replacing: Mapping[int, "ModelAdapter"] | None = None) -> Iterator[None]:
    """Within this scope :meth:`ModelAdapter.of` gives one adapter per model. A scope inside another shares its
    adapters; ``replacing`` (``{id(model): adapter}``) stands in for some of them inside this scope only (``analyze``'s
    regime override), so the outer call never sees them."""
    outer = _SHARED.get()
    if outer is not None and not replacing:
        yield
        return
    token = _SHARED.set({**(outer or {}), **(replacing or {})})
    try:
        yield
    finally:
        _SHARED.reset(token)


def one_adapter_per_call(fn: F) -> F:
    """Run ``fn`` in :func:`shared_adapters`: a root verb and every helper it calls share one adapter per model."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with shared_adapters():
            return fn(*args, **kwargs)

    return cast(F, call)


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
        self.info = read_model_info(model)  # refuses what is not a TransformerLens model
        self.family = self.info.family
        self.model = model
        if next(model.parameters()).is_meta and not offload.is_dispatched(model):
            raise LensBiasError(f"{type(model).__name__}'s weights are on the meta device (shapes, no data); load real weights first, e.g. model.to_empty(device='cpu') and a state dict")

    @classmethod
    def of(cls, model: Any) -> "ModelAdapter":
        """The adapter of ``model`` for the call in progress (:func:`shared_adapters`): built on the first request,
        then the same object; outside a call, a new one."""
        shared = _SHARED.get()
        if shared is None:
            return cls(model)
        found = shared.get(id(model))
        if found is None or found.model is not model:  # an id is reused only after its model is gone
            found = shared[id(model)] = cls(model)
        return found

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

    @functools.cached_property
    def hook_names(self) -> frozenset[str]:
        """The model's hook points by name, read once: a TL 4 bridge builds ``hook_dict`` anew on every access."""
        return frozenset(self.model.hook_dict)

    def has_hook(self, name: str) -> bool:
        return name in self.hook_names

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
        """What the model does to its head's output: on a TL 4 bridge, what its architecture adapter declares
        (``apply_output_logits_transform``: Cohere's logit scale, Granite's logits scaling, Gemma's soft cap); on TL 3,
        the config's ``output_logits_soft_cap``, the one transform a ``HookedTransformer`` applies."""
        declared = getattr(getattr(self.model, "adapter", None), "apply_output_logits_transform", None)
        if callable(declared):
            return cast(Callable[[Tensor], Tensor], declared)
        cap = float(getattr(self.model.cfg, "output_logits_soft_cap", -1.0) or -1.0)
        return (lambda logits: cap * torch.tanh(logits / cap)) if cap > 0 else (lambda logits: logits)

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
        if not is_tokens(inputs):
            self.require(["hook_embed"], "embedding inputs")
            if inputs.shape[-1] != self.info.d_model:  # [n, seq, d_model]
                raise LensBiasError(f"embedding inputs have width {inputs.shape[-1]}, the model's d_model is {self.info.d_model}")
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
        unique = unique_probes(probes)
        self.check_inputs(inputs)
        edits = check_hooks(hooks)
        self.require({p.hook for p in unique.values()} | {name for name, _ in edits}, "this analysis")
        is_embedding = not is_tokens(inputs)
        n, seq_len = inputs.shape[0], inputs.shape[1]
        _check_counts(n, batch_size)
        reading = Reading(unique, n, self.device)
        batch_size = memory.plan_batch(
            self.info, n=n, seq_len=seq_len, dtype=self.dtype, device=self.device, logits=reading.needs_logits, batch_size=batch_size, what=desc
        )
        current: dict[str, Tensor] = {}

        def replace_embedding(activation: Tensor, hook: Any) -> Tensor:
            emb = current["embeddings"]
            if emb.shape != activation.shape:
                raise LensBiasError(f"embedding batch {tuple(emb.shape)} does not match hook_embed {tuple(activation.shape)}")
            return emb.to(device=activation.device, dtype=activation.dtype)

        # Order: the embedding replacement first, interventions next, probes last, so a probe on the same hook
        # point as an intervention reads the edited activation.
        # Edits, the embedding replacement included, must reach the output; hooks that only read need not.
        edits = ([("hook_embed", replace_embedding)] if is_embedding else []) + edits
        self.check_edits_act(edits)
        was_training = self.model.training
        if was_training:  # train()/eval() walk every submodule of a bridge: only switch when needed
            self.model.eval()
        try:
            with torch.inference_mode(), self.model.hooks(fwd_hooks=edits + reading.hooks()):
                for start in tqdm(range(0, n, batch_size), desc=desc, disable=not progress, unit="batch"):
                    stop = min(start + batch_size, n)
                    if is_embedding:
                        current["embeddings"] = inputs[start:stop]
                        tokens = torch.zeros(stop - start, seq_len, dtype=torch.long, device=self.device)
                    else:
                        tokens = on_device(inputs[start:stop], self.device)
                    try:
                        self.model(tokens)
                    except StopForward:
                        pass
                    memory.release_freed()
                    reading.end_batch(start, stop, type(self.model).__name__)
            reading.finite.raise_first(self.info.dtype)
            return reading.kept.result()
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
