"""Sink interventions and analyses: each edit against a direct computation, the metric against a hand count,
and the 1/√t law of positional variance at init."""

import pytest
import torch

import lens_bias
from lens_bias import LensBiasError, intervene
from lens_bias.analyses.base import run_analyses
from lens_bias.analyses.positional_variance import PositionalVariance, fit_exponent, profile_spread
from lens_bias.analyses.sinks import THRESHOLDS, Sinks, key_importance, sink_rate
from lens_bias.analyses.super_neurons import SuperNeurons, dominance_ratio
from lens_bias.core.corpora import Corpus
from lens_bias.core.inputs import InputSpec
from lens_bias.hooks import AmplifyVariance, HeadwiseRMSNorm, Intervention, MaskToSelf, ScaleNorm, UniformAttention
from lens_bias.training.data import TokenData
from lens_bias.training.trainer import train

from ..conftest import assert_same_state, hook_snapshot, state_copy, tiny, warmed_snapshot

TOKENS = lens_bias.random_tokens(6, 12, 97, seed=5)
ARCHS = ["gpt2", "llama"]


def cached(model, *interventions):
    with torch.no_grad(), intervene(model, *interventions):
        _, cache = model.run_with_cache(TOKENS)
    return cache


@pytest.mark.parametrize("arch", ARCHS)
def test_mask_to_self_makes_row_k_one_hot_and_z_the_own_value(arch):
    model = tiny(arch)
    base, edited = cached(model), cached(model, MaskToSelf(position=5, layers=[0]))
    pattern = edited["blocks.0.attn.hook_pattern"]
    assert torch.equal(pattern[:, :, 5], torch.eye(12)[5].expand_as(pattern[:, :, 5]))
    others = [t for t in range(12) if t != 5]
    assert torch.allclose(pattern[:, :, others], base["blocks.0.attn.hook_pattern"][:, :, others])
    # position 5 now outputs its own value vector: z_5 = v_5 (the mix used the edited pattern)
    assert torch.allclose(edited["blocks.0.attn.hook_z"][:, 5], edited["blocks.0.attn.hook_v"][:, 5], atol=1e-6)
    assert not torch.allclose(base["blocks.0.attn.hook_z"][:, 5], base["blocks.0.attn.hook_v"][:, 5], atol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_amplify_variance_is_mean_centred_and_reaches_the_residual(arch):
    model = tiny(arch)
    base, edited = cached(model), cached(model, AmplifyVariance(position=3, factor=5.0, layers=[0]))
    o = base["blocks.0.hook_attn_out"]
    mu = o[:, 3].mean(dim=0, keepdim=True)
    out = edited["blocks.0.hook_attn_out"]
    assert torch.allclose(out[:, 3], 5.0 * (o[:, 3] - mu) + mu, atol=1e-6)
    assert torch.allclose(out[:, [0, 1, 2, 4]], o[:, [0, 1, 2, 4]])
    assert torch.allclose(out[:, 3].std(dim=0), 5.0 * o[:, 3].std(dim=0), rtol=1e-4)
    assert torch.allclose(out[:, 3].mean(dim=0), o[:, 3].mean(dim=0), atol=1e-6)
    # the edited output is what the residual stream sums
    resid = edited["blocks.0.hook_resid_pre"] + out + edited["blocks.0.hook_mlp_out"]
    assert torch.allclose(edited["blocks.0.hook_resid_post"], resid, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_scale_norm_scales_and_keeps_relative_spread(arch):
    model = tiny(arch)
    base, edited = cached(model), cached(model, ScaleNorm(position=3, factor=5.0, layers=[1]))
    o, out = base["blocks.1.hook_attn_out"], edited["blocks.1.hook_attn_out"]
    assert torch.allclose(out[:, 3], 5.0 * o[:, 3], atol=1e-6)
    assert torch.allclose(out[:, :3], o[:, :3])
    assert torch.allclose(edited["blocks.0.hook_attn_out"], base["blocks.0.hook_attn_out"])
    resid = edited["blocks.1.hook_resid_pre"] + out + edited["blocks.1.hook_mlp_out"]
    assert torch.allclose(edited["blocks.1.hook_resid_post"], resid, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_headwise_rmsnorm_normalises_each_head_before_w_o(arch):
    model = tiny(arch)
    norm = HeadwiseRMSNorm(gain=True).bind(model)
    with torch.no_grad():
        norm.parameters(model)[0][0, 1].fill_(2.0)  # a non-trivial gain on layer 0, head 1
        base, edited = cached(model), cached(model, norm)
    z0 = base["blocks.0.attn.hook_z"]
    expected = z0 * torch.rsqrt(z0.pow(2).mean(dim=-1, keepdim=True) + 1e-6)
    expected[:, :, 1] *= 2.0
    z = edited["blocks.0.attn.hook_z"]
    assert torch.allclose(z, expected, atol=1e-5)
    ms = z0.pow(2).mean(dim=-1)
    rms = z.pow(2).mean(dim=-1).sqrt()
    assert torch.allclose(rms[:, :, [0, 2, 3]], (ms / (ms + 1e-6)).sqrt()[:, :, [0, 2, 3]], atol=1e-5)  # 1 but for eps
    # the normalised z is what the output projection reads: attn_out = z·W_O + b_O
    attn = model.blocks[0].attn
    b_o = getattr(attn, "b_O", None)
    direct = torch.einsum("bphd,hdm->bpm", z, attn.W_O) + (0 if b_o is None else b_o)
    assert torch.allclose(edited["blocks.0.hook_attn_out"], direct, atol=1e-5)


def test_headwise_rmsnorm_without_gain_and_validation():
    model = tiny("gpt2")
    assert HeadwiseRMSNorm(gain=False).parameters(model) == []
    z = cached(model, HeadwiseRMSNorm(gain=False))["blocks.1.attn.hook_z"]
    assert torch.allclose(z.pow(2).mean(dim=-1), torch.ones(z.shape[:-1]), atol=2e-2)  # 1 but for eps = 1e-6
    with pytest.raises(LensBiasError, match="eps"):
        HeadwiseRMSNorm(eps=0)
    unbound = HeadwiseRMSNorm()
    for use in (unbound.parameters, unbound.fwd_hooks):
        with pytest.raises(LensBiasError, match=r"no gains yet.*bind\(model\)"):
            use(model)
    assert unbound.weight is None, "a failed use must not bind it"
    bound = unbound.bind(model)
    assert bound is not unbound and bound.bind(model) is bound  # binding is explicit and idempotent
    assert torch.equal(bound.parameters(model)[0], torch.ones(2, 4, 16))
    other = tiny("gpt2", n_heads=2)
    for use in (bound.parameters, bound.fwd_hooks, bound.bind):
        with pytest.raises(LensBiasError, match="make a new HeadwiseRMSNorm"):
            use(other)


def test_headwise_rmsnorm_gains_serialise_and_train(tmp_path):
    words = "the model attends to the first token because its value is not averaged over a prefix".split()
    docs = tuple(" ".join(words[i % 7 :] + words[: i % 7]) * 3 for i in range(40))
    data = TokenData.build(Corpus("sinks-test", docs, {}), vocab_size=300, seq_len=16, cache=tmp_path)
    model = lens_bias.random_init("gpt2", d_model=64, n_layers=2, n_heads=4, d_vocab=data.vocab_size, n_ctx=data.seq_len, seed=0)
    norm = HeadwiseRMSNorm().bind(model)
    before = state_copy(model)
    train(model, data, steps=3, batch_size=4, lr=1e-2, interventions=[norm], progress=False)
    gains = norm.parameters(model)[0]
    assert not torch.allclose(gains, torch.ones_like(gains)), "the gains did not train"
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    restored = Intervention.from_dict(norm.to_dict())
    assert restored == norm and torch.equal(restored.weight, gains.detach())


@pytest.mark.parametrize("iv", [MaskToSelf(position=2), AmplifyVariance(position=2, factor=3.0), ScaleNorm(position=2), HeadwiseRMSNorm(gain=False)])
def test_sink_interventions_leave_no_trace(iv):
    model = tiny("llama")
    hooks, weights = warmed_snapshot(model), state_copy(model)
    with torch.no_grad(), intervene(model, iv):
        model(TOKENS)
    with pytest.raises(KeyboardInterrupt):
        with intervene(model, iv):
            raise KeyboardInterrupt
    assert hook_snapshot(model) == hooks
    assert_same_state(model, weights)
    assert Intervention.from_dict(iv.to_dict()) == iv


def test_sink_interventions_reject_bad_input():
    with pytest.raises(LensBiasError, match="non-negative int"):
        MaskToSelf(position=-1)
    with pytest.raises(LensBiasError, match="use position < 12"):
        cached(tiny("gpt2"), MaskToSelf(position=12))
    with pytest.raises(LensBiasError, match="at least 2 sequences"):
        with torch.no_grad(), intervene(tiny("gpt2"), AmplifyVariance(position=1)) as m:
            m(TOKENS[:1])


def test_sink_rate_equals_a_hand_count():
    # Two sequences, one layer, two heads, T = 4. α_k = column sum over t >= k / (T - k).
    sink = torch.tensor([[1, 0, 0, 0], [0.9, 0.1, 0, 0], [0.7, 0.1, 0.2, 0], [0.6, 0.2, 0.1, 0.1]])
    uniform = torch.tensor([[1, 0, 0, 0], [0.5, 0.5, 0, 0], [1 / 3, 1 / 3, 1 / 3, 0], [0.25, 0.25, 0.25, 0.25]])
    patterns = torch.stack([torch.stack([sink, uniform]), torch.stack([uniform, uniform])])[:, None]  # [2, 1, 2, 4, 4]
    alpha_sink = torch.tensor([3.2 / 4, 0.4 / 3, 0.3 / 2, 0.1])
    alpha_uniform = torch.tensor([(1 + 1 / 2 + 1 / 3 + 1 / 4) / 4, (1 / 2 + 1 / 3 + 1 / 4) / 3, (1 / 3 + 1 / 4) / 2, 1 / 4])
    assert torch.allclose(key_importance(sink), alpha_sink)
    assert torch.allclose(key_importance(uniform), alpha_uniform)
    # ε = 0.3: key 0 sinks in all 4 (sequence, head) triples (0.8 and 0.52 > 0.3), key 1 in the three uniform
    # ones (0.361), key 2 in none (0.292, 0.15), key 3 in none.
    assert torch.allclose(sink_rate(patterns, eps=0.3), torch.tensor([100.0, 75.0, 0.0, 0.0]))
    assert torch.allclose(sink_rate(patterns, eps=0.6), torch.tensor([25.0, 0.0, 0.0, 0.0]))  # strict >
    with pytest.raises(LensBiasError, match="N, L, H, T, T"):
        sink_rate(patterns[0])


@pytest.mark.parametrize("arch", ARCHS)
def test_sinks_analysis_equals_the_metric_on_cached_patterns(arch):
    model = tiny(arch)
    adapter = lens_bias.extend.ModelAdapter(model)
    spec = InputSpec(kind="tokens", n=6, seq_len=12, seed=5)
    result = run_analyses(adapter, TOKENS, spec, [Sinks(eps=0.1)], batch_size=4, progress=False)["sinks"]
    cache = cached(model, MaskToSelf(position=4))  # any edit: the probe must see what the model used
    edits = MaskToSelf(position=4).fwd_hooks(model)
    edited = run_analyses(adapter, TOKENS, spec, [Sinks(eps=0.1)], batch_size=4, progress=False, interventions=edits)["sinks"]
    rows = run_analyses(adapter, TOKENS, spec, [Sinks(eps=0.1, per_sequence=True)], batch_size=4, progress=False, interventions=edits)["sinks"]
    patterns = torch.stack([cache[f"blocks.{layer}.attn.hook_pattern"] for layer in range(2)], dim=1)
    alpha = key_importance(patterns)  # [n, layer, head, key]
    # summed over batches of 4 and 2 in the pass: the mean α and the rates of the α of every sequence
    assert edited.alpha is None and torch.allclose(edited.alpha_mean, alpha.mean(dim=0), atol=1e-6)
    assert torch.allclose(edited.rate(), sink_rate(patterns, eps=0.1)) and torch.allclose(edited.rate_by_head(4), (alpha[..., 4] > 0.1).float().mean(dim=0) * 100)
    for eps in THRESHOLDS:  # counted in the pass at every threshold of the grid
        assert torch.allclose(edited.rate(eps), sink_rate(patterns, eps=eps), atol=1e-4)
    with pytest.raises(LensBiasError, match=r"Sinks\(eps=0.33\) or Sinks\(per_sequence=True\)"):
        edited.rate(0.33)
    assert torch.allclose(rows.alpha, alpha, atol=1e-6) and torch.allclose(rows.rate(0.33), sink_rate(patterns, eps=0.33))
    assert torch.equal(rows.above, edited.above) and torch.equal(rows.alpha_mean, edited.alpha_mean)
    assert edited.share(4).mean() > result.share(4).mean()
    resid = cache["blocks.1.hook_resid_post"].norm(dim=-1)
    assert torch.allclose(edited.norm_ratio[1], (resid[:, 0] / resid[:, 1:].median(dim=1).values).mean(), atol=1e-5)


def _positional(model, *interventions, n=512, seq_len=64, seed=0):
    adapter = lens_bias.extend.ModelAdapter(model)
    tokens = lens_bias.random_tokens(n, seq_len, adapter.info.d_vocab, seed=seed)
    spec = InputSpec(kind="tokens", n=n, seq_len=seq_len, seed=seed)
    hooks = [h for iv in interventions for h in iv.fwd_hooks(model)]
    return run_analyses(adapter, tokens, spec, [PositionalVariance()], progress=False, interventions=hooks)["positional_variance"]


@pytest.fixture(scope="module")
def law_models():
    # d 128, HF init std 0.02, no position table (a learned one changes each position's norm, hence its spread)
    return {seed: lens_bias.random_init("llama", d_model=128, n_layers=2, n_heads=4, d_vocab=8000, n_ctx=64, seed=seed) for seed in (0, 1)}


@pytest.mark.parametrize("uniform", [False, True])
def test_inverse_sqrt_law_at_init_for_two_seeds(law_models, uniform):
    # N = 512 sequences pooled over d_model = 128 dims: the relative sd of each std_t is ≈ 1/√(2·512·128) < 0.3%,
    # so a 5% tolerance on r_t·√(t+1) leaves > 10 sd for the max over 64 positions.
    edits = [UniformAttention()] if uniform else []
    results = [_positional(model, *edits) for model in law_models.values()]
    for result in results:
        assert result.law_deviation(63)[0] < 0.05
        assert abs(result.alpha_out()[0] - 0.5) < 0.02
        assert (result.alpha_z()[0] - 0.5).abs().max() < 0.03
    assert profile_spread(*[_only_layer0(r) for r in results]) < 0.05


def _only_layer0(result):
    return type(result)(std_z=result.std_z[:1], std_out=result.std_out[:1], n=result.n)


def test_mask_to_self_keeps_the_first_token_variance_and_rmsnorm_flattens(law_models):
    model = law_models[0]
    masked = _positional(model, MaskToSelf(position=10, layers=[0]))
    r = masked.r_out[0]
    assert abs(r[10].item() - 1) < 0.05, "position 10 should keep the first token's spread"
    assert abs(r[9].item() * 10**0.5 - 1) < 0.05 and abs(r[11].item() * 12**0.5 - 1) < 0.05
    flat = _positional(model, HeadwiseRMSNorm(gain=False))
    assert (flat.r_z[0] - 1).abs().max() < 0.05
    assert abs(flat.alpha_out()[0]) < 0.02


def test_fit_exponent_recovers_a_power_law():
    t = torch.arange(1, 101, dtype=torch.float32)
    assert torch.allclose(fit_exponent(torch.stack([t**-0.5, 3 * t**-0.25, t**0])), torch.tensor([0.5, 0.25, 0.0]), atol=1e-5)


def test_super_neurons_find_a_planted_unit():
    model = tiny("gpt2", act_fn="relu")
    # plant a unit that fires only on token 7 at position 0 ...
    tokens = lens_bias.random_tokens(32, 12, 97, seed=3)
    tokens[:, 0] = 7
    adapter = lens_bias.extend.ModelAdapter(model)
    spec = InputSpec(kind="tokens", n=32, seq_len=12, seed=3)

    def plant(x, hook):  # mlp.hook_post [batch, pos, d_mlp]
        x = x.clone()
        x[:, 0, 17] = 50.0
        return x

    result = run_analyses(adapter, tokens, spec, [SuperNeurons()], progress=False, interventions=[("blocks.1.mlp.hook_post", plant)])["super_neurons"]
    units = result.units(top=1)
    w = model.blocks[1].mlp.W_out[17].detach()
    resid: list[torch.Tensor] = []  # mean |h| at position 0 per block output, computed directly
    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.mlp.hook_post", plant)] + [
            (f"blocks.{layer}.hook_resid_post", lambda x, hook: resid.append(x[:, 0].abs().mean(0))) for layer in range(2)])
    assert result.massive_dim == int(torch.stack(resid).max(dim=0).values.argmax())
    assert result.massive_dim in w.abs().topk(2).indices.tolist()  # the planted unit's write makes it (its top two weights lie within 5%)
    assert (units.layer[0], units.unit[0]) == (1, 17) and units.top_dims[0][0] == int(w.abs().argmax())
    assert units.writes[0] == pytest.approx(50.0 * w[result.massive_dim].item(), rel=1e-5)  # mean activation × W_out[17, j*]
    assert result.selectivity[1, 17] > 100 and result.headline()["top_unit_layer"] == 1
    assert result.mlp_in_max[1] == pytest.approx(50.0)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    direct = cache["blocks.0.mlp.hook_post"][:, 0].mean(0) * model.blocks[0].mlp.W_out[:, result.massive_dim].detach()
    assert torch.allclose(result.writes[0], direct, atol=1e-6)  # layer 0, unplanted: the write is mean a × W_out[:, j*]
    assert torch.allclose(dominance_ratio(torch.tensor([[1.0, -1.0], [3.0, 1.0]])), torch.tensor([1.0, 1.5]))
    with pytest.raises(LensBiasError, match="pick position < 12"):
        run_analyses(adapter, tokens, spec, [SuperNeurons(position=12)], progress=False)


def test_later_sinks_leave_out_the_last_token_attending_to_itself():
    """The last key is seen by one query, its own: when every query attends to itself, α_{T−1} = 1 and Sink_{T−1} is
    100%, which is not a sink. The headline's largest later Sink_k covers 0 < k < T − 1."""
    from lens_bias.hooks import SelfOnlyAttention

    model = lens_bias.random_init("llama", d_model=32, n_layers=2, n_heads=4, d_vocab=100, n_ctx=16, seed=0)
    result = lens_bias.analyze(model, n_sequences=8, seq_len=8, sections=["sinks"], interventions=[SelfOnlyAttention()], progress=False).sinks
    rate, headline = result.rate(), result.headline()
    assert rate[-1].item() == 100.0  # α_7 = 1: the last token attending to itself
    assert headline["max_sink_rate_later"] == rate[1:-1].max().item() and headline["argmax_later"] < 7
    assert "(0 < k < T−1)" in result.summary()
