"""results.tsv, byte-compatible with karpathy/autoresearch, so its analysis notebook reads our files.

    commit	val_bpb	memory_gb	status	description
    a1b2c3d	2.443905	0.4	keep	baseline
    c3d4e5f	0.000000	0.0	crash	remove layer norm

Rows are appended with one `write` on an O_APPEND descriptor followed by fsync, so a row is never
interleaved with another writer's and a kill leaves whole rows. A torn last line (a machine crash, or an
agent writing the file itself) is cut away by `read_results` before anything else is appended.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from multiagenttrainer.atomic import write_bytes_atomically
from multiagenttrainer.errors import ExperimentError
from multiagenttrainer.history import ExperimentResult, Status

RESULTS_FILE = "results.tsv"  # in the run directory, linked into the workspace
MAX_ROW_BYTES = 1 << 20  # a torn row longer than this is not a row mat wrote
RESULTS_HEADER = "commit\tval_bpb\tmemory_gb\tstatus\tdescription"
STATUSES: frozenset[str] = frozenset({"keep", "discard", "crash"})
SHORT_SHA = 7


@dataclass(frozen=True)
class ResultRow:
    """One data row of results.tsv. `val_bpb` is None for a crash (written as 0.000000)."""

    commit: str
    val_bpb: float | None
    memory_gb: float
    status: Status
    description: str


def clean_description(text: str) -> str:
    """A description on one line: tabs, carriage returns and newlines become spaces."""
    return text.replace("\t", " ").replace("\r", " ").replace("\n", " ").strip()


def format_row(result: ExperimentResult | ResultRow) -> str:
    """One results.tsv line (with its newline) exactly as autoresearch writes it."""
    crashed = result.status == "crash" or result.val_bpb is None or not math.isfinite(result.val_bpb)
    val_bpb = 0.0 if crashed or result.val_bpb is None else result.val_bpb
    memory_gb = 0.0 if crashed else result.memory_gb
    fields = (
        result.commit[:SHORT_SHA],
        f"{val_bpb:.6f}",
        f"{memory_gb:.1f}",
        result.status,
        clean_description(result.description),
    )
    return "\t".join(fields) + "\n"


def parse_row(line: str) -> ResultRow | None:
    """A data line as a ResultRow; None for the header, a blank line or a line that is not a row."""
    fields = line.rstrip("\r\n").split("\t", 4)
    if len(fields) < 4 or fields[0] == "commit":
        return None
    commit, val_text, memory_text, status = (field.strip() for field in fields[:4])
    if status not in STATUSES or not commit:
        return None
    try:
        val_bpb, memory_gb = float(val_text), float(memory_text)
    except ValueError:
        return None
    crashed = status == "crash" or not math.isfinite(val_bpb)
    description = fields[4].strip() if len(fields) == 5 else ""
    return ResultRow(commit, None if crashed else val_bpb, memory_gb, status, description)  # type: ignore[arg-type]


def parse_rows(text: str) -> list[ResultRow]:
    """Every data row in a results.tsv text, skipping the header and lines that are not rows."""
    return [row for row in map(parse_row, text.splitlines()) if row is not None]


class ResultsTableError(ExperimentError):
    """results.tsv holds something that is not autoresearch's table; mat will not cut or guess."""


def torn_tail(data: bytes) -> int | None:
    """Where a torn last row starts (no newline after it), or None when there is none.

    Only a short tail after complete lines counts: one interrupted append. Anything else (a file with no
    line at all, binary data) is left alone, so nothing mat did not write itself is ever cut away.
    """
    if not data or data.endswith(b"\n"):
        return None
    start = data.rfind(b"\n") + 1
    if start == 0:  # a torn first line is only ever a torn header
        return 0 if RESULTS_HEADER.encode().startswith(data) else None
    return start if len(data) - start <= MAX_ROW_BYTES else None


def repair_torn_line(path: Path) -> bool:
    """Cut a torn last row (an interrupted append) off the file; return whether it cut."""
    try:
        with path.open("r+b") as handle:
            start = torn_tail(handle.read())
            if start is None:
                return False
            handle.truncate(start)
            handle.flush()
            os.fsync(handle.fileno())
            return True
    except FileNotFoundError:
        return False


def strict_rows(path: Path, text: str) -> list[ResultRow]:
    """Every row of a results.tsv; ResultsTableError naming the first line that is not a row."""
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        row = parse_row(line)
        if row is not None:
            rows.append(row)
        elif line.strip() and not (number == 1 and line.startswith("commit\t")):
            raise ResultsTableError(f"{path}:{number}: not a results row: {line[:60]!r}")
    return rows


def ensure_header(path: Path) -> None:
    """Create results.tsv with only the header line when it is missing or empty."""
    with locked_for_append(path) as fd:
        header_if_empty(path, fd)


def read_results(path: Path) -> list[ResultRow]:
    """The rows of results.tsv after repairing a torn last line; [] when the file does not exist."""
    if not path.exists():
        return []
    with locked_for_append(path):  # a writer in another process never has its line cut mid-write
        repair_torn_line(path)
        return parse_rows(path.read_text(encoding="utf-8", errors="replace"))


def read_ledger(path: Path) -> list[ResultRow]:
    """The rows of a run's results.tsv for resuming it: a torn last row is cut, anything else that is
    not a row is a ResultsTableError (the file is never rewritten on a guess)."""
    if not path.exists():
        return []
    with locked_for_append(path):
        repair_torn_line(path)
        data = path.read_bytes()
    try:
        return strict_rows(path, data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ResultsTableError(f"{path}: not text (byte {exc.start} is not UTF-8)") from None


def rewrite_results(path: Path, rows: list[ExperimentResult | ResultRow]) -> None:
    """Replace results.tsv with the header and these rows (atomically)."""
    text = RESULTS_HEADER + "\n" + "".join(format_row(row) for row in rows)
    write_bytes_atomically(path, text.encode("utf-8"))


def append_result(path: Path, result: ExperimentResult | ResultRow) -> None:
    """Append one row: a single write of the whole line to an O_APPEND descriptor, then fsync.

    Writers hold an exclusive lock on the file, so the torn-line repair of one never cuts the line
    another is writing at that moment.
    """
    with locked_for_append(path) as fd:
        header_if_empty(path, fd)
        write_all(fd, format_row(result), path)


@contextlib.contextmanager
def locked_for_append(path: Path) -> Iterator[int]:
    """An O_APPEND descriptor on `path` (created if missing) holding an exclusive flock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)  # also releases the lock


def header_if_empty(path: Path, fd: int) -> None:
    """Under the lock: cut a torn last line, and write the header into an empty file."""
    repair_torn_line(path)
    if os.fstat(fd).st_size == 0:
        write_all(fd, RESULTS_HEADER + "\n", path)


def write_all(fd: int, line: str, path: Path) -> None:
    """Write `line` with one os.write and fsync it."""
    data = line.encode("utf-8")
    written = os.write(fd, data)
    if written != len(data):  # never seen for a line this short on a local disk, but not silent
        raise OSError(f"short write to {path}: {written} of {len(data)} bytes")
    os.fsync(fd)


def link_results(run_dir: Path, workspace: Path) -> None:
    """Create the run's results.tsv (header only) and the workspace link `results.tsv -> ../results.tsv`."""
    ensure_header(run_dir / RESULTS_FILE)
    link = workspace / RESULTS_FILE
    if link.is_symlink() and str(link.readlink()) == f"../{RESULTS_FILE}":
        return
    if link.is_dir() and not link.is_symlink():
        raise ExperimentError(f"{link} is a directory; remove it so mat can link the run's results.tsv")
    link.unlink(missing_ok=True)
    link.symlink_to(Path("..") / RESULTS_FILE)
