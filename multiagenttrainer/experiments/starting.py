"""Start markers: runs that `mat train` has begun but whose run.json does not exist yet.

A run's directory and run.json appear only after the ingest and Prefect's start-up, seconds to minutes
after `mat train` was typed. So that `mat train --name a & mat train --name b & mat watch` shows both
runs from the start, `mat train` writes `<output_dir>/.starting/<pid>.json` (name, pid, host, start time)
the moment it starts and removes it when it ends. `mat watch` lists these markers as starting runs
and keeps waiting while there are any.

Markers are read as untrusted files: one that is too large or not the expected shape is ignored, as is
one whose process has gone (a `mat train` killed with SIGKILL leaves its marker behind; the next
`mat train` in that directory deletes it).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

from pydantic import Field, TypeAdapter, ValidationError

from multiagenttrainer.atomic import write_json_atomically
from multiagenttrainer.clock import now_iso
from multiagenttrainer.processes import pid_alive

STARTING_DIR = ".starting"
MAX_MARKER_BYTES = 4096
FOREIGN_MARKER_TTL = timedelta(hours=1)  # another host's process cannot be checked: trusted this long


@dataclass(frozen=True)
class StartingRun:
    """A `mat train` that has started but has no run.json yet."""

    name: Annotated[str, Field(max_length=200)]
    pid: Annotated[int, Field(ge=1, le=2**31 - 1)]
    host: Annotated[str, Field(max_length=255)]
    started_at: str

    def alive(self, now: datetime) -> bool:
        """Whether its process is still there (on another host: whether the marker is recent)."""
        if self.host == socket.gethostname():
            return pid_alive(self.pid)
        started = _parse(self.started_at)
        return started is not None and now - started < FOREIGN_MARKER_TTL

    def age_s(self, now: datetime) -> float | None:
        """Seconds since it started, or None when the marker's time is unreadable."""
        started = _parse(self.started_at)
        return max(0.0, (now - started).total_seconds()) if started else None


_MARKER: TypeAdapter[StartingRun] = TypeAdapter(StartingRun)


def _parse(value: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def marker_path(output_dir: Path, pid: int) -> Path:
    return Path(output_dir) / STARTING_DIR / f"{pid}.json"


def read_marker(path: Path) -> StartingRun | None:
    """The marker in one file; None when it is unreadable, too large or not a marker."""
    try:
        if path.stat().st_size > MAX_MARKER_BYTES:
            return None
        return _MARKER.validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return None


def all_markers(output_dir: Path) -> list[tuple[Path, StartingRun]]:
    """Every readable marker under `output_dir`, oldest first."""
    found = [(path, read_marker(path)) for path in sorted((Path(output_dir) / STARTING_DIR).glob("*.json"))]
    return sorted(((p, m) for p, m in found if m is not None), key=lambda item: item[1].started_at)


def starting_runs(output_dir: Path, now: datetime | None = None) -> list[StartingRun]:
    """The runs being started under `output_dir` whose process is still there, oldest first."""
    moment = now or datetime.now(UTC)
    return [marker for _, marker in all_markers(output_dir) if marker.alive(moment)]


def remove_dead_markers(output_dir: Path) -> None:
    """Delete the markers of processes that have gone (left by a killed `mat train`)."""
    now = datetime.now(UTC)
    for path, marker in all_markers(output_dir):
        if not marker.alive(now):
            path.unlink(missing_ok=True)


@contextmanager
def starting_marker(output_dir: Path, name: str) -> Iterator[Path | None]:
    """Mark a run as starting under `output_dir` for as long as the block runs.

    The marker is a courtesy to `mat watch`: when it cannot be written (a read-only or full disk),
    the run goes on without it.
    """
    path: Path | None = marker_path(output_dir, os.getpid())
    marker = StartingRun(name[:200], os.getpid(), socket.gethostname(), now_iso())
    try:
        remove_dead_markers(output_dir)
        write_json_atomically(marker_path(output_dir, marker.pid), asdict(marker))
    except OSError:
        path = None
    try:
        yield path
    finally:
        if path is not None:
            path.unlink(missing_ok=True)
