"""A GGUF model bigger than memory: its tensors streamed one at a time into an accelerate-dispatched model.

``transformers`` reads a GGUF file whole: it dequantises every tensor into one state dict before accelerate places
any layer, so loading needs memory for the whole model even when ``max_memory`` says most of it goes to disk.
Here the model is built empty (``meta`` weights), accelerate's device map is computed from ``max_memory`` as
``from_pretrained`` computes it, and each GGUF tensor is dequantised, renamed and un-permuted by transformers' own
GGUF processors, cast, and then either set in memory or written to ``offload_folder`` before the next is read.
The peak of loading is what stays in memory plus one tensor in float32; the weights are the ones
``from_pretrained(..., gguf_file=...)`` gives, bit for bit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Union

import torch
from tqdm.auto import tqdm

from lens_bias.core.errors import LensBiasError

__all__ = ["load_gguf_offloaded"]


def load_gguf_offloaded(
    path: Union[str, Path],
    *,
    dtype: torch.dtype = torch.float32,
    device_map: Union[str, dict[str, Any]] = "auto",
    max_memory: dict[Any, Any] | None = None,
    offload_folder: Union[str, Path, None] = None,
    progress: bool = True,
) -> Any:
    """The Hugging Face causal LM in the GGUF file ``path``, placed by accelerate, read one tensor at a time.

    >>> from lens_bias.models import shipped_gguf
    >>> hf = load_gguf_offloaded(shipped_gguf(), max_memory={"cpu": "150MB"}, offload_folder="offload")  # doctest: +SKIP
    >>> sorted(set(hf.hf_device_map.values()))  # doctest: +SKIP
    ['cpu', 'disk']

    Args:
        path: a ``.gguf`` file of an architecture transformers reads.
        dtype: the weights' dtype, applied to each tensor as it is read.
        device_map: "auto", "balanced", "balanced_low_0", "sequential", or ``{module name: device}`` with "cpu" and
            "disk" allowed.
        max_memory: the most each device may hold, e.g. ``{"cpu": "200MB"}``.
        offload_folder: where the weights of modules placed on "disk" are written; needed when any is.

    Returns:
        The model in eval mode, dispatched (``hf_device_map`` set), as ``from_pretrained`` with a device map gives it.
    """
    from accelerate import dispatch_model, init_empty_weights
    from accelerate.utils import find_tied_parameters, set_module_tensor_to_device
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    with init_empty_weights():
        hf = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=dtype)
    hf.tie_weights()
    device_map = _placement(hf, device_map, max_memory)
    disk = [name for name, device in device_map.items() if device == "disk"]
    if disk and offload_folder is None:
        raise LensBiasError(f"the device map puts {len(disk)} modules on disk: pass offload_folder= (a folder for their weights)")
    if offload_folder is not None:
        Path(offload_folder).mkdir(parents=True, exist_ok=True)
    # A weight on disk is read back under its own name, so each name of a tied group gets its own copy there.
    tied = {name: group for group in find_tied_parameters(hf) for name in group}

    index: dict[str, Any] = {}

    def place(name: str, value: torch.Tensor) -> None:
        value, device = value.to(dtype), _device_of(name, device_map)
        if device != "disk":
            set_module_tensor_to_device(hf, name, device, value=value)
        for each in tied.get(name, [name]):
            if _device_of(each, device_map) == "disk":
                # one safetensors file per weight, as from_pretrained writes them: read back without a copy
                file = Path(str(offload_folder)) / f"{each}.safetensors"  # set: checked where the map puts a module on disk
                save_file({each: value.contiguous()}, str(file))
                index[each] = {"safetensors_file": str(file), "weight_name": each, "dtype": str(value.dtype).removeprefix("torch.")}

    _read_tensors(path, config, hf, place, progress)
    hf.tie_weights()  # setting a tensor replaces its Parameter: tie the head to the embedding again
    missing = [n for n, p in hf.named_parameters(remove_duplicate=False) if p.device.type == "meta" and n not in index]
    if missing:
        raise LensBiasError(f"{path.name} has no tensor for {len(missing)} parameters of the model (first: {missing[0]}); "
                            "load it without a device map to see transformers' own report")
    dispatch_model(hf, device_map=device_map, offload_dir=None if offload_folder is None else str(offload_folder),
                   offload_index=index or None, skip_keys=getattr(hf, "_skip_keys_device_placement", None))
    return hf.eval()


def _read_tensors(path: Path, config: Any, hf: Any, place: Callable[[str, torch.Tensor], None], progress: bool) -> None:
    """Hand every weight of the GGUF file to ``place`` under its Hugging Face name, one tensor at a time, dequantised
    and processed as transformers' own GGUF loader does, so the weights come out the same."""
    import numpy as np
    from gguf import GGUFReader, dequantize
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    # The loader gives the processor the GGUF metadata under Hugging Face config names: the config already holds them.
    reader = GGUFReader(str(path))
    field = reader.fields["general.architecture"]
    architecture = bytes(field.parts[field.data[0]]).decode()
    reader.fields.clear()  # most of the metadata is the tokenizer's vocabulary; from here on only tensors are read
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config.to_dict())
    names = get_gguf_hf_weights_map(hf, processor)
    parsed: dict[str, Any] = {"tensors": {}}  # the mixture-of-experts processors gather experts here
    for tensor in tqdm(reader.tensors, desc="GGUF tensors", unit="tensor", disable=not progress):
        result = processor.process(weights=dequantize(tensor.data, tensor.tensor_type), name=tensor.name,
                                   tensor_key_mapping=names, parsed_parameters=parsed)
        if result.name in names:
            place(names[result.name], torch.from_numpy(np.require(result.weights, requirements="W")))  # copies only a read-only map
    for name, value in parsed.pop("tensors").items():
        place(name, value)
    del reader


def _placement(hf: Any, device_map: Any, max_memory: Any) -> dict[str, Any]:
    """``{module name: device}`` as ``from_pretrained`` infers it for a string ``device_map``."""
    from accelerate.utils import get_balanced_memory, get_max_memory, infer_auto_device_map

    if isinstance(device_map, dict):
        return dict(device_map)
    if device_map not in ("auto", "balanced", "balanced_low_0", "sequential"):
        raise LensBiasError(f"device_map must be 'auto', 'balanced', 'balanced_low_0', 'sequential' or a dict, got {device_map!r}")
    no_split = hf._no_split_modules
    if device_map == "sequential":
        budget = get_max_memory(max_memory)
    else:
        budget = get_balanced_memory(hf, max_memory=max_memory, no_split_module_classes=no_split, low_zero=device_map == "balanced_low_0")
    return dict(infer_auto_device_map(hf, max_memory=budget, no_split_module_classes=no_split))


def _device_of(name: str, device_map: dict[str, Any]) -> Any:
    """The device of the longest ``device_map`` entry that is ``name`` or one of its parent modules."""
    owners = [m for m in device_map if m == "" or name == m or name.startswith(m + ".")]
    if not owners:
        raise LensBiasError(f"the device map places no module holding {name}; give it an entry (or use device_map='auto')")
    return device_map[max(owners, key=len)]

