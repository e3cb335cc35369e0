"""Every size argument of the command line, from 0 to 10^12: a result, a one-line error, or a bounded progress bar.

The memory guard plans against 64 MiB here whatever the machine has, so a count that cannot fit is refused (after
at most one batch: the inputs are drawn per batch), and one that fits either finishes on the tiny models below or
starts a progress bar with a known total of at least ``LONG`` steps (whose ETA tqdm shows); that bar is stopped at
once, as a user would stop it.

The experiments' fuzzed runs each go in a process of their own (a fork of a server that imported the library once),
watched from this one: a bar of known total open at a check, once a second, and the process is killed; no bar for
``SECONDS`` and the case fails. Nothing is raised into a running case.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import multiprocessing
import os
import pathlib
import time
from typing import Any
from unittest import mock

import pytest
import tqdm.std
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

import lens_bias
from lens_bias.cli import build_parser, main
from lens_bias.core import memory
from lens_bias.core.serialise import int_fields
from lens_bias.experiments.base import EXPERIMENTS

from .test_properties import settings as _profiles  # noqa: F401 - registers and loads the suite's Hypothesis profiles

LONG = 1000
SPEC = "llama:d=16,L=1,H=2,V=300,ctx=16"
# (command, the size flag, the other arguments[, how the value is written]); each size flag of the command line
# that takes a count. "a.pt" is a tiny model's fingerprint, written where each example runs.
SIZES = [
    ("analyze", "--n-sequences", ["--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--d-vocab", "50", "--seq-len", "6"]),
    ("analyze", "--seq-len", ["--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--d-vocab", "50", "--n-sequences", "3"]),
    ("analyze", "--batch-size", ["--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--d-vocab", "50", "--n-sequences", "3", "--seq-len", "6"]),
    ("analyze", "--d-model", ["--n-layers", "1", "--n-heads", "1", "--d-vocab", "50", "--n-sequences", "3", "--seq-len", "6"]),
    ("analyze", "--n-layers", ["--d-model", "16", "--n-heads", "2", "--d-vocab", "50", "--n-sequences", "3", "--seq-len", "6"]),
    ("analyze", "--n-heads", ["--d-model", "16", "--n-layers", "1", "--d-vocab", "50", "--n-sequences", "3", "--seq-len", "6"]),
    ("analyze", "--d-vocab", ["--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--n-sequences", "3", "--seq-len", "6"]),
    ("analyze", "--n-ctx", ["--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--d-vocab", "50", "--n-sequences", "3", "--seq-len", "6"]),
    ("fingerprint", "--n", [SPEC, "-o", "fp.pt", "--seq-len", "8"]),
    ("fingerprint", "--seq-len", [SPEC, "-o", "fp.pt", "--n", "4"]),
    ("fingerprint", "--batch-size", [SPEC, "-o", "fp.pt", "--n", "4", "--seq-len", "8"]),
    ("fingerprint", "--vocab", [SPEC, "-o", "fp.pt", "--n", "4", "--seq-len", "8"]),
    ("lineage", "--n", [f"{SPEC},seed=1", f"{SPEC},seed=2", "--seq-len", "8", "--m", "4"]),
    ("lineage", "--seq-len", [f"{SPEC},seed=1", f"{SPEC},seed=2", "--n", "8", "--m", "4"]),
    ("lineage", "--m", [f"{SPEC},seed=1", f"{SPEC},seed=2", "--n", "8", "--seq-len", "8"]),
    ("train", "--steps", [SPEC, "--out", "run", "--batch-size", "2", "--seq-len", "8"]),
    ("train", "--batch-size", [SPEC, "--out", "run", "--steps", "1", "--seq-len", "8"]),
    ("train", "--seq-len", [SPEC, "--out", "run", "--steps", "1", "--batch-size", "2"]),
    ("train", "--checkpoint-every", [SPEC, "--out", "run", "--steps", "2", "--batch-size", "2", "--seq-len", "8"]),
    ("lineage", "--vocab", [f"{SPEC},seed=1", f"{SPEC},seed=2", "--n", "8", "--seq-len", "8", "--m", "4"]),
    ("seedprint", "--m", ["a.pt", "a.pt"]),
    ("seedprint", "--null-option", ["a.pt", "a.pt", "--m", "8", "--null", "seeds"], "n_null={}"),
    ("seedprint", "--null-option", ["a.pt", "a.pt", "--m", "8", "--null", "empirical"], "n_trials={}"),
]


@functools.cache
def _fingerprint():
    model = lens_bias.models.load_model(SPEC)
    return lens_bias.seedprint.fingerprint(model, n=8, seq_len=8, progress=False)


class _LongRun(Exception):
    """A run that fits but would take long: its progress bar started with a known total."""


def _stop_long_bars(original, at_least=LONG):
    """tqdm's ``__init__``, raising :class:`_LongRun` where a bar of known total >= ``at_least`` starts: the run is
    stopped at that call, a defined point of the library's code."""

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if not self.disable and self.total is not None and self.total >= at_least:
            raise _LongRun(self.total)

    return init


@pytest.mark.slow  # many seconds: out of the inner loop, in the full suite
@given(size=st.sampled_from(SIZES), value=st.integers(0, 10**12))
@settings(max_examples=60 if os.environ.get("CI") else 40, derandomize=True)  # each example is a whole command: a fixed, bounded set
@example(size=SIZES[0], value=10**12)
@example(size=SIZES[8], value=10**12)
@example(size=SIZES[15], value=10**12)
@example(size=SIZES[21], value=10**12)  # the seeds null's fingerprints
@example(size=SIZES[22], value=10**12)  # the empirical null's trials
def test_every_size_argument(size, value, tmp_path_factory):
    command, flag, rest, *written = size
    event(_size_run([command, *rest, flag, (written or ["{}"])[0].format(value)], tmp_path_factory))


def _size_run(argv: list[str], tmp_path_factory: Any) -> str:
    """One fuzzed command, planned against 64 MiB: "a result", "refused in one line" (a LensBiasError, or the OS's
    or the memory's on the user's paths: the only exits 2 of the command line) or "a bounded progress bar". Any
    other exception, a bug in lens_bias's own code, propagates and fails the example."""
    out, err = io.StringIO(), io.StringIO()
    cache = str(tmp_path_factory.getbasetemp() / "cache")  # corpora and tokenizers, shared by the examples
    folder = tmp_path_factory.mktemp("sizes")
    if "a.pt" in argv:
        _fingerprint().save(folder / "a.pt")
    with contextlib.chdir(folder), mock.patch.dict(os.environ, {"LENS_BIAS_CACHE": cache}), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            mock.patch.object(memory, "available_bytes", lambda device=None: 64 * 2**20), \
            mock.patch.object(tqdm.std.tqdm, "__init__", _stop_long_bars(tqdm.std.tqdm.__init__)):
        try:
            code = main(argv)
        except _LongRun as run:
            assert run.args[0] >= LONG
            return "a bounded progress bar"
        except SystemExit as exit_:  # argparse: a value it cannot parse
            code = exit_.code
    assert code in (0, 2), (argv, err.getvalue()[-2000:])
    if code == 2:
        line = err.getvalue().strip().splitlines()[-1]
        assert line.startswith(f"lens-bias {argv[0]}: error: ") and "Traceback" not in err.getvalue(), err.getvalue()
        return "refused in one line"
    assert out.getvalue().strip()
    return "a result"


def test_the_fuzz_catches_a_bug_that_raises_type_error(tmp_path_factory, monkeypatch):
    """The control: a TypeError planted in an analysis is a crash the fuzz reports, not a refusal it accepts."""
    from lens_bias.analyses.sinks import Sinks

    argv = ["analyze", "--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--d-vocab", "50", "--seq-len", "6", "--n-sequences", "3"]
    assert _size_run(argv, tmp_path_factory) == "a result"

    def planted(self, adapter, kept, spec):
        raise TypeError("a bug in our own code")

    monkeypatch.setattr(Sinks, "finalize", planted)
    with pytest.raises(TypeError, match="a bug in our own code"):
        _size_run(argv, tmp_path_factory)
    monkeypatch.setattr(Sinks, "finalize", lambda *a: (_ for _ in ()).throw(lens_bias.LensBiasError("a refusal")))
    assert _size_run(argv, tmp_path_factory) == "refused in one line"


def test_every_count_flag_of_the_command_line_is_fuzzed():
    subcommands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    counts = {(command, action.option_strings[0]) for command, parser in subcommands.choices.items()
              for action in parser._actions if action.type is int and "seed" not in action.dest}
    fuzzed = {(command, flag) for command, flag, *_ in SIZES}
    assert counts <= fuzzed, sorted(counts - fuzzed)


def test_a_refusal_names_the_estimate_the_limit_and_the_largest_count(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(memory, "available_bytes", lambda device=None: 64 * 2**20)
    assert main(["fingerprint", SPEC, "-o", "fp.pt", "--n", str(10**12), "--seq-len", "8", "--no-progress"]) == 2
    line = capsys.readouterr().err.strip()
    # d_model 16: 128 B kept per sequence (the readout and the gain-free reading, [n, 16] each), against half of 64 MiB
    assert "\n" not in line and "need about" in line and "32.0 MiB can be used" in line and f"pass at most {2**25 // 128} sequences" in line


# ---- every integer field of every experiment, through --set ----------------------------------------------------

TINY = "llama:d=16,L=2,H=2,V=300,ctx=64"
# Each experiment with the flags that let it run on the tiny model above, or None where it needs a pretrained
# model with a tokenizer (the shipped SmolLM2).
ON_TINY = {"attribution": ["--model", TINY, "--set", "inputs=tokens"], "persistence": [], "sinks": [], "lineage-negatives": []}
ON_SMOLLM2 = {"descendants", "real-model"}
SECONDS = 20  # a stage of a run that lasts this long must be showing a progress bar of known total


def _fields(names) -> list[tuple[str, str, str]]:
    """(experiment, its smallest preset, an integer field of that preset's config)."""
    out = []
    for name in sorted(names):
        experiment = EXPERIMENTS.get(name)
        preset = "tiny" if "tiny" in experiment.presets else experiment.default_preset
        config = experiment.presets[preset]
        out += [(name, preset, field) for field, _ in int_fields(config)]  # a ModelSpec's as model.d_model
    return out


def _judge(argv: list[str], code: Any, err: str) -> str:
    """A finished run: "result" or "refused" (checked to be one line)."""
    assert code in (0, 1, 2), (argv, err[-2000:])
    if code == 2:
        errors = [line for line in err.splitlines() if line.startswith(f"lens-bias {argv[0]}: error: ")]
        assert len(errors) == 1 and "Traceback" not in err, err[-2000:]
        return "refused"
    return "result"


def _child(argv: list[str], folder: str, cache: str, events: Any) -> None:
    """One run in a process of its own: ``main(argv)`` planned against 64 MiB, telling the parent when a progress bar
    of known total opens and closes, and how the run ended."""
    os.chdir(folder)
    os.environ["LENS_BIAS_CACHE"] = cache
    init, close = tqdm.std.tqdm.__init__, tqdm.std.tqdm.close

    def opened(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if not self.disable and self.total is not None:
            events.send(("open", id(self)))

    def closed(self):
        events.send(("close", id(self)))
        close(self)

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            mock.patch.object(memory, "available_bytes", lambda device=None: 64 * 2**20), \
            mock.patch.object(tqdm.std.tqdm, "__init__", opened), mock.patch.object(tqdm.std.tqdm, "close", closed):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse: a value it cannot parse
            code = exit_.code
    events.send(("done", code, err.getvalue()))


_CONTEXT = multiprocessing.get_context("forkserver")
# The server imports the library and what building a model imports once (a name the installed TL lacks is skipped);
# each run is a fork of it, made before any thread of torch's has started.
_CONTEXT.set_forkserver_preload(["lens_bias.cli", "transformer_lens.model_bridge", "transformers.modeling_utils", "torch._dynamo", "accelerate", __name__])


def _run_experiment(argv: list[str], folder: pathlib.Path, cache: str) -> str:
    """``main(argv)`` in a child process, planned against 64 MiB: "result", "refused" (checked to be one line) or "bar"
    (a progress bar of known total open at a check, once a second, before ``SECONDS``: the child is then killed, as a
    user would stop the run). A run with no bar open at any check for ``SECONDS`` fails. The run is stopped from
    outside, never by an exception raised into it."""
    parent, child = _CONTEXT.Pipe(duplex=False)
    process = _CONTEXT.Process(target=_child, args=(argv, str(folder), cache, child), daemon=True)
    process.start()
    child.close()
    bars: set[int] = set()
    started = time.monotonic()
    try:
        while True:
            check = time.monotonic() + 1.0
            while (left := check - time.monotonic()) > 0 and parent.poll(left):
                try:
                    event_ = parent.recv()
                except EOFError:  # the child died without saying how
                    process.join()
                    raise AssertionError(f"{argv}: the run's process ended with exit code {process.exitcode} and no result") from None
                if event_[0] == "open":
                    bars.add(event_[1])
                elif event_[0] == "close":
                    bars.discard(event_[1])
                else:
                    return _judge(argv, event_[1], event_[2])
            if bars:
                return "bar"
            assert time.monotonic() - started < SECONDS, f"{argv} ran {SECONDS} s without a progress bar of known total"
    finally:
        process.kill()
        process.join()
        parent.close()


def test_the_fuzzed_experiments_are_every_experiment():
    assert set(EXPERIMENTS) == set(ON_TINY) | ON_SMOLLM2


@pytest.mark.slow
@given(field=st.sampled_from(_fields(ON_TINY)), value=st.integers(0, 10**12))
@example(field=("attribution", "tiny", "n"), value=10**12)
@example(field=("persistence", "tiny", "n_null_trained"), value=10**12)
@example(field=("sinks", "tiny", "position"), value=10**12)
@example(field=("attribution", "tiny", "calibration"), value=100000)  # the calibration passes ran with no bar
def test_every_experiment_size_field_on_a_tiny_model(field, value, tmp_path_factory):
    name, preset, key = field
    cache = str(tmp_path_factory.getbasetemp() / "cache")  # corpora and tokenizers, shared by the examples
    event(_run_experiment([name, "--preset", preset, *ON_TINY[name], "--set", f"{key}={value}"], tmp_path_factory.mktemp("experiment"), cache))


@pytest.mark.parametrize("field", _fields(ON_SMOLLM2), ids="-".join)
def test_every_experiment_size_field_on_smollm2(field, smollm2, monkeypatch, tmp_path):
    import lens_bias.experiments.descendants
    import lens_bias.experiments.real_model

    for module in (lens_bias.experiments.descendants, lens_bias.experiments.real_model):
        monkeypatch.setattr(module, "load_model", lambda text, **kwargs: smollm2)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(memory, "available_bytes", lambda device=None: 64 * 2**20)
    monkeypatch.setattr(tqdm.std.tqdm, "__init__", _stop_long_bars(tqdm.std.tqdm.__init__, at_least=1))
    name, preset, key = field
    for value in (0, 10**12):  # the loaded model is shared, so these run here: stopped where a bar of known total starts
        argv = [name, "--preset", preset, "--set", f"{key}={value}"]
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except _LongRun:
                continue
            except SystemExit as exit_:
                code = exit_.code
        _judge(argv, code, err.getvalue())


pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
