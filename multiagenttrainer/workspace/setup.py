"""Set up a run's workspace: a fresh git work tree holding train.py, the fixed files and the data.

    <run_dir>/workspace/     git repo on branch autoresearch/<run-tag>, first commit "baseline"
    <run_dir>/evaluator/     the evaluator's record: hashes and copies of the fixed files, mat's git config,
                             and (built-in) the held-out split (workspace/evaluator.py)

(The run's results.tsv and the workspace link to it belong to the experiment ledger:
experiments/results.py `link_results`; the ignore rules here keep that link out of git.)

Built-in (no `autoresearch.repo`): the bundled template plus data/train.bin and data/val.bin (a dev split)
from the corpus; the corpus's val split is kept out of the workspace as the held-out split mat scores on.
Real autoresearch (`autoresearch.repo` set): `workspace.autoresearch` clones it and injects the corpus;
this module adds the branch, the ignore rules and the baseline commit.

The Workspace record says how to run training there; it is stored in run.json so `--resume` rebuilds it.
"""

from __future__ import annotations

import hashlib
import logging
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson
import xxhash

from multiagenttrainer.config import AutoresearchConfig, GithubConfig
from multiagenttrainer.errors import ConfigError, CorpusError, ExperimentError
from multiagenttrainer.sources.base import SourceContext
from multiagenttrainer.sources.git import GitCredentials
from multiagenttrainer.sources.github_urls import github_credentials
from multiagenttrainer.workspace import gitops, worktree
from multiagenttrainer.workspace.builtin import render_template, write_builtin_data
from multiagenttrainer.workspace.evaluator import HOLDOUT_REL, record_evaluator

log = logging.getLogger(__name__)

WorkspaceKind = Literal["builtin", "autoresearch"]
# How a run's val_bpb is obtained: "independent" = mat re-scores the checkpoint train.py saved, apart from
# training (workspace/scoring.py); "summary" = the val_bpb train.py prints (autoresearch's own contract).
Evaluation = Literal["independent", "summary"]
EVALUATIONS = ("independent", "summary")
WORKSPACE_DIR = "workspace"
BRANCH_PREFIX = "autoresearch/"
BASELINE_MESSAGE = "baseline"
IGNORED = (
    "data/",
    "run.log",
    "results.tsv",
    "logs/",
    "__pycache__/",
    "*.pt",
    ".mat-description",  # where command agents leave the one-line description of their change
)
TEXT_CHUNK_CHARS = 4096  # document size when a plain-text corpus has no header lines to split on
VAL_ONE_IN = 10  # plain-text corpus: one document in ten (by hash of its name) is validation
_HEADER = re.compile(r"^--- source: (?P<source>.*?) \| (?:repo: (?P<repo>.*?) \| )?path: (?P<path>.*) ---$")


@dataclass
class Workspace:
    """Where a run's work tree is and how to run training in it (JSON-able through to_dict)."""

    path: Path
    kind: WorkspaceKind
    train_command: list[str]
    train_time_s: int  # autoresearch.train_time of the run
    env: dict[str, str] = field(default_factory=dict)
    branch: str = ""
    baseline_commit: str = ""
    evaluation: Evaluation = "summary"
    python: list[str] = field(default_factory=list)  # the interpreter for the scorer; mat's own when empty
    facts: dict[str, Any] = field(default_factory=dict)  # what set-up found, for run.json and the report only

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "path": str(self.path)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Workspace:
        values = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        facts = values.get("facts")
        values["facts"] = dict(facts) if isinstance(facts, dict) else {}  # informational only
        return cls(**{**values, "path": Path(values["path"])})


# ---------------------------------------------------------------- the corpus


def locate_corpus_jsonl(corpus_path: Path, scratch_dir: Path) -> Path:
    """The corpus.jsonl for a corpus dir, a corpus.jsonl, or a corpus.txt (converted when it has no jsonl)."""
    corpus_path = Path(corpus_path).expanduser()
    if corpus_path.is_dir():
        corpus_path = corpus_path / "corpus.jsonl"
        if not corpus_path.is_file() and (corpus_path.parent / "corpus.txt").is_file():
            corpus_path = corpus_path.parent / "corpus.txt"
    if not corpus_path.is_file():
        raise CorpusError(f"no corpus at {corpus_path}: run `mat ingest` first or pass the corpus directory")
    if corpus_path.suffix == ".jsonl":
        return corpus_path
    beside = corpus_path.with_name("corpus.jsonl")
    if beside.is_file():
        return beside
    return text_to_jsonl(corpus_path, scratch_dir / "corpus.jsonl")


def text_to_jsonl(text_path: Path, jsonl_path: Path) -> Path:
    """Split a plain-text corpus into corpus.jsonl records with a deterministic train/val split.

    Documents are cut at mat's header lines (`--- source: ... | path: ... ---`) when the text has any,
    otherwise into chunks of about TEXT_CHUNK_CHARS characters at line boundaries.
    """
    text = text_path.read_text(encoding="utf-8", errors="replace")
    documents = list(split_on_headers(text)) if any(map(_HEADER.match, text.splitlines())) else None
    if documents is None:
        documents = [("corpus", "", f"chunk-{i:05d}", chunk) for i, chunk in enumerate(chunk_text(text))]
    jsonl_path.parent.mkdir(parents=True, exist_ok=True)
    with jsonl_path.open("wb") as out:
        for source, repo, path, body in documents:
            out.write(orjson.dumps(text_record(source, repo, path, body), option=orjson.OPT_APPEND_NEWLINE))
    log.info("split %s into %d documents in %s", text_path, len(documents), jsonl_path)
    return jsonl_path


def split_on_headers(text: str) -> Iterator[tuple[str, str, str, str]]:
    """(source, repo, path, text) for each header-led document; text before the first header is dropped."""
    current: tuple[str, str, str] | None = None
    body: list[str] = []
    for line in text.splitlines(keepends=True):
        match = _HEADER.match(line.rstrip("\r\n"))
        if match is None:
            body.append(line)
            continue
        if current is not None:
            yield (*current, "".join(body))
        current, body = (match["source"], match["repo"] or "", match["path"]), []
    if current is not None:
        yield (*current, "".join(body))


def chunk_text(text: str, size: int = TEXT_CHUNK_CHARS) -> Iterator[str]:
    """Consecutive pieces of about `size` characters, cut after a newline where there is one."""
    start = 0
    while start < len(text):
        end = min(len(text), start + size)
        if end < len(text):
            newline = text.rfind("\n", start, end)
            end = newline + 1 if newline > start else end
        yield text[start:end]
        start = end


def text_record(source: str, repo: str, path: str, text: str) -> dict[str, Any]:
    """A corpus.jsonl record for one document cut from a plain-text corpus."""
    data = text.encode("utf-8")
    label = f"{repo or source}/{path}"
    split = "val" if xxhash.xxh64_intdigest(label.encode("utf-8")) % VAL_ONE_IN == 0 else "train"
    return {
        "source": source,
        "repo": repo,
        "commit": "",
        "path": path,
        "bytes": len(data),
        "sha": hashlib.sha1(data).hexdigest(),
        "split": split,
        "text": text,
    }


# ---------------------------------------------------------------- the work tree


def branch_for(run_tag: str) -> str:
    """`autoresearch/<run-tag>`, checked to be a valid branch name."""
    branch = BRANCH_PREFIX + run_tag
    if not gitops.is_valid_branch_name(branch):
        raise ConfigError(
            f"run name {run_tag!r} cannot be part of a git branch name; use letters, digits, '-', '_', '.'"
        )
    return branch


def write_gitignore(workspace: Path) -> None:
    """Add mat's ignore rules to the workspace's .gitignore, keeping any lines already there."""
    path = workspace / ".gitignore"
    existing = path.read_text(encoding="utf-8") if path.is_file() else ""
    missing = [line for line in IGNORED if line not in existing.splitlines()]
    if missing:
        prefix = existing if not existing or existing.endswith("\n") else existing + "\n"
        path.write_text(prefix + "\n".join(missing) + "\n", encoding="utf-8")


def new_workspace_dir(run_dir: Path) -> Path:
    """`<run_dir>/workspace`, which must not exist yet or be empty."""
    workspace = run_dir / WORKSPACE_DIR
    if workspace.exists() and any(workspace.iterdir()):
        raise ExperimentError(f"{workspace} already exists; start a new run or resume this one")
    return workspace


def program_md_path(cfg: AutoresearchConfig) -> Path | None:
    """autoresearch.program_md as a path, when set."""
    return Path(cfg.program_md).expanduser() if cfg.program_md else None


def train_command_for(kind: WorkspaceKind, workspace: Path) -> list[str]:
    """How training runs in a workspace of this kind: derived again, never read back from run.json."""
    if kind == "autoresearch":
        from multiagenttrainer.workspace.autoresearch import choose_interpreter

        return list(choose_interpreter(workspace).train)
    return [sys.executable, "train.py"]


def python_for(kind: WorkspaceKind, workspace: Path) -> list[str]:
    """The interpreter of a workspace of this kind (for the scorer): derived, like train_command_for."""
    if kind == "autoresearch":
        from multiagenttrainer.workspace.autoresearch import choose_interpreter

        return list(choose_interpreter(workspace).python)
    return [sys.executable]


def reopen_workspace(run_dir: Path, record: Mapping[str, Any]) -> Workspace:
    """The workspace a run recorded, before anything runs in it again (run.json is not trusted): it is
    always the run directory's own `workspace/` (so a moved run still resumes), of a known kind and
    evaluation, and its commands are derived again rather than taken from the file."""
    try:
        workspace = Workspace.from_dict({**record, "path": str(Path(run_dir).absolute() / WORKSPACE_DIR)})
    except (KeyError, TypeError, ValueError) as exc:
        raise ExperimentError(f"{run_dir}/run.json: its workspace record is damaged ({exc})") from None
    if workspace.kind not in ("builtin", "autoresearch") or workspace.evaluation not in EVALUATIONS:
        raise ExperimentError(
            f"{run_dir}/run.json: unknown workspace kind {workspace.kind!r} or evaluation "
            f"{workspace.evaluation!r}; the file was changed, so the run is not resumed"
        )
    workspace.train_command = train_command_for(workspace.kind, workspace.path)
    workspace.python = python_for(workspace.kind, workspace.path)
    return workspace


def setup_builtin(
    workspace: Path, corpus_jsonl: Path, cfg: AutoresearchConfig, branch: str, run_dir: Path
) -> tuple[list[str], list[Path], dict[str, Any]]:
    """Render the built-in template and its data into a new repository; return the training command,
    the data directories of the evaluator and the set-up's facts."""
    gitops.init_repo(workspace, branch)
    render_template(workspace, cfg.train_time, program_md_path(cfg))
    stats = write_builtin_data(corpus_jsonl, workspace / "data", (run_dir / HOLDOUT_REL).parent)
    log.info("built-in workspace data: %s", stats)
    return train_command_for("builtin", workspace), [workspace / "data"], builtin_facts(stats, workspace)


def builtin_facts(stats: Mapping[str, Any], workspace: Path) -> dict[str, Any]:
    """The built-in workspace's data (one token per byte; validation: the split mat scores on, held out of
    the workspace when it scores independently) and how many tokens a step trains on."""
    from multiagenttrainer.workspace.autoresearch import read_constants

    constants = read_constants((workspace / "train.py").read_text(encoding="utf-8"))
    batch, seq_len = constants.get("BATCH_SIZE"), constants.get("SEQ_LEN")
    per_step = batch * seq_len if isinstance(batch, int) and isinstance(seq_len, int) else 0
    held_out = "holdout" if "holdout_bytes" in stats else "val"  # what mat scores on: the held-out split
    return {
        "train_documents": stats.get("train_documents", 0),
        "val_documents": stats.get(f"{held_out}_documents", 0),
        "train_tokens": stats.get("train_bytes", 0),
        "val_tokens": stats.get(f"{held_out}_bytes", 0),
        "tokens_per_step": per_step,
        "notes": [stats["note"]] if stats.get("note") else [],
    }


AUTORESEARCH_FACTS = {  # AutoresearchSetup field -> fact
    "repo": "repo",
    "branch": "branch",
    "commit": "commit",
    "train_shards": "train_shards",
    "train_documents": "train_documents",
    "val_documents": "val_documents",
    "train_chunks": "train_rows",
    "val_chunks": "val_rows",
    "train_tokens": "train_tokens",
    "val_tokens": "val_tokens",
    "tokens_per_step": "tokens_per_step",
    "recut_documents": "recut_documents",
    "rows_over_limit": "rows_over_limit",
    "notes": "notes",
}


def evaluator_files(workspace: Path, data_dirs: list[Path], run_dir: Path, kind: WorkspaceKind) -> list[Path]:
    """prepare.py, every file of the data directories and, for the built-in, the held-out split."""
    files = [workspace / "prepare.py"]
    for directory in data_dirs:
        files += [directory / rel for rel, e in worktree.scan(directory).items() if e.kind == "file"]
    return files + ([run_dir / HOLDOUT_REL] if kind == "builtin" else [])


GITHUB_TOKEN_ENV = "GITHUB_TOKEN"
FIXED_STEPS_ENV = "MAT_FIXED_STEPS"  # the built-in template trains exactly this many steps when it is set


def clone_credentials(
    repo: str | None, github: GithubConfig, env: Mapping[str, str]
) -> GitCredentials | None:
    """GITHUB_TOKEN as credentials for autoresearch.repo (a private fork), only when the repository is on
    the configured GitHub host, so the token never goes anywhere else."""
    if not repo:
        return None
    return github_credentials(SourceContext(github=github, env=env), repo, GITHUB_TOKEN_ENV)


def setup_autoresearch(
    workspace: Path,
    corpus_jsonl: Path,
    cfg: AutoresearchConfig,
    branch: str,
    run_dir: Path,
    credentials: GitCredentials | None = None,
) -> AutoresearchCommands:
    """Clone real autoresearch with the corpus injected, then branch; return its commands and data."""
    from multiagenttrainer.workspace.autoresearch import prepare_autoresearch_workspace

    prepared = prepare_autoresearch_workspace(cfg, corpus_jsonl, workspace, run_dir, credentials=credentials)
    for note in getattr(prepared, "notes", []):
        log.info("autoresearch workspace: %s", note)
    gitops.configure_repo(workspace)
    gitops.create_branch(workspace, branch)
    recorded = prepared.to_dict()
    return AutoresearchCommands(
        list(prepared.train_command),
        dict(prepared.env),
        list(prepared.python),
        [Path(prepared.data_dir), Path(prepared.tokenizer_dir)],
        {fact: recorded[name] for name, fact in AUTORESEARCH_FACTS.items()},
    )


@dataclass(frozen=True)
class AutoresearchCommands:
    """How to train and score in a prepared autoresearch workspace, and where its data lives."""

    train: list[str]
    env: dict[str, str]
    python: list[str]
    data_dirs: list[Path]
    facts: dict[str, Any]


def setup_workspace(
    run_dir: Path,
    corpus_path: Path,
    autoresearch_cfg: AutoresearchConfig,
    *,
    run_tag: str,
    env: dict[str, str] | None = None,
    credentials: GitCredentials | None = None,
) -> Workspace:
    """Create `<run_dir>/workspace` on branch autoresearch/<run_tag> with a "baseline" commit.

    `credentials`: for cloning autoresearch.repo when it is a private repository.
    """
    run_dir = Path(run_dir).absolute()
    workspace = new_workspace_dir(run_dir)
    branch = branch_for(run_tag)
    corpus_jsonl = locate_corpus_jsonl(Path(corpus_path), run_dir / "corpus")
    base_env = {"PYTHONUNBUFFERED": "1"}
    evaluation: Evaluation = "independent"
    python = [sys.executable]
    if autoresearch_cfg.repo:
        commands = setup_autoresearch(workspace, corpus_jsonl, autoresearch_cfg, branch, run_dir, credentials)
        kind: WorkspaceKind = "autoresearch"
        command, data_dirs, python = commands.train, commands.data_dirs, commands.python
        base_env.update(commands.env)
        evaluation = "independent" if autoresearch_cfg.verify else "summary"
        facts = commands.facts
    else:
        command, data_dirs, facts = setup_builtin(workspace, corpus_jsonl, autoresearch_cfg, branch, run_dir)
        kind = "builtin"
        if autoresearch_cfg.fixed_steps is not None:  # the template's train.py reads it (prepare.fixed_steps)
            base_env[FIXED_STEPS_ENV] = str(autoresearch_cfg.fixed_steps)
    write_gitignore(workspace)
    baseline = gitops.commit_paths(workspace, BASELINE_MESSAGE, allow_empty=True)
    record_evaluator(run_dir, workspace, evaluator_files(workspace, data_dirs, run_dir, kind), data_dirs)
    return Workspace(
        path=workspace,
        kind=kind,
        train_command=command,
        env={**base_env, **(env or {})},
        train_time_s=autoresearch_cfg.train_time,
        branch=branch,
        baseline_commit=baseline,
        evaluation=evaluation,
        python=python,
        facts=facts,
    )
