"""Fixture autoresearch repositories and corpora for the real-autoresearch workspace tests.

`fake_autoresearch` publishes tests/assets/fake_autoresearch (autoresearch's data contract, CPU-sized)
as a git repository with two branches, `master` and `cpu`, in a bare repository that the loopback git
servers export as /karpathy/autoresearch.git. Variants of it (a prepare.py without the CACHE_DIR line,
a tokenizer step that fails or hangs) are published next to it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from multiagenttrainer.config import AutoresearchConfig
from multiagenttrainer.workspace.autoresearch import AutoresearchSetup, prepare_autoresearch_workspace
from tests.support.git_servers import GitDaemon, GitHttpServer, git

ASSET_DIR = Path(__file__).resolve().parents[2] / "assets" / "fake_autoresearch"
LIBRARY_DIR = Path(__file__).resolve().parents[3] / "multiagenttrainer"
GIT_TESTS_DIR = Path(__file__).resolve().parents[2] / "sources"
BRANCH_MARKER = "BRANCH.txt"


@dataclass(frozen=True)
class PublishedRepo:
    """A fixture repository: its bare copy (what servers export) and the work tree it was made in."""

    slug: str
    bare: Path
    work: Path

    def head(self, branch: str) -> str:
        return git("rev-parse", f"refs/heads/{branch}", cwd=self.bare)


def publish(
    root: Path, scratch: Path, slug: str, edit: Callable[[Path], None] | None = None
) -> PublishedRepo:
    """Commit the fixture files (after `edit`) on `master`, add a `cpu` branch, publish as root/<slug>.git."""
    work = scratch / slug
    shutil.copytree(ASSET_DIR, work, ignore=shutil.ignore_patterns("__pycache__"))
    if edit is not None:
        edit(work)
    bare = root / f"{slug}.git"
    git("init", "-q", "--bare", "-b", "master", str(bare))
    git("init", "-q", "-b", "master", str(work))
    (work / BRANCH_MARKER).write_text("master\n")
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "fixture autoresearch", cwd=work)
    git("checkout", "-q", "-b", "cpu", cwd=work)
    (work / BRANCH_MARKER).write_text("cpu\n")
    git("commit", "-q", "-am", "cpu branch", cwd=work)
    git("checkout", "-q", "master", cwd=work)
    git("push", "-q", str(bare), "master", "cpu", cwd=work)
    return PublishedRepo(slug, bare, work)


def replace_in(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{old!r} not found once in {path}"
    path.write_text(text.replace(old, new), encoding="utf-8")


@pytest.fixture(scope="session")
def served_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("autoresearch-served")


@pytest.fixture(scope="session")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("autoresearch-work")


@pytest.fixture(scope="session")
def fake_autoresearch(served_root: Path, scratch: Path) -> PublishedRepo:
    """The fixture repository, unchanged."""
    return publish(served_root, scratch, "karpathy/autoresearch")


@pytest.fixture(scope="session")
def no_cache_line_repo(served_root: Path, scratch: Path) -> PublishedRepo:
    """A fork whose prepare.py lost the CACHE_DIR line."""

    def edit(work: Path) -> None:
        replace_in(
            work / "prepare.py",
            'CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "autoresearch")\n',
            "",
        )

    return publish(served_root, scratch, "forks/no-cache-line", edit)


@pytest.fixture(scope="session")
def failing_tokenizer_repo(served_root: Path, scratch: Path) -> PublishedRepo:
    """A fork whose prepare.py fails with a recognisable message (before the slow torch import)."""

    def edit(work: Path) -> None:
        replace_in(
            work / "prepare.py",
            "import math\n",
            'import sys as _sys\n\nprint("tokenizer exploded on purpose")\n_sys.exit(3)\n\nimport math\n',
        )

    return publish(served_root, scratch, "forks/failing-tokenizer", edit)


@pytest.fixture(scope="session")
def checkpoint_fork(served_root: Path, scratch: Path) -> PublishedRepo:
    """A fork whose train.py keeps the contract of `autoresearch.verify`: a build_model() that needs no
    training, and the trained weights saved as checkpoint.pt ({"model": state_dict}) before evaluating."""

    def edit(work: Path) -> None:
        train = work / "train.py"
        build = "def build_model():\n    return GPT(Tokenizer.from_directory().get_vocab_size())\n\n\n"
        replace_in(train, "def main():\n", build + "def main():\n")
        replace_in(
            train,
            "    model = GPT(tokenizer.get_vocab_size()).to(device)\n",
            "    model = build_model().to(device)\n",
        )
        call = "    val_bpb = evaluate_bpb(model, tokenizer, EVAL_BATCH_SIZE)\n"
        replace_in(train, call, '    torch.save({"model": model.state_dict()}, "checkpoint.pt")\n' + call)

    return publish(served_root, scratch, "forks/checkpoint", edit)


@pytest.fixture(scope="session")
def missing_package_repo(served_root: Path, scratch: Path) -> PublishedRepo:
    """A fork whose train.py imports a package that is not installed (like the real one's `kernels`)."""

    def edit(work: Path) -> None:
        replace_in(work / "train.py", "import torch\n", "import mat_fixture_missing_kernels\nimport torch\n")

    return publish(served_root, scratch, "forks/missing-package", edit)


PIDFILE_ENV = "FAKE_AUTORESEARCH_PIDFILE"


@pytest.fixture(scope="session")
def hanging_tokenizer_repo(served_root: Path, scratch: Path) -> PublishedRepo:
    """A fork whose prepare.py, once imported, writes its pid to $FAKE_AUTORESEARCH_PIDFILE and hangs."""

    def edit(work: Path) -> None:
        replace_in(
            work / "prepare.py",
            "import math\n",
            f"import os as _os\nimport time as _time\n\n"
            f'with open(_os.environ["{PIDFILE_ENV}"], "w") as _f:\n'
            "    _f.write(str(_os.getpid()))\n"
            "_time.sleep(120)\n\nimport math\n",
        )

    return publish(served_root, scratch, "forks/hanging-tokenizer", edit)


@pytest.fixture(scope="session")
def served_http(served_root: Path) -> Iterator[GitHttpServer]:
    """Smart HTTP on 127.0.0.1 without authentication, exporting served_root."""
    with GitHttpServer(served_root, token=None) as server:
        yield server


@pytest.fixture(scope="session")
def served_daemon(served_root: Path) -> Iterator[GitDaemon]:
    with GitDaemon(served_root) as daemon:
        yield daemon


# ---------------------------------------------------------------- corpora


def source_records(root: Path, repo: str, val_every: int | None) -> list[dict[str, Any]]:
    """One corpus record per .py file under root; every `val_every`-th one (sorted by path) is val."""
    files = sorted(p for p in root.rglob("*.py") if p.stat().st_size > 0 and "__pycache__" not in p.parts)
    return [
        {
            "source": "fixture",
            "repo": repo,
            "commit": "0" * 40,
            "path": str(path.relative_to(root)),
            "bytes": path.stat().st_size,
            "split": "val" if val_every and position % val_every == 0 else "train",
            "text": path.read_text(encoding="utf-8"),
        }
        for position, path in enumerate(files)
    ]


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(record) + b"\n" for record in records))
    return path


@pytest.fixture(scope="session")
def mat_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """corpus.jsonl of mat's library sources, with a val split (every 8th file), and one generated file of
    very long lines (a data table on one line each: many tokens per character for a small tokenizer)."""
    records = source_records(LIBRARY_DIR, "acme/mat", 8)
    table = "".join(f"ROW_{n} = [{', '.join(str(n * i % 997) for i in range(900))}]\n" for n in range(6))
    records.append({**records[1], "path": "generated/table.py", "bytes": len(table), "text": table})
    return write_jsonl(tmp_path_factory.mktemp("corpus-lib") / "corpus.jsonl", records)


@pytest.fixture(scope="session")
def tests_corpus_without_val(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """corpus.jsonl of the git-source tests' sources, every record in the train split."""
    return write_jsonl(
        tmp_path_factory.mktemp("corpus-tests") / "corpus.jsonl",
        source_records(GIT_TESTS_DIR, "acme/tests", None),
    )


def set_up(
    repo: str, corpus: Path, run_dir: Path, branch: str = "master", **config: Any
) -> AutoresearchSetup:
    """prepare_autoresearch_workspace with a config made of the arguments, into run_dir/workspace."""
    cfg = AutoresearchConfig(repo=repo, branch=branch, **config)
    return prepare_autoresearch_workspace(cfg, corpus, run_dir / "workspace", run_dir)
