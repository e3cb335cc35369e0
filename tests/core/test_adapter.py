"""ModelAdapter: configuration, scoped hooks, early stop, batching, and a model left exactly as it was."""

import gc
import weakref

import pytest
import torch

import lens_bias
from lens_bias import LensBiasError, random_tokens
from lens_bias.core.probes import last_position
from lens_bias.extend import ModelAdapter, Probe

from ..conftest import BACKEND, assert_same_state, hook_snapshot, shared_tiny, state_copy, tiny, warmed_snapshot

READOUT = "ln_final.hook_normalized"


def test_info_reads_the_config():
    info = ModelAdapter(tiny("llama", d_model=64, n_layers=3, n_heads=2, d_vocab=50, n_ctx=20)).info
    assert (info.n_layers, info.d_model, info.n_heads, info.d_head, info.d_vocab, info.n_ctx) == (3, 64, 2, 32, 50, 20)
    assert info.family == BACKEND and info.device == "cpu" and info.dtype == "float32"
    assert lens_bias.extend.ModelInfo.from_dict(info.to_dict()) == info


def test_probes_keep_only_what_they_reduce_to_and_match_the_cache():
    model = tiny("gpt2")
    tokens = random_tokens(5, 12, 97, seed=1)
    probes = [last_position(READOUT), Probe("blocks.1.hook_resid_post", "pos_mean", lambda x: x.mean(1))]
    out = ModelAdapter(model).collect(tokens, probes, progress=False)
    _, cache = model.run_with_cache(tokens)
    assert out[f"{READOUT}:last"].shape == (5, 64)
    assert torch.allclose(out[f"{READOUT}:last"], cache[READOUT][:, -1], atol=1e-6)
    assert torch.allclose(out["blocks.1.hook_resid_post:pos_mean"], cache["blocks.1.hook_resid_post"].mean(1), atol=1e-6)


def test_results_do_not_depend_on_batch_size():
    model = tiny("gpt2")
    tokens = random_tokens(11, 8, 97, seed=2)
    adapter = ModelAdapter(model)
    a = adapter.collect(tokens, [last_position(READOUT)], batch_size=3, progress=False)
    b = adapter.collect(tokens, [last_position(READOUT)], batch_size=11, progress=False)
    assert torch.allclose(a[f"{READOUT}:last"], b[f"{READOUT}:last"], atol=1e-5)


def test_summed_maxed_and_first_batch_probes_equal_the_cache_over_every_batch():
    model = tiny("gpt2")
    tokens = random_tokens(10, 8, 97, seed=3)
    hook = "blocks.1.hook_resid_post"
    probes = [
        Probe(hook, "sum", lambda x: x.sum(dim=(0, 1)), combine="sum"),
        Probe(hook, "max", lambda x: x.abs().amax(dim=(0, 1)), combine="max"),
        Probe(hook, "first", lambda x: x[:, 0], combine="first"),
        Probe(hook, "rows", lambda x: x[:, 0]),
    ]
    out = ModelAdapter(model).collect(tokens, probes, batch_size=4, progress=False)  # batches of 4, 4 and 2
    h = model.run_with_cache(tokens)[1][hook].double()
    assert out[f"{hook}:sum"].dtype == torch.float64 and torch.allclose(out[f"{hook}:sum"], h.sum(dim=(0, 1)), rtol=1e-5, atol=1e-5)
    assert torch.allclose(out[f"{hook}:max"].double(), h.abs().amax(dim=(0, 1)), rtol=1e-6)
    assert torch.allclose(out[f"{hook}:first"].double(), h[:4, 0], atol=1e-5)
    assert torch.allclose(out[f"{hook}:rows"].double(), h[:, 0], atol=1e-5)


def test_a_probe_that_breaks_its_combine_is_named():
    adapter = ModelAdapter(tiny("gpt2"))
    tokens = random_tokens(6, 8, 97, seed=3)
    hook = "blocks.0.hook_resid_post"
    with pytest.raises(LensBiasError, match="combine must be one of"):
        Probe(hook, "x", lambda x: x, combine="mean")
    def total(x):  # one function, two combines: two reductions under one key
        return x.sum(0)

    with pytest.raises(LensBiasError, match="share the key"):
        adapter.collect(tokens, [Probe(hook, "s", total), Probe(hook, "s", total, combine="sum")], progress=False)
    with pytest.raises(LensBiasError, match="returned 1 rows for a batch of 4 sequences"):
        adapter.collect(tokens, [Probe(hook, "s", lambda x: x.sum(0, keepdim=True))], batch_size=4, progress=False)
    with pytest.raises(LensBiasError, match="returns one shape for every batch"):
        adapter.collect(tokens, [Probe(hook, "s", lambda x: x[:, 0].flatten(), combine="sum")], batch_size=4, progress=False)


def test_running_totals_that_cannot_fit_are_refused_whatever_the_count(monkeypatch):
    from lens_bias.core import memory

    adapter = ModelAdapter(tiny("gpt2"))
    monkeypatch.setattr(memory, "available_bytes", lambda device=None: 400 * 2**10)  # 200 KiB usable: a sequence's pass fits
    # the second moment of the whole [8 × 64] state: 512 × 512 float64 = 2 MiB, however few sequences
    gram = Probe("blocks.0.hook_resid_post", "gram", lambda x: x.flatten(1).T @ x.flatten(1), combine="sum")
    with pytest.raises(LensBiasError, match="running totals alone need 2.0 MiB .* whatever the number of sequences"):
        adapter.collect(random_tokens(2, 8, 97), [gram], progress=False)


def test_forward_stops_after_the_last_probe():
    model = tiny("gpt2")
    reached = []
    final_norm = (READOUT, lambda x, hook: reached.append(True))
    ModelAdapter(model).collect(random_tokens(2, 4, 97), [last_position("blocks.0.hook_resid_post")], hooks=[final_norm], progress=False)
    assert reached == []  # nothing after block 0 was read, so the final norm (and unembedding) never ran


def test_missing_and_silent_hooks_are_named():
    tokens = random_tokens(2, 4, 97)
    with pytest.raises(LensBiasError, match="blocks.9.hook_resid_post"):
        ModelAdapter(tiny("gpt2")).collect(tokens, [last_position("blocks.9.hook_resid_post")], progress=False)
    # Hook points that exist but are off the computation path: the HF-built llama bridge lists hook_pos_embed
    # (rotary has no position table); TL 3 lists attn.hook_result, which fires only with use_attn_result.
    model, silent = (tiny("llama"), "hook_pos_embed") if BACKEND == "bridge" else (tiny("gpt2"), "blocks.0.attn.hook_result")
    adapter = ModelAdapter(model)
    with pytest.raises(LensBiasError, match=f"{silent}.*never fired"):
        adapter.collect(tokens, [last_position(silent)], progress=False)
    with pytest.raises(LensBiasError, match=f"{silent}.*never fired"):
        adapter.collect(tokens, [last_position(READOUT)], hooks=[(silent, lambda x, hook: x)], progress=False)


def test_an_edit_after_an_early_stop_is_not_called_silent():
    """An intervention downstream of the last probe does not fire (the pass stopped), and that is fine."""
    model = tiny("gpt2")
    tokens = random_tokens(2, 4, 97)
    out = ModelAdapter(model).collect(tokens, [last_position("blocks.0.hook_resid_post")], hooks=[("blocks.1.hook_mlp_out", lambda x, hook: x * 0)], progress=False)
    _, cache = model.run_with_cache(tokens, names_filter="blocks.0.hook_resid_post")
    assert torch.equal(out["blocks.0.hook_resid_post:last"], cache["blocks.0.hook_resid_post"][:, -1])


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_model_is_left_unchanged_after_an_exception_mid_run(arch, error):
    model = tiny(arch)
    model.train()
    before_hooks, before_state = warmed_snapshot(model), state_copy(model)

    def explode(x, hook):
        raise error

    with pytest.raises(type(error)):
        ModelAdapter(model).collect(
            random_tokens(6, 8, 97), [last_position(READOUT)], hooks=[("blocks.1.hook_mlp_out", explode)], batch_size=2, progress=False
        )
    assert hook_snapshot(model) == before_hooks
    assert_same_state(model, before_state)
    assert model.training  # mode restored


def test_not_a_transformerlens_model():
    with pytest.raises(TypeError, match="TransformerLens model"):
        ModelAdapter(torch.nn.Linear(3, 3))
    with pytest.raises(TypeError, match="TransformerLens model"):
        lens_bias.analyze("gpt2")


def test_interventions_are_taken_as_objects_and_a_probe_key_names_one_reduction():
    from lens_bias.hooks import SelfOnlyAttention, edit_hooks, intervene

    model = tiny("gpt2", act_fn="relu")
    tokens = random_tokens(5, 8, 97, seed=3)
    adapter = ModelAdapter(model)
    iv = SelfOnlyAttention(layers=[0])
    key = f"{READOUT}:last"
    by_object = adapter.collect(tokens, [last_position(READOUT)], hooks=edit_hooks(model, [iv]), progress=False)[key]
    by_hooks = adapter.collect(tokens, [last_position(READOUT)], hooks=iv.fwd_hooks(model), progress=False)[key]
    plain = adapter.collect(tokens, [last_position(READOUT)], progress=False)[key]
    with torch.no_grad(), intervene(model, iv):
        _, cache = model.run_with_cache(tokens)
    assert torch.allclose(by_object, cache[READOUT][:, -1], atol=1e-6) and torch.equal(by_object, by_hooks)
    assert not torch.allclose(by_object, plain, atol=1e-4)
    twice = adapter.collect(tokens, [last_position(READOUT), last_position(READOUT)], progress=False)
    assert list(twice) == [key]  # the same reduction, asked twice, computed once
    clash = [last_position("blocks.0.hook_resid_post"), Probe("blocks.0.hook_resid_post", "last", lambda x: x[:, 0])]
    with pytest.raises(LensBiasError, match="share the key 'blocks.0.hook_resid_post:last'"):
        adapter.collect(tokens, clash, progress=False)


def test_kept_values_do_not_hold_their_batch_activation_alive():
    # a probe that returns a view (the last position of [batch, pos, d]) must not keep the whole batch's activation
    # alive through the batches that follow: memory would grow with N, not with the kept [N, d]
    alive_before: list[int] = []
    storages: list[weakref.ref] = []

    def last(x: torch.Tensor) -> torch.Tensor:
        gc.collect()
        alive_before.append(sum(ref() is not None for ref in storages))
        storages.append(weakref.ref(x.untyped_storage()))
        return x[:, -1]

    model = shared_tiny("gpt2")
    kept = lens_bias.extend.ModelAdapter(model).collect(lens_bias.random_tokens(12, 8, 97), [Probe("blocks.0.hook_resid_post", "last_view", last)],
                                                 batch_size=4, progress=False)
    assert alive_before == [0, 0, 0] and kept["blocks.0.hook_resid_post:last_view"].shape == (12, 64)


def _module_state(model) -> dict:
    """Every module's plain attributes (flags, counters, names; tensors by shape), hooks left to hook_snapshot."""
    state = {}
    for name, module in model.named_modules():
        for key, value in vars(module).items():
            if key in ("_parameters", "_buffers", "_modules") or "hooks" in key:
                continue
            if key == "_stop_at_layer_idx" and value is None:  # TL's stop leaves it None; TL reads an absent one as None
                continue
            plain = value is None or isinstance(value, (bool, int, float, str))
            state[name, key] = value if plain else ("tensor", tuple(value.shape)) if isinstance(value, torch.Tensor) else type(value).__name__
    return state


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_an_early_stop_leaves_the_model_as_transformer_lenss_own_stop_does(arch):
    """collect stops the pass once its last probe fired; TransformerLens stops with ``stop_at_layer``. After either,
    the two copies hold the same flags, counters and hooks, and the next full pass gives the same logits."""
    ours, theirs = tiny(arch), tiny(arch)
    tokens = random_tokens(2, 6, 97)
    with torch.no_grad():
        ours(tokens), theirs(tokens)  # warm-up: a bridge wires its own capture hooks on its first call
        ModelAdapter(ours).collect(tokens, [last_position("blocks.0.hook_resid_post")], progress=False)
        theirs(tokens, stop_at_layer=1)
        assert _module_state(ours) == _module_state(theirs) and hook_snapshot(ours) == hook_snapshot(theirs)
        assert torch.equal(ours(tokens), theirs(tokens))


def test_the_hook_names_are_read_once_per_adapter(monkeypatch):
    """A TL 4 bridge builds ``hook_dict`` anew at every read (TL 3 keeps a dict): the adapter reads it once."""
    model = tiny("gpt2")
    kind = type(model)
    built = getattr(kind, "hook_dict", None)
    if not isinstance(built, property):
        pytest.skip("this TransformerLens keeps hook_dict as a dict")
    adapter = ModelAdapter(model)
    reads = []
    monkeypatch.setattr(kind, "hook_dict", property(lambda self: reads.append(1) or built.fget(self)))
    adapter.require(["hook_embed", "blocks.0.hook_resid_post", "blocks.1.hook_resid_post"], "a test")
    assert adapter.has_hook("ln_final.hook_normalized") and not adapter.has_hook("blocks.9.hook_resid_post") and adapter.readout_hook
    assert adapter.hook_names == set(built.fget(model)) and len(reads) == 1
