"""What `mat status` and `mat watch` show: every run under an output directory, read from its run.json.

Runs are read, never written, so this works for runs owned by other processes (several
`mat train --name X &` at once). The frame of `mat watch` and the rows of `mat status` are pure
functions of the run states and the current time; only `watch_runs` loops and sleeps.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from multiagenttrainer.experiments.run_state import RunState, list_runs
from multiagenttrainer.report import machine_summaries

STATUS_STYLES = {"running": "cyan", "completed": "green", "failed": "red", "interrupted": "yellow"}
BAR_WIDTH = 24
WAIT_FOR_RUNS_S = 10.0  # how long `mat watch` waits for a first run to appear before giving up
DASH = "—"


# ---------------------------------------------------------------- time


def parse_time(value: str | None) -> datetime | None:
    """An ISO 8601 timestamp as an aware datetime (naive ones are UTC); None if absent or bad."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def format_elapsed(seconds: float | None) -> str:
    """Seconds as H:MM:SS or M:SS."""
    if seconds is None:
        return DASH
    whole = max(0, int(seconds))
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def run_duration_s(state: RunState, status: str, now: datetime) -> float | None:
    """How long a run has lasted: until now while running, else until it finished or last saved."""
    start = parse_time(state.created_at)
    end = now if status == "running" else parse_time(state.finished_at) or parse_time(state.updated_at)
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


# ---------------------------------------------------------------- mat status


def status_row(state: RunState, now: datetime) -> dict[str, Any]:
    """One run as a JSON-able row for `mat status`."""
    status = state.effective_status()
    baseline, best = state.baseline, state.best
    return {
        "id": state.run_id,
        "name": state.name,
        "status": status,
        "experiments_done": state.done,
        "max_experiments": state.max_experiments,
        "baseline_val_bpb": baseline.val_bpb if baseline else None,
        "best_val_bpb": best.val_bpb if best else None,
        "started_at": state.created_at,
        "duration_s": run_duration_s(state, status, now),
        "machines": machine_summaries(state),
    }


def run_rows(output_dir: Path) -> list[dict[str, Any]]:
    """A row per run under `output_dir`, oldest first."""
    now = datetime.now(UTC)
    return [status_row(state, now) for _, state in list_runs(Path(output_dir))]


def render_status_table(console: Console, rows: list[dict[str, Any]]) -> None:
    """Print the `mat status` table (or a one-line note when there are no runs)."""
    if not rows:
        console.print("No training runs yet; start one with `mat train`.")
        return
    table = Table(
        "id",
        "name",
        "status",
        "experiments",
        "baseline",
        "best",
        "started",
        "duration",
        box=None,
        header_style="bold",
    )
    for row in rows:
        table.add_row(
            row["id"],
            row["name"],
            Text(row["status"], style=STATUS_STYLES.get(row["status"], "")),
            f"{row['experiments_done']}/{row['max_experiments']}",
            _bpb(row["baseline_val_bpb"]),
            _bpb(row["best_val_bpb"]),
            _local_time(row["started_at"]),
            format_elapsed(row["duration_s"]),
        )
    console.print(table)


def _bpb(value: float | None) -> str:
    return DASH if value is None else f"{value:.6f}"


def _local_time(value: str) -> str:
    parsed = parse_time(value)
    return parsed.astimezone().strftime("%Y-%m-%d %H:%M:%S") if parsed else value


# ---------------------------------------------------------------- mat watch


def current_text(state: RunState, status: str, now: datetime) -> Text:
    """The experiment(s) in progress: '#3 training 0:42', one line per machine busy."""
    if status != "running" or not state.current:
        return Text(DASH if status == "running" else status, style="dim")
    several = len({c.machine for c in state.current}) > 1 or len(state.machines) > 1
    lines = []
    for current in state.current:
        started = parse_time(current.started_at)
        elapsed = format_elapsed((now - started).total_seconds() if started else None)
        where = f" on {current.machine}" if several else ""
        lines.append(f"#{current.experiment_id} {current.phase} {elapsed}{where}")
    lines += [f"{m.name} dropped: {m.reason}" for m in state.machines if m.status == "dropped"]
    return Text("\n".join(lines))


def best_text(state: RunState) -> Text:
    """Best val_bpb so far and its gain over the baseline."""
    best, baseline = state.best, state.baseline
    if best is None or best.val_bpb is None:
        return Text(DASH, style="dim")
    text = Text(f"{best.val_bpb:.6f}", style="bold green")
    if baseline is not None and baseline.val_bpb:
        gain = 100.0 * (baseline.val_bpb - best.val_bpb) / baseline.val_bpb
        text.append(f" (-{gain:.2f}%)" if gain > 0 else " (baseline)", style="green" if gain > 0 else "dim")
    return text


def progress_cell(state: RunState) -> Table:
    """A bar over the experiments with 'done/max' beside it."""
    cell = Table.grid(padding=(0, 1))
    total = max(state.max_experiments, 1)
    cell.add_row(
        ProgressBar(total=total, completed=min(state.done, total), width=BAR_WIDTH),
        f"{state.done}/{state.max_experiments}",
    )
    return cell


def render_watch_frame(
    states: Sequence[RunState], now: datetime, output_dir: str | Path | None = None
) -> RenderableType:
    """One frame of `mat watch` for these runs at time `now`."""
    where = f" under {output_dir}" if output_dir is not None else ""
    if not states:
        return Text(f"No training runs{where} yet.")
    statuses = [state.effective_status() for state in states]
    running = statuses.count("running")
    table = Table(
        "run",
        "status",
        "experiments",
        "current",
        "best val_bpb",
        box=None,
        header_style="bold",
        pad_edge=False,
    )
    for state, status in zip(states, statuses, strict=True):
        table.add_row(
            Text(state.name, style="bold"),
            Text(status, style=STATUS_STYLES.get(status, "")),
            progress_cell(state),
            current_text(state, status, now),
            best_text(state),
        )
    local_now = now.astimezone().strftime("%H:%M:%S")
    runs = f"{len(states)} run" + ("" if len(states) == 1 else "s")
    title = Text(f"{runs}{where}, {running} running, at {local_now}", style="dim")
    return Group(title, table)


def all_done(states: Sequence[RunState]) -> bool:
    """True when no run is still running."""
    return all(state.effective_status() != "running" for state in states)


def load_states(output_dir: Path) -> list[RunState]:
    """The states of every run under `output_dir`, oldest first."""
    return [state for _, state in list_runs(output_dir)]


def watch_runs(
    console: Console,
    output_dir: Path,
    once: bool,
    refresh_s: float = 0.5,
    stop_when_done: bool = True,
    wait_for_runs_s: float = WAIT_FOR_RUNS_S,
) -> None:
    """Show every run under `output_dir`, refreshed every `refresh_s`, until none is running.

    `once` prints a single plain frame. Without runs, waits `wait_for_runs_s` for one to appear.
    """
    output_dir = Path(output_dir)
    if once:
        console.print(render_watch_frame(load_states(output_dir), datetime.now(UTC), output_dir))
        return
    started = time.monotonic()
    states = load_states(output_dir)
    with Live(
        render_watch_frame(states, datetime.now(UTC), output_dir),
        console=console,
        auto_refresh=False,
        transient=False,
    ) as live:
        while True:
            states = load_states(output_dir)
            live.update(render_watch_frame(states, datetime.now(UTC), output_dir), refresh=True)
            waited_out = not states and time.monotonic() - started >= wait_for_runs_s
            if stop_when_done and (waited_out or (states and all_done(states))):
                return
            time.sleep(refresh_s)
