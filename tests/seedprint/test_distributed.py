"""Distributed fingerprinting: K ranks under torchrun (gloo on CPU) give exactly the single-process fingerprint."""

import os
import subprocess
import sys

import pytest
import torch

import lens_bias
from lens_bias import LensBiasError, seedprint
from lens_bias.core.distributed import shard_rows
from lens_bias.core.inputs import RandomEmbeddings

SPEC = "llama:d=64,L=2,H=4,V=500,ctx=16,seed=3"


def test_shards_are_whole_batches_in_input_order():
    for n, batch, world in [(50, 8, 2), (10, 3, 4), (7, 8, 3), (64, 8, 2)]:
        shards = [shard_rows(n, batch, r, world) for r in range(world)]
        assert shards[0][0] == 0 and shards[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(shards, shards[1:]))  # contiguous, in order
        assert all((stop - start) % batch == 0 for start, stop in shards[:-1] if stop < n)  # whole batches


def test_embedding_views_draw_the_same_rows():
    emb = RandomEmbeddings(n=10, seq_len=4, d_model=8, mean=0.0, std=1.0, seed=5)
    assert torch.equal(emb.view(3, 9)[0:6], emb[3:9])
    assert torch.equal(emb.view(3, 9).view(2, 4)[0:2], emb[5:7])
    with pytest.raises(LensBiasError, match="view needs"):
        emb.view(4, 11)


def test_distributed_outside_torchrun_says_how_to_run(monkeypatch):
    for var in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    model = lens_bias.random_init("llama", d_model=64, n_layers=2, n_heads=4, d_vocab=500, n_ctx=16)
    with pytest.raises(LensBiasError, match="torchrun --nproc_per_node"):
        seedprint.fingerprint(model, n=8, seq_len=16, distributed=True, progress=False)


@pytest.mark.slow
def test_two_gloo_ranks_equal_one_process(tmp_path):
    out = tmp_path / "dist.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # --standalone: a free port, so two suites side by side (as CI runs them) never meet on torchrun's default one
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "lens_bias", "fingerprint", SPEC,
               "-o", str(out), "--inputs", "embeddings", "--sequences", "44", "--seq-len", "16", "--batch-size", "8",
               "--distributed", "--no-progress"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "rank 1: shard sent to rank 0" in done.stdout and "44 × 64 features" in done.stdout
    model = lens_bias.random_init(lens_bias.ModelSpec.from_dict(seedprint.Fingerprint.load(out).spec))
    single = seedprint.fingerprint(model, inputs="embeddings", n=44, seq_len=16, batch_size=8, progress=False)
    gathered = seedprint.Fingerprint.load(out)
    assert torch.equal(gathered.features, single.features)
    assert gathered.inputs == single.inputs
