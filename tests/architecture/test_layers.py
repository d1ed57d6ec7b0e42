"""The layering of ARCHITECTURE.md, checked on the source: no import runs from a lower layer to a higher one.

Every `import`/`from ... import` in the package counts, including lazy imports inside functions and
imports under TYPE_CHECKING: a layer that needs a higher one for its types still depends on it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "multiagenttrainer"

# The library's parts from the bottom up (ARCHITECTURE.md). A part may import itself and any part of a
# lower layer; nothing of its own layer or above.
LAYERS: list[set[str]] = [
    {"errors", "atomic", "clock", "processes", "progress", "history"},
    {"config", "retry"},
    {"snapshot"},
    {"corpus"},
    {"sources"},
    {"ingest", "workspace"},
    {"agents", "execution"},
    {"experiments"},
    {"finetune", "report", "notify"},
    {"training", "monitor", "render"},
    {"serve", "request"},
    {"cli"},
    {"console"},
]
LAYER_OF = {part: level for level, parts in enumerate(LAYERS) for part in parts}
ORCHESTRATION = {"prefect", "prefect_aws", "prefect_docker", "flows", "tasks", "blocks", "deployments"}
# Outside the library: what each top-level package may import besides the library.
OUTSIDE_ALLOWED = {
    "blocks": {"prefect", "prefect_aws", "prefect_docker"},
    "tasks": {"prefect", "prefect_aws", "prefect_docker", "blocks"},
    "flows": {"prefect", "prefect_aws", "prefect_docker", "blocks", "tasks"},
    "deployments": {"prefect", "prefect_aws", "prefect_docker", "blocks", "tasks", "flows"},
}


def imported_modules(path: Path, source: str | None = None) -> Iterator[tuple[int, str]]:
    """(line, dotted module) of every import in a file, relative imports resolved."""
    text = path.read_text(encoding="utf-8") if source is None else source
    tree = ast.parse(text, str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base]) if base else ".".join(parent)
            yield node.lineno, base


def part_of(module: str) -> str | None:
    """`corpus` for multiagenttrainer.corpus.walk; None outside the library."""
    parts = module.split(".")
    return parts[1] if parts[0] == PACKAGE and len(parts) > 1 else None


def library_files() -> list[Path]:
    return sorted(p for p in (ROOT / PACKAGE).rglob("*.py") if "template" not in p.parts)


def test_every_library_part_has_a_layer() -> None:
    parts = {p.relative_to(ROOT / PACKAGE).parts[0].removesuffix(".py") for p in library_files()}
    missing = parts - {"__init__"} - set(LAYER_OF)
    assert not missing, f"add to LAYERS (and ARCHITECTURE.md): {missing}"


def upward_imports(path: Path, source: str | None = None) -> list[str]:
    """The imports of a library file that reach its own layer or above, or into Prefect and the flows."""
    own = path.relative_to(ROOT / PACKAGE).parts[0].removesuffix(".py")
    if own == "__init__":
        return []  # the package's public API re-exports from every layer
    problems = []
    for line, module in imported_modules(path, source):
        target = part_of(module)
        if module.split(".")[0] in ORCHESTRATION and own != "cli":
            problems.append(f"line {line}: {module} (the library never imports Prefect or the flows)")
        elif target is not None and target != own and LAYER_OF[target] >= LAYER_OF[own]:
            problems.append(f"line {line}: {module} ({target} is not below {own})")
    return problems


@pytest.mark.parametrize("path", library_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_import_runs_up_the_layers(path: Path) -> None:
    problems = upward_imports(path)
    assert not problems, f"{path.relative_to(ROOT)} imports upward:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "source",
    [
        "from multiagenttrainer.experiments.runner import Runner\n",
        "def f():\n    from multiagenttrainer.sources.base import Snapshot\n",  # lazy imports count
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import multiagenttrainer.agents.base\n",
        "from ..ingest import plan_ingest\n",  # relative
        "import prefect\n",
    ],
)
def test_the_check_catches_an_upward_import(source: str) -> None:
    probe = ROOT / PACKAGE / "corpus" / "probe.py"
    assert upward_imports(probe, source), source


def test_the_check_allows_downward_and_own_imports() -> None:
    probe = ROOT / PACKAGE / "corpus" / "probe.py"
    source = "from multiagenttrainer.snapshot import Snapshot\nfrom multiagenttrainer.corpus import walk\n"
    assert upward_imports(probe, source) == []


@pytest.mark.parametrize("top", sorted(OUTSIDE_ALLOWED))
def test_orchestration_packages_only_import_downward(top: str) -> None:
    problems = []
    for path in sorted((ROOT / top).rglob("*.py")):
        for line, module in imported_modules(path):
            first = module.split(".")[0]
            if first in ORCHESTRATION and first != top and first not in OUTSIDE_ALLOWED[top]:
                problems.append(f"{path.relative_to(ROOT)}:{line}: {module}")
    assert not problems, f"{top}/ imports a package above it:\n" + "\n".join(problems)
