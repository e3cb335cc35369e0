"""What a reader sees of a report page: the page opened in headless Chromium with networking disabled, its console,
its drawn views, and a screenshot where ``$LENS_BIAS_SCREENSHOTS`` names a folder (``docs/make_figures.py``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest


def requires_chromium(test):
    """A test that opens a page in headless Chromium: skipped without it; ``wide`` (a browser's start is seconds:
    the README's command runs it, the inner loop does not)."""
    skip = pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium (.ci/run installs it)")
    return pytest.mark.wide(skip(test))

PAGE_BUDGET = 1_000_000  # bytes: a report page with one circuitsvis bundle, its figures and its CSVs


def chromium_offline(args: list[str]) -> subprocess.CompletedProcess:
    base = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=8000", *args]
    if shutil.which("unshare") and subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0:
        return subprocess.run(["unshare", "-n", *base], capture_output=True, text=True, timeout=180)
    # no network namespace: send every request to a closed local port instead
    return subprocess.run([base[0], "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=<-loopback>", *base[1:]], capture_output=True,
                          text=True, timeout=180)


def read_page(path: Path, *, screenshot: str | None = None, height: int = 2400) -> str:
    """The page's DOM after its scripts ran, checked: nothing on the console (an uncaught error, a failed load, a
    React warning all print there), every circuitsvis view drawn, every figure there; and, where
    ``$LENS_BIAS_SCREENSHOTS`` names a folder, a screenshot saved there as ``screenshot``."""
    done = chromium_offline(["--enable-logging=stderr", "--v=0", "--dump-dom", path.as_uri()])
    # the page's own console lines (Chromium's internal pages, chrome://, log their own)
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line and f"source: {path.as_uri()}" in line]
    assert console == [], console
    dom = done.stdout
    views = re.findall(r'<div id="(circuits-vis-[^"]+)"', path.read_text())
    for view in views:  # each view's container now holds elements React drew, not just an empty div
        assert re.search(rf'<div id="{view}"[^>]*><[a-z]', dom), f"view {view} was not drawn"
    assert dom.count("<img") == path.read_text().count("<img")
    if screenshot is not None and os.environ.get("LENS_BIAS_SCREENSHOTS"):
        shot = Path(os.environ["LENS_BIAS_SCREENSHOTS"]) / screenshot
        chromium_offline([f"--window-size=1280,{height}", f"--screenshot={shot}", path.as_uri()])
        assert shot.exists() and shot.stat().st_size > 10_000
    return dom
