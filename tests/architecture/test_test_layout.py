"""The layout of tests/ (ARCHITECTURE.md): a feature directory imports only itself and tests/support.

Shared servers, fakes and helpers live in tests/support/; a test module that imports another feature's
conftest, helpers or test module couples the two features (and breaks when either moves). Imports inside
functions count, and so do the module names in strings (`python -c "from tests.x import y"`, plugin names).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
SHARED = "support"
# Module names inside string constants: code run by `python -c`, or a dotted name on its own.
CODE_IMPORT = re.compile(r"\b(?:from|import)\s+(tests(?:\.\w+)+)")
DOTTED_NAME = re.compile(r"(tests(?:\.\w+)+)(?::\w+)?")


def python_files() -> list[Path]:
    """Every Python file under tests/ but the assets (programs the tests run) and this file (examples)."""
    return sorted(
        p
        for p in TESTS.rglob("*.py")
        if "assets" not in p.relative_to(TESTS).parts and p != Path(__file__).resolve()
    )


def feature_of(path: Path) -> str | None:
    """`corpus` for tests/corpus/test_walk.py and tests/corpus/sub/x.py; None for files in tests/ itself."""
    parts = path.relative_to(TESTS).parts
    return parts[0] if len(parts) > 1 else None


def named_test_modules(path: Path, source: str | None = None) -> Iterator[tuple[int, str]]:
    """(line, dotted module) of every tests.* module a file imports or names in a string."""
    text = path.read_text(encoding="utf-8") if source is None else source
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield from ((node.lineno, m) for m in CODE_IMPORT.findall(node.value))
            whole = DOTTED_NAME.fullmatch(node.value)
            if whole:
                yield node.lineno, whole.group(1)


def foreign_imports(path: Path, source: str | None = None) -> list[str]:
    """The tests.* modules a file uses from outside its own feature directory and tests/support."""
    own = feature_of(path)
    problems = []
    for line, module in named_test_modules(path, source):
        parts = module.split(".")
        if parts[0] != "tests" or len(parts) < 2:
            continue
        if parts[1] != SHARED and parts[1] != own:
            problems.append(f"line {line}: {module} (move what is shared to tests/support/)")
    return problems


@pytest.mark.parametrize("path", python_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_test_modules_import_only_their_feature_and_support(path: Path) -> None:
    problems = foreign_imports(path)
    assert not problems, f"{path.relative_to(ROOT)} imports another feature's tests:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "source",
    [
        "from tests.agents.helpers import request_for\n",
        "from tests.request.conftest import planner_command\n",
        "import tests.sources.test_github_org\n",
        "def f():\n    from tests.execution.test_train_remote import mat\n",  # lazy imports count
        'CODE = "from tests.execution.helpers import slow_remote_run_main; slow_remote_run_main()"\n',
        'PLUGIN = "tests.finetune.mycloud_backend"\n',
    ],
)
def test_the_check_catches_an_import_from_another_feature(source: str) -> None:
    probe = TESTS / "corpus" / "probe.py"
    assert foreign_imports(probe, source), source


def test_the_check_allows_support_and_own_feature() -> None:
    probe = TESTS / "finetune" / "bedrock" / "probe.py"
    source = (
        "from tests.support.git_servers import GitHttpServer\n"
        "from tests.finetune.conftest import mat\n"
        "from tests.finetune.bedrock.conftest import BUCKET\n"
        'CODE = "from tests.finetune.helpers import main; main()"\n'
    )
    assert foreign_imports(probe, source) == []


def test_support_modules_import_only_support() -> None:
    probe = TESTS / "support" / "probe.py"
    assert foreign_imports(probe, "from tests.corpus.conftest import git\n")
    assert foreign_imports(probe, "from tests.support.sshd import Sshd\n") == []


def fixtures_defined(path: Path) -> set[str]:
    """Names of the fixtures a conftest or plugin module defines (not those it imports)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and any("fixture" in ast.unparse(decorator) for decorator in node.decorator_list)
    }


def plugin_modules() -> list[Path]:
    """The fixture modules tests/conftest.py registers with `pytest_plugins`."""
    tree = ast.parse((TESTS / "conftest.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "pytest_plugins":
            return [ROOT / (name.replace(".", "/") + ".py") for name in ast.literal_eval(node.value)]
    return []


def shadowed_fixtures(conftest: Path) -> list[str]:
    """Fixtures of a conftest that a parent directory's conftest or a suite-wide plugin also defines."""
    above = [TESTS / "conftest.py", *plugin_modules()]
    above += [d / "conftest.py" for d in conftest.parent.parents if TESTS in d.parents]
    own = fixtures_defined(conftest)
    return sorted(
        f"{name} (also in {other.relative_to(ROOT)})"
        for other in above
        if other.is_file() and other != conftest
        for name in own & fixtures_defined(other)
    )


@pytest.mark.parametrize(
    "conftest", sorted(TESTS.rglob("conftest.py")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_no_conftest_shadows_a_fixture_from_above(conftest: Path) -> None:
    """A nested directory that redefines a fixture name makes that name mean two things; rename one."""
    problems = shadowed_fixtures(conftest)
    assert not problems, f"{conftest.relative_to(ROOT)} redefines:\n" + "\n".join(problems)
