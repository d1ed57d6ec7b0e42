"""What `mat status` and `mat watch` show: every run under an output directory, read from its run.json.

Runs are read, never written, so this works for runs owned by other processes (several
`mat train --name X &` at once). `mat watch` also lists the runs that `mat train` is still starting
(experiments/starting.py) and waits for them. The frame of `mat watch` and the rows of `mat status` are
pure functions of the run states and the current time; only `watch_runs` loops and sleeps.
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
from multiagenttrainer.experiments.starting import StartingRun, starting_runs
from multiagenttrainer.report import machine_summaries

STATUS_STYLES = {"running": "cyan", "completed": "green", "failed": "red", "interrupted": "yellow"}
BAR_WIDTH = 24
# How long `mat watch` waits for a run to be running or starting before it gives up: `mat train` marks
# its run as starting a few seconds after it is typed (Python's start-up on a busy machine).
WAIT_FOR_RUNS_S = 30.0
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


STATUS_COLUMNS = ("id", "name", "status", "experiments", "baseline", "best", "started", "duration")
# On a terminal too narrow for every column, these give way in this order (the id ends with the name).
GIVEN_UP_FIRST = ("started", "baseline", "duration", "experiments", "name", "best")
CELL_PADDING = 2  # a column's share of the table's padding (one space either side)


def status_cells(row: dict[str, Any]) -> dict[str, Text]:
    """One `mat status` row as text cells, by column."""
    return {
        "id": Text(row["id"]),
        "name": Text(row["name"]),
        "status": Text(row["status"], style=STATUS_STYLES.get(row["status"], "")),
        "experiments": Text(f"{row['experiments_done']}/{row['max_experiments']}"),
        "baseline": Text(_bpb(row["baseline_val_bpb"])),
        "best": Text(_bpb(row["best_val_bpb"])),
        "started": Text(_local_time(row["started_at"])),
        "duration": Text(format_elapsed(row["duration_s"])),
    }


def natural_widths(cells: list[dict[str, Text]]) -> dict[str, int]:
    """Each column's width when nothing is cut: its longest cell or its header, plus padding."""
    return {
        column: max([len(column), *(cell[column].cell_len for cell in cells)]) + CELL_PADDING
        for column in STATUS_COLUMNS
    }


def fitting_columns(widths: dict[str, int], width: int) -> list[str]:
    """The columns that fit in `width`, least useful given up first; id and status always stay."""
    columns = list(STATUS_COLUMNS)
    for column in GIVEN_UP_FIRST:
        if sum(widths[c] for c in columns) <= width:
            break
        columns.remove(column)
    return columns


def render_status_table(console: Console, rows: list[dict[str, Any]]) -> None:
    """Print the `mat status` table (or a one-line note when there are no runs).

    Run ids are never cut (`mat train --resume` needs them whole): on a narrow terminal the least useful
    columns give way (and the table is as wide as an id when even that does not fit); piped output gets
    every column at full width.
    """
    if not rows:
        console.print("No training runs yet; start one with `mat train`.")
        return
    cells = [status_cells(row) for row in rows]
    widths = natural_widths(cells)
    columns = fitting_columns(widths, console.width) if console.is_terminal else list(STATUS_COLUMNS)
    table = Table(box=None, header_style="bold")
    for column in columns:
        if column == "id":
            table.add_column(column, no_wrap=True, min_width=widths["id"] - CELL_PADDING)
        else:
            table.add_column(column, overflow="fold")
    for cell in cells:
        table.add_row(*(cell[column] for column in columns))
    full_width = sum(widths[column] for column in columns)
    width = max(console.width, widths["id"]) if console.is_terminal else full_width
    (console if width <= console.width else console_of_width(console, width)).print(table)


def console_of_width(console: Console, width: int) -> Console:
    """A console that writes where `console` does, as it does, but `width` columns wide."""
    return Console(
        file=console.file,
        width=width,
        force_terminal=console.is_terminal,
        color_system=console.color_system,  # type: ignore[arg-type]  # the same names rich accepts
        no_color=console.no_color,
        highlight=False,
    )


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


def starting_lines(starting: Sequence[StartingRun], now: datetime) -> Text:
    """`starting: small (pid 123, 12 s)`, one line per run that `mat train` is still starting."""
    lines = []
    for run in starting:
        age = run.age_s(now)
        waited = f", {age:.0f} s" if age is not None else ""
        lines.append(f"starting: {run.name} (pid {run.pid}{waited})")
    return Text("\n".join(lines), style="cyan")


def render_watch_frame(
    states: Sequence[RunState],
    now: datetime,
    output_dir: str | Path | None = None,
    starting: Sequence[StartingRun] = (),
) -> RenderableType:
    """One frame of `mat watch` for these runs (and those still starting) at time `now`."""
    where = f" under {output_dir}" if output_dir is not None else ""
    if not states:
        empty = Text(f"No training runs{where} yet.")
        return Group(empty, starting_lines(starting, now)) if starting else empty
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
    return Group(title, table, starting_lines(starting, now)) if starting else Group(title, table)


def all_done(states: Sequence[RunState]) -> bool:
    """True when no run is still running."""
    return all(state.effective_status() != "running" for state in states)


def load_states(output_dir: Path) -> list[RunState]:
    """The states of every run under `output_dir`, oldest first."""
    return [state for _, state in list_runs(output_dir)]


def still_starting(output_dir: Path, states: Sequence[RunState], now: datetime) -> list[StartingRun]:
    """Runs being started whose process has not written a run.json yet (one that has is listed as a run)."""
    owners = {(state.host, state.pid) for state in states}
    return [run for run in starting_runs(output_dir, now) if (run.host, run.pid) not in owners]


def watch_runs(
    console: Console,
    output_dir: Path,
    once: bool,
    refresh_s: float = 0.5,
    stop_when_done: bool = True,
    wait_for_runs_s: float = WAIT_FOR_RUNS_S,
) -> None:
    """Show every run under `output_dir`, refreshed every `refresh_s`, until none is running or starting.

    `once` prints a single plain frame. Runs that `mat train` is starting count as running; when there
    is none of either, it waits `wait_for_runs_s` for one before it gives up, saying so.
    """
    output_dir = Path(output_dir)
    now = datetime.now(UTC)
    states = load_states(output_dir)
    if once:
        console.print(render_watch_frame(states, now, output_dir, still_starting(output_dir, states, now)))
        return
    started, seen_activity = time.monotonic(), False
    with Live(console=console, auto_refresh=False, transient=False) as live:
        while True:
            now = datetime.now(UTC)
            states = load_states(output_dir)
            starting = still_starting(output_dir, states, now)
            active = bool(starting) or not all_done(states)
            seen_activity = seen_activity or active
            waited_s = time.monotonic() - started
            view = watch_view(states, now, output_dir, starting, waited_s, wait_for_runs_s)
            live.update(view, refresh=True)
            if stop_when_done and not active and (seen_activity or waited_s >= wait_for_runs_s):
                break
            time.sleep(refresh_s)
    if not seen_activity:
        console.print(
            f"Nothing is running or starting under {output_dir} (waited {wait_for_runs_s:g} s); "
            "start a run with `mat train --name NAME &`, then `mat watch`."
        )


def watch_view(
    states: Sequence[RunState],
    now: datetime,
    output_dir: Path,
    starting: Sequence[StartingRun],
    waited_s: float,
    wait_for_runs_s: float,
) -> RenderableType:
    """The frame, with a line saying what watch is waiting for while nothing runs or starts yet."""
    frame = render_watch_frame(states, now, output_dir, starting)
    if starting or not all_done(states):
        return frame
    note = f"waiting for a run to start ({waited_s:.0f} of {wait_for_runs_s:.0f} s)"
    return Group(frame, Text(note, style="dim"))
