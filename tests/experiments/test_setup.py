"""setup_workspace: the git work tree, its ignore rules, every way to name a corpus; and the results link
the experiment ledger adds to it (experiments/results.py `link_results`)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest

from multiagenttrainer.config import AutoresearchConfig
from multiagenttrainer.errors import ConfigError, CorpusError, ExperimentError
from multiagenttrainer.experiments.results import RESULTS_HEADER, link_results
from multiagenttrainer.workspace import gitops
from multiagenttrainer.workspace.setup import (
    IGNORED,
    Workspace,
    chunk_text,
    locate_corpus_jsonl,
    setup_workspace,
)
from tests.support.experiments import REPO_ROOT, library_records

FAKE_AUTORESEARCH = REPO_ROOT / "tests" / "assets" / "fake_autoresearch"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def read_jsonl(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def test_builtin_workspace(tmp_path: Path, corpus_dir: Path) -> None:
    run_dir = tmp_path / "20250101-000000-demo"
    workspace = setup_workspace(
        run_dir,
        corpus_dir,
        AutoresearchConfig(train_time=42),
        run_tag=run_dir.name,
        env={"MAT_FIXED_STEPS": "2"},
    )
    path = run_dir / "workspace"
    assert workspace.path == path and workspace.kind == "builtin"
    assert workspace.branch == "autoresearch/20250101-000000-demo" == gitops.current_branch(path)
    assert workspace.train_time_s == 42 and workspace.train_command[-1] == "train.py"
    assert workspace.env == {"PYTHONUNBUFFERED": "1", "MAT_FIXED_STEPS": "2"}
    assert git(path, "log", "--format=%H %an %s").splitlines() == [
        f"{workspace.baseline_commit} mat baseline"
    ]
    assert sorted(git(path, "ls-files").split()) == [".gitignore", "prepare.py", "program.md", "train.py"]
    assert gitops.changed_paths(path) == []
    assert set(IGNORED) <= set((path / ".gitignore").read_text().splitlines())
    assert (path / "data" / "train.bin").stat().st_size > 0 and (path / "data" / "val.bin").stat().st_size > 0
    assert "TIME_BUDGET = 42" in (path / "prepare.py").read_text()
    assert not (path / "results.tsv").exists()  # the ledger is not the workspace's business
    link_results(run_dir, path)
    link = path / "results.tsv"
    assert link.is_symlink() and str(link.readlink()) == "../results.tsv"
    assert link.read_text() == RESULTS_HEADER + "\n" == (run_dir / "results.tsv").read_text()
    assert Workspace.from_dict(json.loads(json.dumps(workspace.to_dict()))) == workspace
    assert workspace.facts["train_tokens"] == (path / "data" / "train.bin").stat().st_size  # a byte a token
    damaged = {**workspace.to_dict(), "facts": "not a mapping"}  # run.json is not trusted
    assert Workspace.from_dict(damaged).facts == {}


def test_program_md_override(tmp_path: Path, corpus_dir: Path) -> None:
    program = tmp_path / "my-program.md"
    program.write_text("# Only touch the learning rate\n")
    workspace = setup_workspace(
        tmp_path / "run", corpus_dir, AutoresearchConfig(train_time=5, program_md=str(program)), run_tag="p"
    )
    assert (workspace.path / "program.md").read_text() == "# Only touch the learning rate\n"
    assert git(workspace.path, "show", "HEAD:program.md") == "# Only touch the learning rate\n"


def test_refuses_a_used_workspace_and_a_bad_run_tag(tmp_path: Path, corpus_dir: Path) -> None:
    (tmp_path / "run" / "workspace").mkdir(parents=True)
    (tmp_path / "run" / "workspace" / "train.py").write_text("")
    with pytest.raises(ExperimentError, match="already exists"):
        setup_workspace(tmp_path / "run", corpus_dir, AutoresearchConfig(), run_tag="a")
    with pytest.raises(ConfigError, match="cannot be part of a git branch name"):
        setup_workspace(tmp_path / "other", corpus_dir, AutoresearchConfig(), run_tag="bad..tag")


def test_corpus_can_be_named_by_dir_txt_or_jsonl(tmp_path: Path, corpus_dir: Path) -> None:
    jsonl = corpus_dir / "corpus.jsonl"
    assert locate_corpus_jsonl(corpus_dir, tmp_path) == jsonl
    assert locate_corpus_jsonl(corpus_dir / "corpus.txt", tmp_path) == jsonl
    assert locate_corpus_jsonl(jsonl, tmp_path) == jsonl
    with pytest.raises(CorpusError, match="run `mat ingest` first"):
        locate_corpus_jsonl(tmp_path / "nowhere", tmp_path)


def test_a_plain_corpus_txt_is_split_on_header_lines(tmp_path: Path, corpus_dir: Path) -> None:
    own = tmp_path / "mine"
    own.mkdir()
    shutil.copyfile(corpus_dir / "corpus.txt", own / "corpus.txt")
    converted = locate_corpus_jsonl(own / "corpus.txt", tmp_path / "scratch")
    assert converted == tmp_path / "scratch" / "corpus.jsonl"
    records = read_jsonl(converted)
    originals = library_records()
    assert [(r["repo"], r["path"]) for r in records] == [("acme/mat", o["path"]) for o in originals]
    assert [r["text"] for r in records] == [o["text"] + "\n" for o in originals]
    assert {r["split"] for r in records} == {"train", "val"}
    again = locate_corpus_jsonl(own, tmp_path / "again")  # the directory works too; same split every time
    assert again.read_bytes() == converted.read_bytes()
    workspace = setup_workspace(
        tmp_path / "run", own / "corpus.txt", AutoresearchConfig(train_time=5), run_tag="t"
    )
    assert (workspace.path / "data" / "train.bin").stat().st_size > 100_000


def test_text_without_headers_is_cut_into_chunks_at_newlines(tmp_path: Path) -> None:
    lines = [f"line {i} " + "y" * (i % 97) + "\n" for i in range(3000)]
    text = "".join(lines)
    chunks = list(chunk_text(text, 4096))
    assert "".join(chunks) == text
    assert all(len(c) <= 4096 and c.endswith("\n") for c in chunks)
    (tmp_path / "notes.txt").write_text(text)
    records = read_jsonl(locate_corpus_jsonl(tmp_path / "notes.txt", tmp_path / "scratch"))
    assert [r["path"] for r in records[:2]] == ["chunk-00000", "chunk-00001"]
    assert "".join(str(r["text"]) for r in records) == text
    assert 0 < sum(r["split"] == "val" for r in records) < len(records)
    assert list(chunk_text("x" * 10_000, 4096)) == [
        "x" * 4096,
        "x" * 4096,
        "x" * 1808,
    ]  # no newline to cut at


def test_real_autoresearch_workspace_gets_branch_ignores_link_and_baseline(
    tmp_path: Path, corpus_dir: Path
) -> None:
    source = tmp_path / "autoresearch"
    shutil.copytree(FAKE_AUTORESEARCH, source, ignore=shutil.ignore_patterns("__pycache__"))
    git(source, "init", "-q", "-b", "master")
    git(
        source, "-c", "user.name=k", "-c", "user.email=k@x", "commit", "-q", "--allow-empty", "-m", "upstream"
    )
    git(source, "add", "-A")
    git(source, "-c", "user.name=k", "-c", "user.email=k@x", "commit", "-q", "-m", "autoresearch")
    upstream = git(source, "rev-parse", "HEAD").strip()
    cfg = AutoresearchConfig(repo=str(source), branch="master", train_time=7)
    run_dir = tmp_path / "run"
    workspace = setup_workspace(run_dir, corpus_dir, cfg, run_tag="ar")
    path = workspace.path
    assert workspace.kind == "autoresearch" and workspace.branch == "autoresearch/ar"
    assert gitops.current_branch(path) == "autoresearch/ar"
    assert git(path, "rev-parse", "HEAD~1").strip() == upstream
    assert git(path, "log", "-1", "--format=%s %an").strip() == "baseline mat"
    assert gitops.changed_paths(path) == []
    assert "TIME_BUDGET = 7" in (path / "prepare.py").read_text()
    assert set(IGNORED) <= set((path / ".gitignore").read_text().splitlines())
    link_results(run_dir, path)
    assert (path / "results.tsv").read_text() == RESULTS_HEADER + "\n"
    assert gitops.changed_paths(path) == []  # the link is ignored
    assert workspace.baseline_commit == gitops.head_sha(path)
