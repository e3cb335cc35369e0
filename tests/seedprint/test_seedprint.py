"""SeedPrint: the reference algorithm line by line, edge cases, fingerprints, null calibration, lineage at toy scale."""

import copy
import math
from dataclasses import asdict, replace

import numpy as np
import pytest
import torch
from scipy.stats import kendalltau, norm, ttest_ind

import lens_bias
from lens_bias import LensBiasError
from lens_bias import seedprint as sp
from lens_bias.core import memory
from lens_bias.core.stats import kendall_tau_b, kendall_tau_b_vectorised
from lens_bias.seedprint.align import ALIGN_MODES

from ..conftest import final_state, requires_tl4, with_final_gain

# ---- Kendall τ-b ----------------------------------------------------------------------------------------------


def paired(n, k, ties):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, k))
    y = 0.4 * x + rng.standard_normal((n, k))
    if ties:
        scale = 0.5 if ties == "heavy" else 3.0
        x, y = np.round(x * scale), np.round(y * scale)
    return x, y


@pytest.mark.parametrize("n, k, ties", [(2, 3, False), (50, 4, True), (513, 7, False), (1000, 5, True), (300, 3, "heavy")])
def test_vectorised_kendall_equals_scipy(n, k, ties):
    x, y = paired(n, k, ties)
    expected = np.array([kendalltau(x[:, j], y[:, j]).statistic for j in range(k)])
    got = kendall_tau_b_vectorised(torch.from_numpy(x), torch.from_numpy(y)).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-9, rtol=0)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_kendall_takes_the_exact_path_of_the_device(device, dtype, monkeypatch):
    """CPU: scipy's loop (faster there); CUDA: the vectorised one. Both equal scipy on the same values."""
    x, y = paired(400, 6, True)
    xt, yt = torch.from_numpy(x).to(device, dtype), torch.from_numpy(y).to(device, dtype)
    xs, ys = xt.double().cpu().numpy(), yt.double().cpu().numpy()  # the values as the dtype holds them
    expected = np.array([kendalltau(xs[:, j], ys[:, j]).statistic for j in range(6)])
    calls = []
    monkeypatch.setattr("lens_bias.core.stats.kendall_tau_b_vectorised", lambda a, b: calls.append(1) or kendall_tau_b_vectorised(a, b))
    got = kendall_tau_b(xt, yt)
    assert got.device.type == device and got.dtype == torch.float64
    assert len(calls) == (device == "cuda")
    np.testing.assert_allclose(got.cpu().numpy(), expected, atol=1e-9, rtol=0)
    np.testing.assert_allclose(kendall_tau_b_vectorised(xt, yt).cpu().numpy(), expected, atol=1e-9, rtol=0)


@pytest.mark.parametrize("kendall", [kendall_tau_b, kendall_tau_b_vectorised])
def test_kendall_constant_column_is_nan_like_scipy(kendall):
    x = torch.tensor([[1.0, 2.0], [1.0, 3.0], [1.0, 1.0]])
    y = torch.tensor([[3.0, 1.0], [2.0, 2.0], [1.0, 3.0]])
    got = kendall(x, y)
    assert math.isnan(got[0]) and got[1].item() == pytest.approx(kendalltau([2, 3, 1], [1, 2, 3]).statistic)
    with pytest.raises(ValueError, match="must both be"):
        kendall(x, y[:2])


# ---- the algorithm, line by line against the spec --------------------------------------------------------


def reference_seedprint(fa, fb, m, mode="coset", temperature=10.0, aggregate=False):
    """../shared/reference/seedprint.md, step by step with scipy."""
    avg_a, avg_b = fa.mean(0), fb.mean(0)
    ids_a = set(torch.topk(avg_a, m, largest=False).indices.tolist())
    ids_b = set(torch.topk(avg_b, m, largest=False).indices.tolist())
    dims = sorted(ids_a & ids_b) if mode == "coset" else sorted(ids_a)
    pa = torch.softmax(fa[:, dims].double() / temperature, dim=1).numpy()
    pb = torch.softmax(fb[:, dims].double() / temperature, dim=1).numpy()
    taus = np.array([kendalltau(pa[:, j], pb[:, j]).statistic for j in range(len(dims))])
    n, k = fa.shape[0], len(dims)
    sd = math.sqrt(2 * (2 * n + 5) / (9 * n * (n - 1)))
    tau_bar = taus.mean()
    z = tau_bar / (sd / math.sqrt(k))
    p = min(1.0, 2 * norm.sf(z))
    # log10 p in log space, where p itself underflows to 0
    out = {"dims": dims, "taus": taus, "tau_bar": tau_bar, "z": z, "p": p, "log10_p": min(0.0, (math.log(2) + norm.logsf(z)) / math.log(10))}
    if aggregate:
        agg = kendalltau(fa[:, dims].mean(1).numpy(), fb[:, dims].mean(1).numpy()).statistic
        top = max(z, agg / sd)
        out.update(tau_agg=agg, z_agg=agg / sd, p=min(1.0, 4 * norm.sf(top)), log10_p=min(0.0, (math.log(4) + norm.logsf(top)) / math.log(10)))
    return out


def related_pair(n=400, d=48, strength=0.15, seed=0):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, d, generator=g) + torch.linspace(-1, 1, d)  # distinct dimension means
    jitter = 0.5 * torch.randn(d, generator=g)  # b's dimension means: a's, reordered in part
    other = strength * base + torch.randn(n, d, generator=g) + 0.5 * torch.linspace(-1, 1, d) + jitter
    return base, other


@pytest.mark.parametrize("mode", ["coset", "base"])
@pytest.mark.parametrize("aggregate", [False, True])
@pytest.mark.parametrize("strength", [0.15, 3.0])  # p ~ 1e-35, and p below float64's range
def test_analytic_test_equals_the_reference_loop(mode, aggregate, strength):
    fa, fb = related_pair(strength=strength)
    ref = reference_seedprint(fa, fb, m=20, mode=mode, aggregate=aggregate)
    res = sp.lineage_test(fa, fb, m=20, mode=mode, null=sp.AnalyticNull(aggregate=aggregate))
    assert res.identity_dims == ref["dims"] and res.k == len(ref["dims"])
    np.testing.assert_allclose(res.taus.numpy(), ref["taus"], atol=1e-6)  # stored as float32
    assert res.tau_bar == pytest.approx(ref["tau_bar"], abs=1e-12)
    assert res.z == pytest.approx(ref["z"], rel=1e-9)
    assert res.p == pytest.approx(ref["p"], rel=1e-6, abs=1e-300)
    assert res.log10_p == pytest.approx(ref["log10_p"], rel=1e-6)
    if strength > 1:
        assert ref["p"] == 0 and ref["log10_p"] < -330, "this pair is meant to underflow p"
    else:
        assert ref["log10_p"] == pytest.approx(math.log10(ref["p"]), rel=1e-9)
    if aggregate:
        assert res.null_details["tau_agg"] == pytest.approx(ref["tau_agg"], abs=1e-12)


def test_default_m_and_numpy_inputs():
    fa, fb = related_pair(d=60)
    res = sp.lineage_test(fa.numpy(), fb.numpy())  # m = ⌊0.10 · 60⌋ = 6
    assert res.m == 6 and res.identity_dims == reference_seedprint(fa, fb, 6)["dims"]


def test_empirical_null_is_a_one_sided_test_against_pipeline_taus():
    fa, fb = related_pair(n=200, d=32)
    res = sp.lineage_test(fa, fb, m=16, null=sp.EmpiricalNull(n_trials=4, test_type="welch", seed=5))
    g = torch.Generator().manual_seed(5)
    pooled = []
    for _ in range(4):
        ra, rb = torch.randn(200, 32, generator=g), torch.randn(200, 32, generator=g)
        pooled.extend(reference_seedprint(ra, rb, 16)["taus"])
    expected = ttest_ind(reference_seedprint(fa, fb, 16)["taus"], pooled, alternative="greater", equal_var=False).pvalue
    assert res.p == pytest.approx(expected, rel=1e-6)
    assert res.null_details["null_taus_mean"] == pytest.approx(np.mean(pooled), abs=1e-6)


def test_edge_cases():
    n = 100
    g = torch.Generator().manual_seed(0)
    fa, fb = torch.randn(n, 10, generator=g), torch.randn(n, 10, generator=g)
    fa[:, :5] -= 5  # a's smallest means: dims 0-4; b's: dims 5-9
    fb[:, 5:] -= 5
    disjoint = sp.lineage_test(fa, fb, m=5)
    assert disjoint.p == 1 and disjoint.k == 0 and "no identity dimensions" in disjoint.reason
    single = sp.lineage_test(fa, fa.clone(), m=1)
    assert single.p == 1 and "one identity dimension" in single.reason
    with pytest.raises(LensBiasError, match="same shape"):
        sp.lineage_test(fa, fb[:50])
    with pytest.raises(LensBiasError, match=r"different widths cannot share an init \(10 vs 9 features\)"):
        sp.lineage_test(fa, fb[:, :9])
    with pytest.raises(LensBiasError, match="m must be"):
        sp.lineage_test(fa, fb, m=11)
    with pytest.raises(LensBiasError, match="null must be AnalyticNull.*null_named"):
        sp.lineage_test(fa, fb, null="seeds")


def test_nan_features_are_refused():
    fa, fb = related_pair(n=300, d=40)
    dirty = fa.clone()
    dirty[[3, 7]] = float("nan")
    with pytest.raises(LensBiasError, match="NaN/inf features"):
        sp.lineage_test(dirty, fb, m=20)  # a bare tensor with NaN is refused (fingerprint() never makes one: collect names the hook)
    with pytest.raises(LensBiasError, match="NaN/inf features"):
        made = sp.fingerprint(lens_bias.random_init("gpt2", seed=0, **SMALL), n=4, seq_len=8, progress=False)
        sp.lineage_test(replace(made, features=dirty), fb, m=20)  # nor a fingerprint whose features were replaced


def test_nulls_are_named_objects_recorded_in_the_result():
    fa, fb = related_pair(n=200, d=32)
    nulls = [sp.AnalyticNull(aggregate=True), sp.EmpiricalNull(n_trials=2, test_type="u-test", seed=3), sp.SeedsNull(fingerprints=[])]
    for null in nulls[:2]:
        res = sp.lineage_test(fa, fb, m=16, null=null)
        assert res.null == null.label and res.null_settings == null.to_dict()
        assert sp.Null.from_dict(res.null_settings) == null and type(null).from_dict(null.to_dict()) == null
    assert sp.null_named("empirical", n_trials=2, test_type="u-test", seed=3) == nulls[1]
    assert sp.SeedsNull(fingerprints=[], label="trained seeds").to_dict() == {
        "kind": "seeds", "label": "trained seeds", "n_null": 20, "seed": 0, "source": "fingerprints", "n_fingerprints": 0
    }
    with pytest.raises(LensBiasError, match="pass it again"):
        sp.Null.from_dict(nulls[2].to_dict())
    assert sp.Null.from_dict(nulls[2].to_dict(), fingerprints=[]) == nulls[2]
    with pytest.raises(LensBiasError, match="not a recorded AnalyticNull"):
        sp.AnalyticNull.from_dict(nulls[1].to_dict())
    with pytest.raises(LensBiasError, match="only 0 null fingerprints"):
        sp.lineage_test(fa, fb, m=16, null=nulls[2])
    with pytest.raises(LensBiasError, match="not both"):
        sp.SeedsNull(factory=lambda seed: None, fingerprints=[])
    with pytest.raises(LensBiasError, match="n_null >= 3"):
        sp.SeedsNull(n_null=2)
    with pytest.raises(LensBiasError, match="test_type"):
        sp.EmpiricalNull(test_type="z-test")
    with pytest.raises(LensBiasError, match="null must be one of"):
        sp.null_named("bootstrap")
    assert sp.NULLS.names() == ["analytic", "empirical", "seeds"] and not hasattr(sp, "test")


# ---- fingerprints ---------------------------------------------------------------------------------------------


SMALL = dict(d_model=64, n_layers=2, n_heads=4, d_vocab=2000, n_ctx=32)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_fingerprint_reads_what_the_model_unembeds_and_the_norm_before_its_gain(tmp_path, arch):
    model = with_final_gain(lens_bias.random_init(arch, seed=3, **SMALL))  # a gain (and bias) away from 1, as trained
    fp = sp.fingerprint(model, n=12, seq_len=16, vocab=1000, progress=False)
    tokens = lens_bias.random_tokens(12, 16, 1000, seed=42)
    logits, cache = model.run_with_cache(tokens)
    assert fp.features.dtype == torch.float32 and fp.features.device.type == "cpu"
    # the published features: the state the model unembeds, so its head maps them to the model's own logits
    assert torch.allclose(fp.features, final_state(model, cache["blocks.1.hook_resid_post"])[:, -1], atol=1e-5)
    assert torch.allclose(lens_bias.extend.ModelAdapter(model).unembed(fp.features), logits[:, -1], atol=1e-4)
    # beside them, the final norm before its gain, which the aligned tests compare
    assert torch.allclose(fp.normalized, cache["ln_final.hook_normalized"][:, -1], atol=1e-6)
    assert not torch.allclose(fp.features, fp.normalized, atol=1e-2)
    assert fp.inputs.vocab == 1000 and fp.spec["seed"] == 3 and fp.model.d_model == 64
    path = tmp_path / "fp.pt"
    fp.save(path)
    back = sp.Fingerprint.load(path)
    assert torch.equal(back.features, fp.features) and torch.equal(back.normalized, fp.normalized) and back.inputs == fp.inputs and back.spec == fp.spec


def test_a_fingerprint_file_of_the_earlier_format_is_refused_in_one_line(tmp_path):
    fp = sp.fingerprint(lens_bias.random_init("llama", seed=3, **SMALL), n=4, seq_len=8, progress=False)
    torch.save({"format": "lens_bias.Fingerprint/1", "features": fp.features, "inputs": asdict(fp.inputs), "model": fp.model.to_dict()}, tmp_path / "old.pt")
    with pytest.raises(LensBiasError, match="earlier lens_bias, whose features were read before the final norm's gain; fingerprint the model again"):
        sp.Fingerprint.load(tmp_path / "old.pt")


def test_a_fingerprint_file_with_untyped_records_loads_typed(tmp_path):
    """Files of this format hold the input record and the model facts as dicts, the empty fields left out where an
    earlier lens_bias wrote them: they load to the same typed fingerprint."""
    fp = sp.fingerprint(lens_bias.random_init("llama", seed=3, **SMALL), n=4, seq_len=8, progress=False)
    record = {key: value for key, value in asdict(fp.inputs).items() if value is not None and key != "renamed"}
    torch.save({**fp.saved(), "inputs": record}, tmp_path / "fp.pt")
    back = sp.Fingerprint.load(tmp_path / "fp.pt")
    assert back.inputs == fp.inputs and back.model == fp.model and torch.equal(back.features, fp.features)
    assert back.inputs.settings().vocab == 2000 and torch.equal(sp.regenerate_inputs(back)[0:4], sp.regenerate_inputs(fp)[0:4])
    torch.save({**fp.saved(), "inputs": {**record, "colour": "red"}}, tmp_path / "odd.pt")
    with pytest.raises(LensBiasError, match="record this lens_bias cannot read.*unknown field"):
        sp.Fingerprint.load(tmp_path / "odd.pt")


def test_embedding_inputs_are_the_init_std_gaussian_for_every_model():
    """One input path: resolve_inputs draws N(0, init std), the same inputs whatever the model's W_E holds."""
    model = lens_bias.random_init("llama", seed=3, **SMALL)
    fp = sp.fingerprint(model, inputs="embeddings", n=6, seq_len=8, progress=False)
    std = model.lens_bias_spec.init_std
    same = sp.fingerprint(model, inputs=lens_bias.RandomEmbeddings(6, 8, 64, mean=0.0, std=std, seed=42), progress=False)
    assert torch.equal(fp.features, same.features)
    assert fp.inputs == replace(same.inputs, seed=42, mean=0.0, std=std)
    with torch.no_grad():
        model.W_E.mul_(3.0)  # as training moves W_E: the fingerprint's inputs stay, analyze's follow it
    assert sp.fingerprint(model, inputs="embeddings", n=6, seq_len=8, progress=False).inputs == fp.inputs
    assert lens_bias.random_embeddings(model, 6, 8).std == pytest.approx(3 * std, rel=0.05)
    with pytest.raises(LensBiasError, match="inputs must be 'tokens', 'embeddings' or a tensor"):
        sp.fingerprint(model, inputs="text", n=6, seq_len=8, progress=False)


def test_fingerprints_of_different_inputs_are_refused():
    model = lens_bias.random_init("gpt2", **SMALL)
    base = sp.fingerprint(model, n=10, seq_len=8, progress=False)
    for other, detail in [(dict(seed=43), "seed"), (dict(vocab=1000), "vocab")]:
        with pytest.raises(LensBiasError, match=f"different inputs.*{detail}"):
            sp.lineage_test(base, sp.fingerprint(model, n=10, seq_len=8, progress=False, **other))
    with pytest.raises(LensBiasError, match="same shape"):
        sp.lineage_test(base, sp.fingerprint(model, n=11, seq_len=8, progress=False))


def test_fingerprint_leaves_the_model_alone_and_copies_for_another_dtype():
    model = lens_bias.random_init("gpt2", **SMALL)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    fp = sp.fingerprint(model, n=6, seq_len=8, dtype=torch.bfloat16, progress=False)
    assert fp.model.dtype == "bfloat16" and next(model.parameters()).dtype == torch.float32
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    full = sp.fingerprint(model, n=6, seq_len=8, progress=False)
    assert torch.allclose(fp.features, full.features, atol=0.1)  # bf16 rounding only


@requires_tl4
def test_bridge_and_the_hf_model_it_wraps_give_the_same_fingerprint():
    bridge = lens_bias.random_init("llama", seed=5, **SMALL)
    hf = bridge.original_model
    fp = sp.fingerprint(bridge, n=8, seq_len=16, progress=False)
    tokens = lens_bias.random_tokens(8, 16, SMALL["d_vocab"], seed=42)
    with torch.no_grad():
        hidden = hf.model(input_ids=tokens).last_hidden_state[:, -1]  # the reference code's path
    assert torch.allclose(fp.features, hidden, atol=1e-5)


def test_compare_uses_the_smaller_vocabulary():
    a = lens_bias.random_init("gpt2", seed=1, **SMALL)
    b = lens_bias.random_init("gpt2", seed=1, **{**SMALL, "d_vocab": 1500})
    res = sp.compare(a, b, n=40, seq_len=8, m=32, progress=False)
    assert res.n == 40 and res.k >= 2
    with pytest.raises(TypeError, match="unexpected keyword.*n_trials"):
        sp.compare(a, b, n=40, seq_len=8, n_trials=3, progress=False)


def test_a_renamed_vocabulary_does_not_evade_compare():
    """Renaming the vocabulary (rows of W_E and W_U permuted alike) keeps the function and changes what random
    token IDs reach: read with the same IDs the copy looks unrelated; compare finds the renaming from the embedding
    rows, gives the copy the same tokens renamed, and calls it related, also after 4-bit quantisation. An unrelated
    seed's table is not a renaming, so its inputs stay as drawn."""
    from lens_bias.models.reparametrise import rename_vocabulary
    from lens_bias.models.transforms import quantize

    small = dict(d_model=64, n_layers=2, n_heads=4, d_vocab=2000, n_ctx=16)
    base = lens_bias.random_init("llama", seed=3, **small)
    renamed = rename_vocabulary(base, seed=1)
    tokens = torch.randint(0, 2000, (2, 8), generator=torch.Generator().manual_seed(0))
    perm = renamed.lens_bias_vocabulary
    with torch.no_grad():
        assert torch.allclose(renamed(perm[tokens])[..., perm], base(tokens), atol=1e-6)  # the same function, renamed
    same_ids = sp.lineage_test(*(sp.fingerprint(m, n=128, seq_len=8, progress=False) for m in (base, renamed)), m=32)
    assert not same_ids.same_lineage and abs(same_ids.tau_bar) < 0.1
    for suspect in (renamed, quantize(renamed, bits=4)):
        result = sp.compare(base, suspect, n=128, seq_len=8, m=32, progress=False)
        assert result.renamed_vocabulary and result.same_lineage and result.tau_bar > 0.9, result
    assert "renamed to the suspect's vocabulary" in str(result)
    unrelated = sp.compare(base, lens_bias.random_init("llama", seed=4, **small), n=128, seq_len=8, m=32, progress=False)
    assert not unrelated.renamed_vocabulary and not unrelated.same_lineage
    assert not sp.compare(base, base, n=64, seq_len=8, m=32, progress=False).renamed_vocabulary  # in place: nothing to rename


def test_compare_calls_two_widths_without_a_partial_map_unrelated():
    a = lens_bias.random_init("llama", seed=1, d_model=64, n_layers=1, n_heads=4, d_vocab=100, n_ctx=8)
    b = lens_bias.random_init("llama", seed=1, d_model=32, n_layers=1, n_heads=4, d_vocab=100, n_ctx=8)
    result = sp.compare(a, b, n=16, seq_len=8, progress=False)
    assert result.p == 1.0 and not result.same_lineage and result.basis_map == "none" and "64 and 32" in result.reason
    with pytest.raises(LensBiasError, match=r"align=None compares models of one width \(d_model 64 vs 32\)"):
        sp.compare(a, b, n=16, seq_len=8, align=None, progress=False)


# ---- null calibration on models -------------------------------------------------------------------------------


def llama_factory():
    """seed -> model: one llama-style model, its weights re-drawn per seed (as random_init would draw them)."""
    model = lens_bias.random_init("llama", d_model=64, n_layers=2, n_heads=4, d_vocab=8000, n_ctx=32)
    return lambda seed: lens_bias.models.redraw(model, seed)


@pytest.mark.slow
def test_seeds_null_controls_false_positives_on_independent_models(record_property):
    # 16 tokens per input: the nulls' behaviour does not hinge on the length, and the 840 fingerprints take half the time
    table = sp.calibrate(llama_factory(), n_pairs=200, n=500, seq_len=16, m=32, progress=False).set_index(["inputs", "null"])
    record_property("calibration", table.to_dict())
    print(f"\nnull calibration, 200 pairs of independent llama-style inits (d 64, 2 layers, N 500, T 16):\n{table}")
    for kind in ("tokens", "embeddings"):
        assert table.loc[(kind, "seeds"), "fpr"] <= 0.02
    # The README's analytic rows. Tokens: p = min(1, 2Φ̄(z)) gives a one-sided test of size α/2, so the FPR over
    # 200 pairs is binomial around α/2 = 0.5%. Embeddings: the shared residual path makes unrelated seeds
    # correlate, and the analytic null calls (nearly) every pair related: 100% documented.
    alpha, pairs = table.loc[("tokens", "analytic"), "alpha"], table.loc[("tokens", "analytic"), "pairs"]
    tolerance = 4 * math.sqrt(alpha / 2 * (1 - alpha / 2) / pairs)
    assert abs(table.loc[("tokens", "analytic"), "fpr"] - alpha / 2) <= tolerance
    assert table.loc[("embeddings", "analytic"), "fpr"] >= 1 - tolerance


@pytest.mark.slow
def test_aligned_tests_keep_their_false_positive_rate(record_property):
    # an alignment is fitted on the first half of the inputs between two unrelated models; if it overfit, the held-out
    # half would look related. 100 pairs at α 0.01: the FPR is binomial around ≤ α (seeds null: a Student-t
    # predictive of size α; analytic: one-sided, size α/2), so 4 sd of Binomial(100, α) above α bounds it.
    table = sp.calibrate(llama_factory(), kinds="tokens", n_pairs=100, n=500, seq_len=16, m=32, aligns=ALIGN_MODES[1:], progress=False)
    record_property("aligned calibration", table.to_dict())
    print(f"\naligned calibration, 100 pairs (d 64, 2 layers, V 8000, N 500 of which 250 fit the map, T 16):\n{table}")
    assert len(table) == 3 * 2 and set(table["align"]) == set(ALIGN_MODES[1:])
    alpha, pairs = 0.01, 100
    assert (table.fpr <= alpha + 4 * math.sqrt(alpha * (1 - alpha) / pairs)).all()
    # the held-out τ̄ of unrelated models stays near 0: sd(τ̄) ≈ √(2(2n+5)/(9n(n−1)))/√k = 0.042/√16 = 0.011 at n 250
    # and k ≈ m²/D = 16 shared dims; the median of 100 pairs lies far inside 4 of them (measured ≤ 0.007)
    assert (table.median_tau_bar.abs() < 4 * 0.011).all()


def test_calibrate_refuses_a_count_of_pairs_whose_fingerprints_cannot_fit(monkeypatch):
    built = []

    def factory(seed):
        built.append(seed)
        return lens_bias.random_init("llama", d_model=16, n_layers=1, n_heads=2, d_vocab=300, n_ctx=8, seed=seed)

    monkeypatch.setattr(memory, "available_bytes", lambda device=None: 64 * 2**20)
    with pytest.raises(LensBiasError, match=r"calibrating \d+ models keeps their fingerprints.*pass n_pairs <= (\d+)") as refusal:
        sp.calibrate(factory, kinds="tokens", n_pairs=10**12, n=100, seq_len=8, nulls=(sp.AnalyticNull(),), progress=False)
    assert built == [0] and "\n" not in str(refusal.value)  # refused after the first model, in one line
    # 100 inputs × d 16 × 4 bytes per model against half of 64 MiB: 5242 models, 2621 pairs
    assert "pass n_pairs <= 2621" in str(refusal.value)


@pytest.mark.slow  # several seconds: out of the inner loop, in the full suite
def test_analytic_null_on_gaussian_features_through_the_whole_pipeline():
    # p = min(1, 2Φ̄(z)) makes the one-sided test conservative: expected FPR α/2 = 0.5%
    g = torch.Generator().manual_seed(0)
    hits = sum(sp.lineage_test(torch.randn(500, 64, generator=g), torch.randn(500, 64, generator=g), m=32).same_lineage for _ in range(1000))
    assert hits / 1000 <= 0.01


# ---- lineage at toy scale -------------------------------------------------------------------------------------


def perturbed(model, scale, seed=123):
    """A descendant: every weight matrix plus Gaussian noise of `scale` × the init std."""
    child = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    std = model.lens_bias_spec.init_std
    with torch.no_grad():
        for p in child.parameters():
            if p.ndim >= 2:
                p.add_(torch.randn(p.shape, generator=g) * scale * std)
    child.lens_bias_spec = model.lens_bias_spec
    return child


@pytest.fixture(scope="module")
def lineage_models():
    spec = dict(d_model=128, n_layers=4, n_heads=4, d_vocab=8000, n_ctx=64)
    a = lens_bias.random_init("llama", seed=11, **spec)
    b = lens_bias.random_init("llama", seed=12, **spec)
    return a, b, perturbed(a, 0.5)


def test_lineage_with_token_inputs_and_the_analytic_null(lineage_models):
    a, b, child = (sp.fingerprint(m, n=1000, seq_len=32, progress=False) for m in lineage_models)
    assert sp.lineage_test(a, b, m=64).p > 0.01
    assert sp.lineage_test(a, child, m=64).p < 1e-10
    assert sp.lineage_test(b, child, m=64).p > 0.01


@pytest.mark.slow
def test_lineage_with_embedding_inputs_and_the_seeds_null(lineage_models):
    a, b, child = (sp.fingerprint(m, inputs="embeddings", n=500, seq_len=32, progress=False) for m in lineage_models)
    with pytest.warns(UserWarning, match=r"null=SeedsNull\(\)"):
        sp.lineage_test(a, b, m=64)  # the analytic null is unsafe here, and says so
    # fresh inits are unrelated to a and b alike, so one set of them serves both as bases
    null = sp.SeedsNull(fingerprints=sp.seed_null_fingerprints(a, n_null=20, avoid=[11, 12], progress=False))
    assert sp.lineage_test(a, b, m=64, null=null).p > 0.01
    related = sp.lineage_test(a, child, m=64, null=null)
    assert related.p < 1e-10 and related.null_details["p_rank"] == pytest.approx(1 / 21)
    assert sp.lineage_test(b, child, m=64, null=null).p > 0.01


def test_report_fingerprint_section_shows_the_identity_dims_the_test_uses():
    model = lens_bias.random_init("llama", seed=4, **SMALL)
    report = lens_bias.analyze(model, n_sequences=40, seq_len=16, sections=["fingerprint"], progress=False)
    fp = sp.fingerprint(model, n=40, seq_len=16, progress=False)
    m = int(0.10 * 64)
    assert report.fingerprint.dims.tolist() == sorted(sp.identity_dims(fp.features, m).tolist())
    table = report.fingerprint.to_pandas()
    assert len(table) == m and (table.softmax_std > 0).all()
    assert table["mean"].max() <= fp.features.mean(0).sort().values[m - 1] + 1e-6
