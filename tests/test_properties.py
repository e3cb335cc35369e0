"""Property-based tests (Hypothesis) over the public API: whatever shapes, dtypes, sizes and values are drawn,
the outcome is a valid result or a LensBiasError / TypeError / ValueError with a message, and the model is left
unchanged (no hooks, weights bit-identical).

Profiles: "ci" (chosen when CI is set: fixed examples, about two minutes for the file on two cores) and "dev"
(the default locally: more examples). Pick one with ``--hypothesis-profile dev``.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
from unittest import mock

import numpy as np
import pytest
import scipy.stats
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import lens_bias
import lens_bias.hooks as H
from lens_bias.cli import main
from lens_bias.core import memory
from lens_bias.core.probes import last_position
from lens_bias.hooks.base import fix_for_inputs
from lens_bias.core.adapter import ModelAdapter
from lens_bias.seedprint import Fingerprint, InputRecord

from .conftest import assert_same_state, hook_snapshot, state_copy, tiny, warmed_snapshot

settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")

EXPECTED = (lens_bias.LensBiasError, TypeError, ValueError)
D, V, CTX = 32, 100, 16


@pytest.fixture(scope="module")
def model():
    m = tiny(d_model=D, d_vocab=V, n_ctx=CTX, n_heads=4)
    return m, state_copy(m), warmed_snapshot(m)


def unchanged(model_state) -> None:
    m, weights, hooks = model_state
    assert hook_snapshot(m) == hooks
    assert_same_state(m, weights)


def refused(err: BaseException) -> None:
    event(f"refused: {type(err).__name__}")  # --hypothesis-show-statistics tells how many examples ran through
    assert isinstance(err, EXPECTED), f"{type(err).__name__}: {err}"
    assert str(err).strip(), f"{type(err).__name__} without a message"


special_floats = st.sampled_from([0.0, 1.0, -1.0, 1e-30, 1e30, 65504.0, float("nan"), float("inf"), float("-inf")])


@st.composite
def tensors(draw):
    """Tensors of any rank 0-4, small sizes, integer/float/bool dtypes, plain or extreme values."""
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=0, max_size=4)))
    dtype = draw(st.sampled_from([torch.int64, torch.int32, torch.float32, torch.float16, torch.bfloat16, torch.bool]))
    if dtype == torch.bool:
        return torch.zeros(shape, dtype=dtype)
    if dtype in (torch.int64, torch.int32):
        low, high = draw(st.sampled_from([(0, V), (-5, V + 5), (0, 2)]))
        return torch.randint(low, high, shape, generator=torch.Generator().manual_seed(draw(st.integers(0, 99)))).to(dtype)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(draw(st.integers(0, 99)))) * draw(st.sampled_from([0.02, 1.0, 100.0]))
    if x.numel() and draw(st.booleans()):
        x.view(-1)[draw(st.integers(0, x.numel() - 1))] = draw(special_floats)
    return x.to(dtype)


@st.composite
def features(draw, n=None, d=None):
    """Mostly valid SeedPrint features [N, D] (any float dtype), sometimes an extreme value, a wrong rank or dtype."""
    if draw(st.integers(0, 9)) == 0:
        return draw(tensors())
    n = draw(st.integers(0, 40)) if n is None else n
    d = draw(st.integers(0, 24)) if d is None else d
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(draw(st.integers(0, 99))))
    if x.numel() and draw(st.integers(0, 3)) == 0:
        x.view(-1)[draw(st.integers(0, x.numel() - 1))] = draw(special_floats)
    return x.to(draw(st.sampled_from([torch.float32, torch.float64, torch.float16])))


@st.composite
def feature_pairs(draw):
    a = draw(features())
    same = draw(st.integers(0, 3)) > 0 and a.ndim == 2
    return a, draw(features(*a.shape)) if same else draw(features())


sizes = st.integers(-2, 20)
batch_sizes = st.one_of(st.none(), st.integers(-1, 10), st.sampled_from([True, 2.5, "4"]))


@given(inputs=st.one_of(st.sampled_from(["tokens", "embeddings", "text", "nope"]), tensors()), n=sizes, seq_len=sizes,
       batch_size=batch_sizes, sections=st.one_of(st.none(), st.lists(st.sampled_from(["contraction", "sinks", "token_preference", "x"]), min_size=0, max_size=2)))
def test_analyze(model, inputs, n, seq_len, batch_size, sections):
    try:
        report = lens_bias.analyze(model[0], inputs=inputs, n_sequences=n, seq_len=seq_len, batch_size=batch_size, sections=sections, progress=False)
    except EXPECTED as err:
        refused(err)
    else:
        event("result")
        assert report.inputs.n >= 2 and 2 <= report.inputs.seq_len <= CTX
        for name, result in report.sections.items():
            table = result.to_pandas()
            numbers = table.select_dtypes("number").to_numpy()
            assert len(table) and not np.isinf(numbers).any(), name
    unchanged(model)


@given(n=sizes, seq_len=sizes, vocab=st.one_of(st.none(), st.integers(-1, V + 3)), batch_size=batch_sizes,
       inputs=st.sampled_from(["tokens", "embeddings", "garbage"]))
def test_fingerprint(model, n, seq_len, vocab, batch_size, inputs):
    try:
        fp = lens_bias.seedprint.fingerprint(model[0], inputs=inputs, n=n, seq_len=seq_len, vocab=vocab, batch_size=batch_size, progress=False)
    except EXPECTED as err:
        refused(err)
    else:
        event("result")
        assert fp.features.shape == (n, D) and torch.isfinite(fp.features).all()
    unchanged(model)


@given(ab=feature_pairs(), m=st.one_of(st.none(), st.none(), st.integers(-1, 40)), ratio_k=st.sampled_from([0.1, 0.1, 0.5, 0.0, 1.5, float("nan")]),
       temperature=st.sampled_from([10.0, 10.0, 1.0, 0.0, float("inf")]), mode=st.sampled_from(["coset", "coset", "base", "x"]))
def test_seedprint_test(ab, m, ratio_k, temperature, mode):
    a, b = ab
    try:
        result = lens_bias.seedprint.lineage_test(a, b, m=m, ratio_k=ratio_k, temperature=temperature, mode=mode)
    except EXPECTED as err:
        refused(err)
    else:
        event("result")
        assert 0.0 <= result.p <= 1.0 and result.same_lineage == (result.p < result.alpha) and result.n == a.shape[0]
        # No identity dimension in common, or τ undefined: p = 1 and the result says why.
        assert (result.k >= 2 and math.isfinite(result.tau_bar)) or (result.p == 1.0 and result.reason), result
        dims = result.identity_dims
        assert sorted(set(dims)) == dims and all(0 <= d < a.shape[1] for d in dims)
        if len(dims) >= 2:  # each τ computed directly: scipy's τ-b of the two softmaxes over the identity dims
            pa, pb = (torch.softmax(x[:, dims].double() / temperature, dim=1).numpy() for x in (a, b))
            direct = np.array([scipy.stats.kendalltau(pa[:, j], pb[:, j]).statistic for j in range(len(dims))])
            assert result.k == int(np.isfinite(direct).sum())
            np.testing.assert_allclose(result.taus.numpy(), direct, atol=1e-6)
            if result.k:
                assert result.tau_bar == pytest.approx(np.nanmean(direct), abs=1e-9)


INTERVENTIONS = st.sampled_from([
    lambda L: H.OddActivation(layers=L), lambda L: H.MeanCenterMLP(layers=L), lambda L: H.SwapActivation(layers=L, fn="tanh"),
    lambda L: H.SelfOnlyAttention(layers=L), lambda L: H.UniformAttention(layers=L), lambda L: H.ZeroSublayer(layers=L, sublayer="attn"),
    lambda L: H.MaskToSelf(layers=L), lambda L: H.AmplifyVariance(layers=L), lambda L: H.ScaleNorm(layers=L),
    lambda L: H.HeadwiseRMSNorm(layers=L, gain=False), lambda L: H.SetActivations(layer=L[0] if L else 0, dims=(3,), positions=(0,)),
    lambda L: H.RemoveWeight(layer=L[0] if L else 0, row=1, col=2),
])


@given(make=st.lists(INTERVENTIONS, min_size=1, max_size=2), layers=st.one_of(st.none(), st.lists(st.integers(-2, 3), max_size=2)),
       n=st.integers(1, 6), seq_len=st.integers(1, CTX + 2), batch_size=st.one_of(st.none(), st.integers(1, 4)))
def test_interventions(model, make, layers, n, seq_len, batch_size):
    tokens = lens_bias.random_tokens(n, seq_len, V) if n >= 1 and seq_len >= 1 else None
    try:
        edits = [f(layers) for f in make]
        # as analyze does: an edit that reads its batch (MeanCenterMLP) is fixed over all the inputs first
        fixed = fix_for_inputs(model[0], edits, tokens if tokens is not None else lens_bias.random_tokens(n, seq_len, V), batch_size)
        hooks = lens_bias.hooks.edit_hooks(model[0], fixed)
        kept = lens_bias.extend.ModelAdapter(model[0]).collect(
            tokens if tokens is not None else lens_bias.random_tokens(n, seq_len, V), [last_position("ln_final.hook_normalized")],
            batch_size=batch_size, hooks=hooks, progress=False,
        )
    except EXPECTED as err:
        refused(err)
    else:
        event("result")
        # The same edits in one plain forward pass of TransformerLens's own: equal readouts, whatever the batching,
        # except for MeanCenterMLP, whose mean is its batch's by definition (one batch of all the inputs then).
        seen: dict[str, torch.Tensor] = {}
        split = batch_size is not None and batch_size < n and any(isinstance(e, H.MeanCenterMLP) for e in edits)
        with torch.no_grad():
            chunks = tokens.split(batch_size) if split else [tokens]
            for chunk in chunks:
                model[0].run_with_hooks(chunk, fwd_hooks=[*hooks, ("ln_final.hook_normalized", lambda x, hook: seen.setdefault("x", []).append(x[:, -1].clone()))])
        torch.testing.assert_close(kept["ln_final.hook_normalized:last"].float(), torch.cat(seen["x"]).float(), atol=1e-4, rtol=1e-4)
    unchanged(model)


@given(features=features(), n=st.integers(0, 3))
def test_fingerprint_save_load(model, tmp_path_factory, features, n):
    path = tmp_path_factory.mktemp("fp") / "fp.pt"
    fp = Fingerprint(features=features, inputs=InputRecord(kind="tokens", n=n, seq_len=CTX), model=ModelAdapter.of(model[0]).info)
    try:
        fp.save(path)
        back = Fingerprint.load(path)
    except EXPECTED as err:
        refused(err)
        assert not path.exists() or path.stat().st_size > 0
    else:
        event("result")
        assert torch.equal(back.features, features) and back.inputs == fp.inputs and back.model == fp.model
        assert features.ndim == 2 and features.is_floating_point() and torch.isfinite(features).all()
    assert [p.name for p in path.parent.iterdir()] in ([], ["fp.pt"])


FLAGS = st.sampled_from(["--d-model", "--n-layers", "--n-heads", "--d-vocab", "--n-ctx", "--n-sequences", "--seq-len", "--batch-size", "--seed", "--input-seed"])
VALUES = st.sampled_from(["-1", "0", "1", "3", "8", "17", "4.5", "x", "", "1e9", "99999"])


@settings(max_examples=settings.default.max_examples // 2)
@given(pairs=st.lists(st.tuples(FLAGS, VALUES), max_size=4), extra=st.lists(st.sampled_from(
    ["--arch=llama", "--arch=gpt2", "--pos=none", "--attn-only", "--dtype=bfloat16", "--inputs=embeddings", "--inputs=text", "--json", "--sections=sinks", "--device=meta"]), max_size=2))
def test_cli_arguments(pairs, extra):
    base = {"--d-model": "16", "--n-layers": "1", "--n-heads": "2", "--d-vocab": "50", "--n-sequences": "3", "--seq-len": "6"}
    base.update(dict(pairs))
    argv = ["analyze", "--no-progress", *extra, *(x for kv in base.items() for x in kv)]
    out, err = io.StringIO(), io.StringIO()
    # The guard plans against 2 GiB, whatever the machine has: the largest model a drawn size may still build
    # stays small, so the fuzzing cannot take the memory of a CI run that has two suites side by side.
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), mock.patch.object(memory, "available_bytes", lambda device=None: 2**31):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse: an unparsable value
            code = exit_.code
    assert code in (0, 2), (argv, err.getvalue())
    if code == 2:  # the reason in the last line; argparse prints its usage above its own
        lines = err.getvalue().strip().splitlines()
        assert lines[-1].startswith("lens-bias analyze: error: ") and "Traceback" not in err.getvalue(), err.getvalue()
        assert len(lines) == 1 or lines[0].startswith("usage:"), err.getvalue()
    else:
        assert "lens_bias report" in out.getvalue() or out.getvalue().lstrip().startswith("{")
