"""Files lens_bias writes and reads: atomic saves, and loads that turn a foreign or corrupt file into one clear error."""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path
from typing import Any, BinaryIO, Callable, Union

import torch

from lens_bias.core.errors import LensBiasError

__all__ = ["atomic_save", "atomic_write_text", "load_torch_file"]


def atomic_save(obj: Any, path: Union[str, Path]) -> Path:
    """``torch.save`` to a temporary name next to ``path``, then rename: an interrupted or failed write never
    leaves a partial file under the final name (and an existing file there stays intact)."""
    return _atomic(path, lambda handle: torch.save(obj, handle))


def atomic_write_text(path: Union[str, Path], text: str) -> Path:
    """``Path.write_text`` (UTF-8) with the guarantee of :func:`atomic_save`: caches read back later are never
    half-written JSON."""
    return _atomic(path, lambda handle: handle.write(text.encode("utf-8")))


def _atomic(path: Union[str, Path], write: Callable[[BinaryIO], Any]) -> Path:
    path = Path(path)
    if path.is_dir():
        raise LensBiasError(f"{path} is a folder; pass a file name such as {path / 'out.pt'}")
    if not path.parent.exists():
        raise FileNotFoundError(f"cannot write {path}: the folder {path.parent} does not exist")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as err:  # KeyboardInterrupt included: the temporary file goes, the final name is untouched
        tmp.unlink(missing_ok=True)
        interrupt = _interrupt_behind(err)
        if interrupt is not err:
            raise interrupt from None
        raise
    return path


def _interrupt_behind(err: BaseException) -> BaseException:
    """The interrupt (KeyboardInterrupt, SystemExit, ...) that ``err`` was raised while handling, else ``err``.

    torch.save's zip writer, stopped mid-record, raises its own RuntimeError ("unexpected pos") on the way out;
    the caller should see the Ctrl-C it pressed, not that."""
    seen: BaseException | None = err
    while seen is not None:
        if not isinstance(seen, Exception):
            return seen
        seen = seen.__context__
    return err


def load_torch_file(path: Union[str, Path], what: str, fix: str) -> dict[str, Any]:
    """The dict in a lens_bias torch file; ``what`` names the kind of file and ``fix`` how to make a right one."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no {what} at {path}")
    if path.is_dir():
        raise LensBiasError(f"{path} is a folder, not a {what} file")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, TypeError, KeyError, AttributeError,
            IndexError, UnicodeDecodeError, zipfile.BadZipFile) as err:
        if isinstance(err, pickle.UnpicklingError):  # torch's text is a paragraph on weights_only; say what it means
            reason = "not a torch file of tensors and plain values"
        else:
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
        raise LensBiasError(f"{path} is not a lens_bias {what} file, or it is corrupt or truncated ({reason}); {fix}") from None
    if not isinstance(data, dict):
        raise LensBiasError(f"{path} holds a {type(data).__name__}, not a lens_bias {what}; {fix}")
    return data
