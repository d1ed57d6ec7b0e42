"""Set up a workspace from a real karpathy/autoresearch checkout (or a fork) and inject the corpus into it.

autoresearch's prepare.py reads only two things at run time: parquet shards in DATA_DIR and the tokenizer
in TOKENIZER_DIR, both under CACHE_DIR. So the corpus goes in through that cache, and how training works
is left alone:

    autoresearch.repo @ branch --clone--> workspace/          (a normal work tree, depth 1, one branch)
    workspace/prepare.py: CACHE_DIR -> <run_dir>/cache/autoresearch, TIME_BUDGET -> autoresearch.train_time
    workspace/prepare.py: download functions -> raise          (the data and tokenizer are fixed inputs)
    workspace/program.md <- autoresearch.program_md, else mat's description of the workspace
                            (paths, budget, the command mat runs: autoresearch_program.py)
    corpus.jsonl --chunk--> DATA_DIR/shard_00000.parquet ...  (train: every parquet but the val one)
                            DATA_DIR/shard_06542.parquet      (val: VAL_FILENAME, pinned)
    train_tokenizer() in the workspace --> TOKENIZER_DIR/tokenizer.pkl, token_bytes.pt
    every row counted with that tokenizer --> the shards written again, documents with a row over
                                              MAX_SEQ_LEN tokens cut finer (autoresearch_data.TokenPlan)

Why the CACHE_DIR line is rewritten instead of HOME: the real line is
`os.path.join(os.path.expanduser("~"), ".cache", "autoresearch")`, so every run on a machine would share
one cache and two runs with different corpora would overwrite each other's shards and tokenizer. Pointing
HOME elsewhere would also move the coding agent's own config and the Hugging Face kernel cache that
train.py downloads into; rewriting one line keeps the change visible in the workspace and nothing else moves.

The edits to prepare.py and program.md are left uncommitted: the caller makes the baseline commit.
"""

from __future__ import annotations

import ast
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from dulwich.repo import Repo

from multiagenttrainer.config import AutoresearchConfig
from multiagenttrainer.errors import ConfigError, CorpusError, ExperimentError
from multiagenttrainer.processes import start_in_session, start_logged, stop_group
from multiagenttrainer.sources.git import (
    GitCredentials,
    GitFetchError,
    clone_or_update,
    ls_remote,
    redact_url,
)
from multiagenttrainer.workspace.autoresearch_data import (
    CHARS_PER_TOKEN,
    MIN_RECUT_CHARS,
    SHARD_MAX_CHARS,
    ShardStats,
    TokenCounter,
    TokenPlan,
    chunk_chars_for,
    plan_token_budgets,
    write_corpus_shards,
)
from multiagenttrainer.workspace.autoresearch_program import WorkspaceFacts, render_program_md

DEFAULT_MAX_SEQ_LEN = 2048  # autoresearch's value, used when prepare.py does not say
DEFAULT_VAL_FILENAME = "shard_06542.parquet"
CACHE_SUBDIR = Path("cache") / "autoresearch"
TOKENIZER_FILES = ("tokenizer.pkl", "token_bytes.pt")
TRAIN_TOKENIZER_CODE = "from prepare import train_tokenizer; train_tokenizer()"
# argv: texts.jsonl (one JSON string a line), counts.txt (one token count a line, BOS not included)
COUNT_TOKENS_CODE = """\
import json, sys
from prepare import Tokenizer
tokenizer = Tokenizer.from_directory()
with open(sys.argv[1], encoding="utf-8") as texts, open(sys.argv[2], "w", encoding="utf-8") as out:
    batch = []
    for line in texts:
        batch.append(json.loads(line))
        if len(batch) == 1024:
            out.writelines(f"{len(ids)}\\n" for ids in tokenizer.encode(batch))
            batch = []
    if batch:
        out.writelines(f"{len(ids)}\\n" for ids in tokenizer.encode(batch))
"""
TOKENIZER_TIMEOUT_S = 3600.0  # rustbpe over up to 1e9 characters takes minutes, not hours
CLONE_TIMEOUT_S = 120.0
LOG_TAIL_LINES = 40
EXPECTED_CACHE_LINE = 'CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "autoresearch")'


@dataclass
class AutoresearchSetup:
    """How to train in a prepared autoresearch workspace, and what went into its cache."""

    train_command: list[str]
    env: dict[str, str]
    notes: list[str]
    repo: str  # without credentials
    branch: str
    commit: str  # the cloned commit, full SHA
    cache_dir: str
    data_dir: str
    tokenizer_dir: str
    max_seq_len: int
    chunk_chars: int  # upper bound on the characters of one parquet row
    train_shards: int
    train_documents: int
    val_documents: int
    val_carved_documents: int  # train documents moved to val because the corpus had (almost) no val split
    train_chunks: int  # rows in the train shards
    val_chunks: int  # rows in the val shard
    train_chars: int
    val_chars: int
    tokenizer_seconds: float
    train_tokens: int = 0  # the train rows' tokens (one BOS each), counted with the trained tokenizer
    val_tokens: int = 0
    recut_documents: int = 0  # documents cut finer because a row had more than MAX_SEQ_LEN tokens
    rows_over_limit: int = 0  # rows still over MAX_SEQ_LEN tokens (only at MIN_RECUT_CHARS)
    tokens_per_step: int = (
        0  # from train.py's TOTAL_BATCH_SIZE (or DEVICE_BATCH_SIZE x MAX_SEQ_LEN); 0: unknown
    )
    changed_files: list[str] = field(default_factory=list)  # edited by set-up, not yet committed
    python: list[str] = field(default_factory=list)  # how to run Python there (the scorer, snippets)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------- reading prepare.py's constants


def read_constants(source: str) -> dict[str, Any]:
    """Top-level `NAME = <expr>` values of a module that can be computed without running it.

    Understands literals, earlier names, arithmetic, f-strings and os.path.join, which covers
    autoresearch's `EVAL_TOKENS = 40 * 524288` and `VAL_FILENAME = f"shard_{VAL_SHARD:05d}.parquet"`.
    """
    values: dict[str, Any] = {}
    for node in ast.parse(source).body:
        target = _assigned_name(node)
        if target is None or not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
            continue
        try:
            values[target] = _evaluate(node.value, values)
        except (ValueError, TypeError, ArithmeticError):
            values.pop(target, None)  # a later, unknown value hides an earlier known one
    return values


def _assigned_name(node: ast.stmt) -> str | None:
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    return None


_BINARY_OPS: dict[type[ast.operator], Any] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a**b if abs(b) <= 64 else math.nan,
}


def _evaluate(node: ast.expr, known: dict[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in known:
        return known[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand, known)
        return -value if isinstance(node.op, ast.USub) else +value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPS:
        return _BINARY_OPS[type(node.op)](_evaluate(node.left, known), _evaluate(node.right, known))
    if isinstance(node, ast.JoinedStr):
        return "".join(str(_evaluate(part, known)) for part in node.values)
    if isinstance(node, ast.FormattedValue) and node.conversion == -1:
        spec = "" if node.format_spec is None else _evaluate(node.format_spec, known)
        return format(_evaluate(node.value, known), spec)
    if isinstance(node, ast.Call) and ast.unparse(node.func) == "os.path.join" and not node.keywords:
        return os.path.join(*(_evaluate(arg, known) for arg in node.args))
    raise ValueError(f"cannot evaluate {ast.unparse(node)}")


# ---------------------------------------------------------------- editing prepare.py


def replace_assignment(source: str, name: str, code: str, prepare_py: Path, expected: str) -> str:
    """Replace the value of the one top-level `name = ...` in `source`, up to the end of its line, by `code`.

    The old trailing comment goes too (the real TIME_BUDGET line says "(5 minutes)"); `code` brings its own.
    """
    matches = [node for node in ast.parse(source).body if _assigned_name(node) == name]
    if len(matches) != 1 or not isinstance(matches[0], ast.Assign):
        raise ExperimentError(
            f"{prepare_py} has {len(matches)} top-level `{name} = ...` assignments, expected exactly one "
            f"like `{expected}`; mat rewrites that line, so use karpathy/autoresearch or a fork that keeps it"
        )
    value = matches[0].value
    lines = source.encode("utf-8").splitlines(keepends=True)  # ast offsets count UTF-8 bytes
    start = sum(len(line) for line in lines[: value.lineno - 1]) + value.col_offset
    last_line = lines[(value.end_lineno or value.lineno) - 1]
    end = sum(len(line) for line in lines[: value.end_lineno or value.lineno]) - _terminator_len(last_line)
    data = source.encode("utf-8")
    return (data[:start] + code.encode("utf-8") + data[end:]).decode("utf-8")


def _terminator_len(line: bytes) -> int:
    return len(line) - len(line.rstrip(b"\r\n"))


def point_cache_at(source: str, cache_dir: Path, prepare_py: Path) -> str:
    """Make prepare.py's CACHE_DIR the absolute `cache_dir` instead of ~/.cache/autoresearch."""
    code = f"{str(cache_dir)!r}  # set by mat: one cache per run, so concurrent runs never share data"
    return replace_assignment(source, "CACHE_DIR", code, prepare_py, EXPECTED_CACHE_LINE)


def set_train_time(source: str, train_time_s: int, prepare_py: Path) -> str:
    """Make prepare.py's TIME_BUDGET `train_time_s` seconds."""
    code = f"{train_time_s}  # training time budget in seconds (set by mat from autoresearch.train_time)"
    return replace_assignment(source, "TIME_BUDGET", code, prepare_py, "TIME_BUDGET = 300")


DOWNLOAD_DISABLED = (
    "downloads are disabled in this workspace by mat: the data directory and the tokenizer are fixed "
    "inputs made from your corpus (see program.md); do not run prepare.py"
)


def disable_downloads(source: str) -> tuple[str, list[str]]:
    """(source, names): every top-level function whose name contains "download" made to raise at once.

    autoresearch's `download_single_shard` and `download_data` fetch ClimbMix shards into DATA_DIR; in a
    workspace mat prepared, running them would mix web text into the corpus. Each is replaced, decorators
    and all, by `def <name>(*args, **kwargs): raise RuntimeError(...)`.
    """
    functions = [
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and "download" in node.name.lower()
    ]
    lines = source.splitlines(keepends=True)
    newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    for node in sorted(functions, key=lambda n: n.lineno, reverse=True):
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
        body = f"    raise RuntimeError({DOWNLOAD_DISABLED!r}){newline}"
        stub = f"def {node.name}(*args, **kwargs):{newline}{body}"
        lines[first : node.end_lineno or node.lineno] = [stub]
    return "".join(lines), sorted(node.name for node in functions)


# ---------------------------------------------------------------- cloning


def repo_location(repo: str) -> str:
    """A URL as given; a local path made absolute (it must exist)."""
    if "://" in repo or (":" in repo.split("/", 1)[0] and not Path(repo).exists()):  # URL or user@host:path
        return repo
    path = Path(repo).expanduser().resolve()
    if not path.exists():
        raise ConfigError(
            f"autoresearch.repo: {path} does not exist; give a git URL or the path of a checkout"
        )
    return str(path)


def clone_workspace(
    location: str, branch: str, workspace: Path, credentials: GitCredentials | None = None
) -> str:
    """Clone one branch of `location` into `workspace` as a work tree (depth 1); return the commit SHA.

    `credentials` (a token for a private fork) go to the server only, never into the clone's config.
    """
    where = redact_url(location)
    try:
        refs, _ = ls_remote(location, credentials, CLONE_TIMEOUT_S)
    except GitFetchError as exc:
        raise clone_error(where, exc) from exc
    if f"refs/heads/{branch}".encode() not in refs:
        heads = sorted(r.decode().removeprefix("refs/heads/") for r in refs if r.startswith(b"refs/heads/"))
        raise ConfigError(
            f"autoresearch.branch: {branch!r} is not a branch of {where} "
            f"(branches: {', '.join(heads[:10]) or 'none'}); set autoresearch.branch to one of them"
        )
    try:
        _, sha = clone_or_update(location, workspace / ".git", branch, credentials, CLONE_TIMEOUT_S)
    except GitFetchError as exc:
        raise clone_error(where, exc) from exc
    check_out(workspace)
    return sha


def clone_error(where: str, exc: GitFetchError) -> ConfigError | ExperimentError:
    """A wrong URL is a config problem; a network hiccup is a failed run that may be retried."""
    if exc.transient:
        return ExperimentError(f"cannot clone autoresearch.repo {where}: {exc}")
    return ConfigError(f"autoresearch.repo: cannot clone {where}: {exc}; fix autoresearch.repo")


def check_out(workspace: Path) -> None:
    """Turn the bare clone in workspace/.git into a work tree that git and agents can use."""
    try:
        with Repo(str(workspace)) as repo:
            config = repo.get_config()
            config.set((b"core",), b"bare", False)
            config.write_to_path()
            repo.get_worktree().reset_index()
    except (OSError, KeyError, ValueError) as exc:
        raise ExperimentError(f"cannot check out the autoresearch clone in {workspace}: {exc}") from exc


# ---------------------------------------------------------------- tokenizer and commands


@dataclass(frozen=True)
class Interpreter:
    """How to run Python in the workspace: `python` for snippets, `train` for a training run."""

    python: list[str]
    train: list[str]
    note: str


def choose_interpreter(workspace: Path) -> Interpreter:
    """uv when the workspace is a uv project and uv is installed, else mat's own interpreter.

    The real repository pins its dependencies with uv (uv.lock; torch from a CUDA index), and program.md
    runs `uv run train.py`; when uv is installed and the workspace is a uv project, mat does the same.
    Otherwise it uses its own interpreter, which then needs autoresearch's dependencies installed.
    """
    uv = shutil.which("uv")
    is_uv_project = (workspace / "uv.lock").is_file() or "[tool.uv" in _read_text(
        workspace / "pyproject.toml"
    )
    if uv and is_uv_project:
        note = "training runs with `uv run train.py`, as autoresearch's program.md does"
        return Interpreter(["uv", "run", "python"], ["uv", "run", "train.py"], note)
    reason = "uv is not installed" if is_uv_project else "the workspace is not a uv project"
    note = (
        f"training runs with {sys.executable} because {reason}; that interpreter needs the packages "
        "listed in the workspace's pyproject.toml"
    )
    return Interpreter([sys.executable], [sys.executable, "train.py"], note)


def _read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def retrain_tokenizer(
    workspace: Path, python: list[str], tokenizer_dir: Path, log_path: Path, timeout_s: float
) -> float:
    """Delete the tokenizer files and run prepare.train_tokenizer() in the workspace; return seconds."""
    for name in TOKENIZER_FILES:
        (tokenizer_dir / name).unlink(missing_ok=True)  # a stale tokenizer would be reused silently
    command = [*python, "-c", TRAIN_TOKENIZER_CODE]
    started = time.monotonic()
    process = start_logged(command, workspace, log_path)
    try:
        code = process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_group(process.pid, process, grace_s=0.0)  # the whole group: nothing keeps running
        process.wait()
        raise ExperimentError(
            f"training the tokenizer in {workspace} took over {timeout_s:.0f} s and was stopped; "
            f"see {log_path}\n{log_tail(log_path)}"
        ) from None
    missing = [name for name in TOKENIZER_FILES if not (tokenizer_dir / name).is_file()]
    if code != 0 or missing:
        problem = f"exited with code {code}" if code != 0 else f"did not write {', '.join(missing)}"
        raise ExperimentError(
            f"training the tokenizer in {workspace} ({' '.join(command[:-1])} ...) {problem}; "
            f"see {log_path}\n{log_tail(log_path)}"
        )
    return time.monotonic() - started


def run_snippet(command: list[str], workspace: Path, log_path: Path, timeout_s: float, what: str) -> None:
    """Run a Python snippet in the workspace, output appended to `log_path`; ExperimentError if it fails."""
    with log_path.open("ab") as log:
        process = start_in_session(command, workspace, log)
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_group(process.pid, process, grace_s=0.0)
            process.wait()
            code = None
    if code != 0:
        problem = f"took over {timeout_s:.0f} s" if code is None else f"exited with code {code}"
        raise ExperimentError(f"{what} in {workspace} {problem}; see {log_path}\n{log_tail(log_path)}")


def token_counter(workspace: Path, python: list[str], log_path: Path, timeout_s: float) -> TokenCounter:
    """Counts tokens with the workspace's own tokenizer (prepare.Tokenizer), in its interpreter."""

    def count(texts: Path, counts: Path) -> None:
        command = [*python, "-c", COUNT_TOKENS_CODE, str(texts), str(counts)]
        run_snippet(command, workspace, log_path, timeout_s, "counting tokens with the trained tokenizer")

    return count


def cut_by_tokens(
    workspace: Path,
    python: list[str],
    corpus_jsonl: Path,
    layout: CacheLayout,
    chunk_chars: int,
    run_dir: Path,
    timeout_s: float,
) -> TokenPlan | None:
    """The token plan for the corpus (autoresearch_data.plan_token_budgets), or None with a note."""
    counter = token_counter(workspace, python, run_dir / "logs" / "prepare.log", timeout_s)
    with tempfile.TemporaryDirectory(prefix="tokens-", dir=run_dir) as scratch:
        try:
            return plan_token_budgets(corpus_jsonl, chunk_chars, layout.max_seq_len, counter, Path(scratch))
        except (ExperimentError, CorpusError, ValueError) as exc:
            layout.notes.append(
                f"rows were cut at {CHARS_PER_TOKEN} characters per token, not counted: {exc}".splitlines()[0]
            )
            return None


def tokens_per_step(workspace: Path, max_seq_len: int) -> int:
    """Tokens one optimizer step trains on, from train.py's constants; 0 when they are not readable."""
    try:
        constants = read_constants((workspace / "train.py").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError):
        return 0
    total = constants.get("TOTAL_BATCH_SIZE")
    if isinstance(total, int) and total > 0:
        return total
    batch = constants.get("DEVICE_BATCH_SIZE")
    return batch * max_seq_len if isinstance(batch, int) and batch > 0 else 0


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file (progress lines written with \\r count as lines)."""
    text = path.read_bytes().decode("utf-8", "replace") if path.is_file() else ""
    return "\n".join(text.splitlines()[-lines:])


# ---------------------------------------------------------------- public API


@dataclass(frozen=True)
class CacheLayout:
    """Where the workspace's prepare.py looks for data, read from its constants after the edit."""

    max_seq_len: int
    val_filename: str
    data_dir: Path
    tokenizer_dir: Path
    notes: list[str]
    disabled: list[str] = field(default_factory=list)  # prepare.py's download functions, now raising


def prepare_autoresearch_workspace(
    cfg: AutoresearchConfig,
    corpus_jsonl: Path,
    workspace: Path,
    run_dir: Path,
    *,
    credentials: GitCredentials | None = None,
    shard_max_chars: int = SHARD_MAX_CHARS,
    tokenizer_timeout_s: float = TOKENIZER_TIMEOUT_S,
) -> AutoresearchSetup:
    """Clone autoresearch into `workspace`, fill a per-run cache with the corpus and retrain its tokenizer."""
    repo, program_md = check_settings(cfg, workspace)
    location = repo_location(repo)
    commit = clone_into_empty(location, cfg.branch, workspace, credentials)
    cache_dir = (run_dir / CACHE_SUBDIR).resolve()
    layout = edit_prepare(workspace, cache_dir, cfg.train_time)
    interpreter = choose_interpreter(workspace)
    layout.notes.append(interpreter.note)
    filled = fill_cache(
        corpus_jsonl, workspace, run_dir, layout, interpreter.python, shard_max_chars, tokenizer_timeout_s
    )
    facts = WorkspaceFacts(
        redact_url(location),
        cfg.branch,
        commit,
        layout.data_dir,
        layout.val_filename,
        filled.stats.train_shards,
        layout.tokenizer_dir,
        cfg.train_time,
        interpreter.train,
    )
    write_program_md(workspace, program_md, facts)
    return AutoresearchSetup(
        train_command=interpreter.train,
        env={"PYTHONUNBUFFERED": "1"},
        notes=list(layout.notes),
        repo=redact_url(location),
        branch=cfg.branch,
        commit=commit,
        cache_dir=str(cache_dir),
        data_dir=str(layout.data_dir),
        tokenizer_dir=str(layout.tokenizer_dir),
        max_seq_len=layout.max_seq_len,
        chunk_chars=filled.chunk_chars,
        tokenizer_seconds=round(filled.tokenizer_seconds, 2),
        changed_files=["prepare.py", "program.md"],
        recut_documents=len(filled.plan.budgets) if filled.plan else 0,
        rows_over_limit=filled.plan.over_limit if filled.plan else 0,
        tokens_per_step=tokens_per_step(workspace, layout.max_seq_len),
        python=interpreter.python,
        **asdict(filled.stats),
    )


@dataclass(frozen=True)
class FilledCache:
    """What fill_cache wrote: the shards' counts, the token plan (None: not counted), the tokenizer's time."""

    stats: ShardStats
    plan: TokenPlan | None
    chunk_chars: int
    tokenizer_seconds: float


def fill_cache(
    corpus_jsonl: Path,
    workspace: Path,
    run_dir: Path,
    layout: CacheLayout,
    python: list[str],
    shard_max_chars: int,
    timeout_s: float,
) -> FilledCache:
    """Shards cut at CHARS_PER_TOKEN, the tokenizer trained on them, then the shards written again with
    every row within MAX_SEQ_LEN tokens as that tokenizer counts them. Notes go to `layout.notes`."""
    chunk_chars = chunk_chars_for(layout.max_seq_len)
    write = partial(write_corpus_shards, corpus_jsonl, layout.data_dir, layout.val_filename, chunk_chars)
    stats = write(shard_max_chars)
    if stats.val_carved_documents:
        layout.notes.append(
            f"the corpus had no val split; {stats.val_carved_documents} documents were chosen by hash"
        )
    log_path = run_dir / "logs" / "prepare.log"
    seconds = retrain_tokenizer(workspace, python, layout.tokenizer_dir, log_path, timeout_s)
    plan = cut_by_tokens(workspace, python, corpus_jsonl, layout, chunk_chars, run_dir, timeout_s)
    if plan is not None:  # the same text, cut again where a row had too many tokens
        stats = write(shard_max_chars, plan)
        layout.notes.extend(token_notes(plan, layout.max_seq_len))
    return FilledCache(stats, plan, chunk_chars, seconds)


def token_notes(plan: TokenPlan, max_seq_len: int) -> list[str]:
    """What the token count changed, for the set-up's notes."""
    notes = []
    if plan.budgets:
        notes.append(
            f"{len(plan.budgets)} documents had a row over {max_seq_len} tokens (counted with the trained "
            "tokenizer) and were cut finer"
        )
    if plan.over_limit:
        notes.append(
            f"{plan.over_limit} rows are still over {max_seq_len} tokens at {MIN_RECUT_CHARS} characters "
            "(text of many tokens per character); autoresearch's loader crops them"
        )
    return notes


def write_program_md(workspace: Path, given: Path | None, facts: WorkspaceFacts) -> None:
    """The user's autoresearch.program_md as it is, else mat's description of this workspace."""
    if given is not None:
        shutil.copyfile(given, workspace / "program.md")
    else:
        (workspace / "program.md").write_text(render_program_md(facts), encoding="utf-8")


def check_settings(cfg: AutoresearchConfig, workspace: Path) -> tuple[str, Path | None]:
    """(repo, program.md path) once the settings and the workspace directory are usable."""
    if not cfg.repo:
        raise ConfigError("autoresearch.repo is not set; give the URL or path of an autoresearch checkout")
    program_md = Path(cfg.program_md).expanduser() if cfg.program_md else None
    if program_md is not None and not program_md.is_file():
        raise ConfigError(
            f"autoresearch.program_md: {program_md} is not a file; fix the path or remove the key"
        )
    if workspace.exists() and any(workspace.iterdir()):
        raise ExperimentError(
            f"workspace {workspace} already exists and is not empty; use a new run directory"
        )
    return cfg.repo, program_md


def clone_into_empty(
    location: str, branch: str, workspace: Path, credentials: GitCredentials | None = None
) -> str:
    """clone_workspace, removing the workspace again when the clone fails, so a retry starts clean."""
    workspace.mkdir(parents=True, exist_ok=True)
    try:
        return clone_workspace(location, branch, workspace, credentials)
    except BaseException:
        shutil.rmtree(workspace, ignore_errors=True)
        raise


def edit_prepare(workspace: Path, cache_dir: Path, train_time_s: int) -> CacheLayout:
    """Rewrite CACHE_DIR and TIME_BUDGET in the workspace's prepare.py; return where it now reads data."""
    prepare_py = workspace / "prepare.py"
    if not prepare_py.is_file():
        raise ExperimentError(
            f"{prepare_py} does not exist: autoresearch.repo must be karpathy/autoresearch or a fork "
            "with its prepare.py at the top level"
        )
    try:
        source = prepare_py.read_bytes().decode("utf-8")  # bytes: keep the file's own line endings
        source = set_train_time(point_cache_at(source, cache_dir, prepare_py), train_time_s, prepare_py)
        source, disabled = disable_downloads(source)
    except (SyntaxError, UnicodeDecodeError) as exc:
        raise ExperimentError(f"{prepare_py} is not valid Python ({exc}); check autoresearch.branch") from exc
    prepare_py.write_bytes(source.encode("utf-8"))
    layout = cache_layout(read_constants(source), cache_dir)
    if disabled:
        layout.notes.append(f"downloads disabled in prepare.py ({', '.join(disabled)} raise)")
    return replace(layout, disabled=disabled)


def cache_layout(constants: dict[str, Any], cache_dir: Path) -> CacheLayout:
    """The data locations and sizes prepare.py defines; autoresearch's defaults where it does not say."""
    notes: list[str] = []

    def constant(name: str, kind: type, default: Any) -> Any:
        value = constants.get(name)
        if isinstance(value, kind) and not isinstance(value, bool):
            return value
        notes.append(f"prepare.py has no readable {name}; assumed {default!r}")
        return default

    return CacheLayout(
        max_seq_len=constant("MAX_SEQ_LEN", int, DEFAULT_MAX_SEQ_LEN),
        val_filename=constant("VAL_FILENAME", str, DEFAULT_VAL_FILENAME),
        data_dir=Path(constant("DATA_DIR", str, str(cache_dir / "data"))),
        tokenizer_dir=Path(constant("TOKENIZER_DIR", str, str(cache_dir / "tokenizer"))),
        notes=notes,
    )
