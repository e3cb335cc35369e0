"""Settings as objects: FingerprintSettings, LineageSettings and TrainSettings hold the defaults, keywords override
them, the command line reads its defaults from them, and a keyword no settings class has is refused."""

import dataclasses

import pytest
import torch

import lens_bias
from lens_bias import seedprint as sp
from lens_bias.cli import build_parser
from lens_bias.core.errors import WrongType
from lens_bias.training import TokenData, TrainSettings, train

SMALL = dict(d_model=32, n_layers=1, n_heads=4, d_vocab=300, n_ctx=8)


def test_settings_objects_and_keywords_give_the_same_test():
    a, b = (lens_bias.random_init("llama", seed=s, **SMALL) for s in (1, 2))
    base = lens_bias.random_init("llama", seed=1, **SMALL)
    by_object = sp.compare(base, a, sp.FingerprintSettings(n=64, seq_len=8), sp.LineageSettings(m=16), progress=False)
    by_keyword = sp.compare(base, a, n=64, seq_len=8, m=16, progress=False)
    assert by_object.p == by_keyword.p and by_object.tau_bar == by_keyword.tau_bar and by_object.same_lineage  # a model is its own descendant
    assert by_object.basis_map == by_keyword.basis_map == "identity"  # LineageSettings() is compare's default test (auto): an object keeps it
    unrelated = sp.compare(base, b, sp.FingerprintSettings(n=64, seq_len=8), m=16, progress=False)  # an object and an override together
    assert unrelated.m == 16 and unrelated.tau_bar < by_object.tau_bar
    fp = sp.fingerprint(a, sp.FingerprintSettings(n=64, seq_len=8), progress=False)
    assert torch.equal(fp.features, sp.fingerprint(a, n=64, seq_len=8, progress=False).features)
    published = sp.lineage_test(fp, fp, m=16)  # with no settings: the published test, which features allow
    assert published.align is None and sp.lineage_test(fp, fp, sp.PUBLISHED, m=16).p == published.p
    with pytest.warns(UserWarning, match=r"reads features only.*running the published test \(align=None\)"):
        defaulted = sp.lineage_test(fp, fp, sp.LineageSettings(m=16))  # the settings' "auto" needs the models: said, not dropped silently
    assert defaulted.p == published.p and defaulted.align is None
    with pytest.raises(lens_bias.LensBiasError, match="align='auto' reads the two models' tokenizers and weights"):
        sp.lineage_test(fp, fp, m=16, align="auto")  # asked for by name: refused


def test_a_keyword_no_settings_class_has_is_refused_with_their_fields():
    model = lens_bias.random_init("llama", seed=1, **SMALL)
    with pytest.raises(WrongType, match=r"unexpected keyword\(s\) \['ratio'\].*LineageSettings \(test=\): \['m', 'ratio_k'"):
        sp.compare(model, model, n=8, ratio=0.5)
    with pytest.raises(WrongType, match="takes a FingerprintSettings"):
        sp.fingerprint(model, sp.LineageSettings())
    with pytest.raises(lens_bias.LensBiasError, match="kinds="):
        sp.calibrate(lambda s: model, inputs="tokens", n_pairs=1)


def test_settings_round_trip_and_are_frozen():
    test = sp.LineageSettings(m=8, null=sp.SeedsNull(n_null=5), align="orthogonal")
    assert sp.LineageSettings.from_dict(test.to_dict()) == test
    prints = sp.FingerprintSettings(n=8, dtype=torch.bfloat16, device="cpu")
    assert sp.FingerprintSettings.from_dict(prints.to_dict()) == prints
    assert TrainSettings.from_dict(TrainSettings(steps=3, lr=1e-2).to_dict()) == TrainSettings(steps=3, lr=1e-2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        test.m = 4  # type: ignore[misc]


def test_the_command_line_reads_its_defaults_from_the_settings():
    parser = build_parser()
    lineage = parser.parse_args(["lineage", "x", "y"])
    assert (lineage.n, lineage.seq_len, lineage.input_seed) == (sp.families.PAIRWISE.n, sp.families.PAIRWISE.seq_len, sp.families.PAIRWISE.seed)
    test = parser.parse_args(["seedprint", "a.pt", "b.pt"])
    defaults = sp.LineageSettings()
    assert (test.ratio_k, test.mode, test.temperature, test.alpha) == (defaults.ratio_k, defaults.mode, defaults.temperature, defaults.alpha)
    assert parser.parse_args(["fingerprint", "m", "-o", "f.pt"]).n == sp.FingerprintSettings().n
    trained = parser.parse_args(["train", "m", "--out", "o"])
    assert (trained.steps, trained.lr, trained.weight_decay, trained.data_seed) == (TrainSettings.steps, TrainSettings.lr, TrainSettings.weight_decay, TrainSettings.data_seed)


def test_train_takes_its_settings_as_an_object_or_as_keywords():
    from lens_bias.core.corpora import prose

    data = TokenData.build(prose(), vocab_size=SMALL["d_vocab"], seq_len=8)
    runs = []
    for how in ("object", "keywords"):
        model = lens_bias.random_init("llama", seed=3, **SMALL)
        run = train(model, data, TrainSettings(steps=4, batch_size=2, lr=1e-2), progress=False) if how == "object" else \
            train(model, data, steps=4, batch_size=2, lr=1e-2, progress=False)
        runs.append(run)
    assert runs[0].losses.loss.tolist() == runs[1].losses.loss.tolist()
    assert runs[0].config["steps"] == 4 and runs[0].config["warmup"] == TrainSettings(steps=4).warmup_steps
