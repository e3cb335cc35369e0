"""A griffe extension for the API reference: lens_bias docstrings as mkdocstrings reads them.

* Doctest runs (``>>>`` lines and their output, up to a blank line) become ``pycon`` code blocks.
* Sphinx roles (``:func:`test```, ``:class:`~lens_bias.x.Y```) become cross-references, resolved in the scope of
  the object (``scoped_crossrefs``): a reference to a missing object fails ``mkdocs build --strict``.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension

ROLE = re.compile(r":(?:class|func|meth|attr|mod|data|exc):`(~?)([\w.]+?)(\(\))?`")


def _role(match: re.Match) -> str:
    tilde, target, call = match.groups()
    label = target.rsplit(".", 1)[-1] if tilde else target
    return f"[`{label}{call or ''}`][{target}]"


def _fence_doctests(text: str) -> str:
    out: list[str] = []
    lines = text.splitlines()
    i, in_fence = 0, False
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        if in_fence or not line.lstrip().startswith(">>>"):
            out.append(ROLE.sub(_role, line) if not in_fence else line)
            i += 1
            continue
        indent = line[: len(line) - len(line.lstrip())]
        out.append(f"{indent}```pycon")
        while i < len(lines) and lines[i].strip():
            out.append(lines[i])
            i += 1
        out.append(f"{indent}```")
    return "\n".join(out)


class DoctestsAndRoles(Extension):
    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _fence_doctests(obj.docstring.value)
