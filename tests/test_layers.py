"""The package's layers, enforced: imports between lens_bias modules run one way.

From the bottom: ``core``, ``models``, ``hooks`` | ``seedprint``, ``analyses`` | ``training``, ``report``,
``experiments``, ``cli``, ``__main__``, and the package's own ``__init__`` (its flat re-exports) on top. Modules at one level
separated by ``|`` are independent: neither imports the other. The test reads every module's imports with ``ast``
(``hooks/`` and ``analyses/`` as ``lens_bias.hooks`` and ``lens_bias.analyses``) and reports, all at once:

- every cycle between lens_bias modules;
- every import of a higher layer, or of an independent sibling;
- every import of a lens_bias module inside a function or class (optional third-party imports may be lazy);
- every private name (``_x``) imported from another lens_bias module;
- every package attribute that shadows one of its modules (a function named like a module file).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Bottom to top; names in one tuple are independent siblings.
LAYERS: list[tuple[str, ...]] = [
    ("lens_bias.core",),
    ("lens_bias.models",),
    ("lens_bias.hooks", "lens_bias.seedprint"),
    ("lens_bias.analyses", "lens_bias.training"),
    ("lens_bias.report", "lens_bias.extend"),
    ("lens_bias.experiments",),
    ("lens_bias.cli",),
    ("lens_bias.__main__",),
]
TOP = "lens_bias"  # the package __init__: the user's flat re-exports of everything below


def module_files() -> dict[str, Path]:
    files = {}
    for folder, prefix in (("lens_bias", "lens_bias"), ("hooks", "lens_bias.hooks"), ("analyses", "lens_bias.analyses")):
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join([prefix, *parts])] = path
    return files


FILES = module_files()


def package_of(module: str) -> str:
    """The module itself if it is a package, else its parent."""
    return module if FILES[module].name == "__init__.py" else module.rsplit(".", 1)[0]


def resolve(module: str, node: ast.ImportFrom | ast.Import) -> list[tuple[str, list[str]]]:
    """(imported lens_bias module, names taken from it) for one import statement."""
    if isinstance(node, ast.Import):
        return [(alias.name, []) for alias in node.names if alias.name.startswith("lens_bias")]
    if node.level:
        base = package_of(module).split(".")
        base = base[: len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not target.startswith("lens_bias"):
        return []
    out: list[tuple[str, list[str]]] = []
    plain = []
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        if sub in FILES:  # `from pkg import module`
            out.append((sub, []))
        else:
            plain.append(alias.name)
    if plain or not out:
        out.append((target, plain))
    return out


def scan(module: str, source: str) -> list[tuple[str, str, list[str], int, bool]]:
    """(importer, imported, names, line, at module level) for every lens_bias import in one module's source."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        scope, top = parents.get(node), True
        while scope is not None:
            if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                top = False
            scope = parents.get(scope)
        for target, names in resolve(module, node):
            found.append((module, target, names, node.lineno, top))
    return found


def imports() -> list[tuple[str, str, list[str], int, bool]]:
    return [found for module, path in FILES.items() for found in scan(module, path.read_text())]


def layer_of(module: str) -> tuple[int, str] | None:
    if module == TOP:
        return len(LAYERS), TOP
    for level, group in enumerate(LAYERS):
        for name in group:
            if module == name or module.startswith(name + "."):
                return level, name
    return None


def where(module: str, line: int) -> str:
    return f"{FILES[module].relative_to(ROOT)}:{line}"


def violations() -> list[str]:
    problems = []
    edges: dict[str, set[str]] = {m: set() for m in FILES}
    for importer, target, names, line, top in imports():
        imported = target if target in FILES else target.rsplit(".", 1)[0]
        if not top:
            problems.append(f"function-level import of {target} in {where(importer, line)}")
        private = [n for n in names if n.startswith("_") and n != "__version__"]
        if private and imported != importer:
            problems.append(f"private name(s) {private} imported from {imported} in {where(importer, line)}")
        mine, theirs = layer_of(importer), layer_of(imported)
        if mine is None or theirs is None:
            problems.append(f"{importer if mine is None else imported} belongs to no layer (add it to LAYERS)")
            continue
        if theirs[0] > mine[0]:
            problems.append(f"upward import: {importer} ({mine[1]}) imports {imported} ({theirs[1]}) in {where(importer, line)}")
        elif theirs[0] == mine[0] and theirs[1] != mine[1]:
            problems.append(f"sibling import: {importer} ({mine[1]}) imports {imported} ({theirs[1]}), which is independent, in {where(importer, line)}")
        # a package importing its own children is how a package is made, not a cycle
        if not (FILES[importer].name == "__init__.py" and imported.startswith(importer + ".")) and imported != importer:
            edges[importer].add(imported)
    problems += [f"import cycle: {' -> '.join(cycle)}" for cycle in cycles(edges)]
    return problems


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component) + [sorted(component)[0]])

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_every_module_belongs_to_a_layer_and_imports_only_downward():
    problems = violations()
    assert not problems, "\n".join(problems)


def test_no_package_attribute_shadows_one_of_its_modules():
    shadowed = []
    for module, path in FILES.items():
        if path.name != "__init__.py":
            continue
        package = importlib.import_module(module)
        for child in FILES:
            if "." in child and child.rsplit(".", 1)[0] == module:
                leaf = child.rsplit(".", 1)[1]
                value = getattr(package, leaf, None)
                if value is not None and getattr(value, "__name__", None) != child:
                    shadowed.append(f"{module}.{leaf} is {type(value).__name__} {value!r}, not the module {child}")
    assert not shadowed, "\n".join(shadowed)


def test_the_checker_sees_what_it_should(tmp_path):
    """The contract would pass vacuously if the graph were empty: it holds the edges every layer is built on."""
    found = {(importer, target) for importer, target, _, _, _ in imports()}
    assert ("lens_bias.models.spec", "lens_bias.core.model_facts") in found
    assert ("lens_bias.report.bias_report", "lens_bias.analyses.base") in found
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    lazy = "import torch\nfrom lens_bias.core.errors import LensBiasError\n\ndef f():\n    from ..core import tl\n    import transformers\n"
    assert scan("lens_bias.models.init", lazy) == [
        ("lens_bias.models.init", "lens_bias.core.errors", ["LensBiasError"], 2, True), ("lens_bias.models.init", "lens_bias.core.tl", [], 5, False)]
    assert layer_of("lens_bias.hooks.mlp") == (2, "lens_bias.hooks") and layer_of("lens_bias.cli") == (6, "lens_bias.cli")
