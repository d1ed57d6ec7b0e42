"""Terminal output of `mat finetune`: live progress bars per target and the jobs table."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.table import Table
from rich.text import Text

from multiagenttrainer.finetune.base import JobRecord


def format_seconds(seconds: Any) -> str:
    """`1h02m`, `3m05s` or `12s`; `-` when unknown."""
    if not isinstance(seconds, int | float) or seconds < 0:
        return "-"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def whole_number(value: Any) -> int | None:
    """A recorded count as an int; None when it is missing or not a number."""
    return int(value) if isinstance(value, int | float) and math.isfinite(value) else None


def format_number(value: Any, digits: int = 4) -> str:
    """A float to `digits` significant digits; `-` when missing."""
    return f"{value:.{digits}g}" if isinstance(value, int | float) else "-"


def progress_text(record: JobRecord) -> str:
    """`running loss 3.21 · 812 tok/s · ETA 1m05s` for one job."""
    progress = record.progress
    parts: list[str] = [str(record.status)]
    if "loss" in progress:
        parts.append(f"loss {format_number(progress['loss'])}")
    if "tokens_per_s" in progress:
        parts.append(f"{format_number(progress['tokens_per_s'], 3)} tok/s")
    if not record.finished and "eta_s" in progress:
        parts.append(f"ETA {format_seconds(progress['eta_s'])}")
    return " · ".join(parts)


class FinetuneProgress:
    """One progress bar per local job, updated from its record (an on_progress callback)."""

    def __init__(self, console: Console, enabled: bool = True) -> None:
        self.progress = Progress(
            TextColumn("{task.fields[target]}", style="bold"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            console=console,
            disable=not enabled,
        )
        self.bars: dict[str, TaskID] = {}

    def __enter__(self) -> FinetuneProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def __call__(self, records: list[JobRecord]) -> None:
        for record in records:
            self.update(record)

    def update(self, record: JobRecord) -> None:
        """Move one job's bar to its recorded step."""
        step = whole_number(record.progress.get("step")) or 0
        total = whole_number(record.progress.get("total_steps"))
        if record.id not in self.bars:
            self.bars[record.id] = self.progress.add_task("", total=total, target=record.target, detail="")
        self.progress.update(self.bars[record.id], completed=step, total=total, detail=progress_text(record))


def eval_loss(record: JobRecord, when: str) -> str:
    """The recorded eval loss before or after training (`-` when absent)."""
    value = record.metrics.get(f"eval_loss_{when}")
    if value is None and isinstance(record.metrics.get("eval"), dict):
        value = record.metrics["eval"].get(when)
    return format_number(value)


def render_jobs_table(console: Console, records: list[JobRecord]) -> None:
    """The jobs as a table: id, target, backend, model, status, created, eval loss before/after."""
    table = Table("id", "target", "backend", "model", "status", "created", "eval loss before", "after",
                  box=None, header_style="bold")  # fmt: skip
    for record in records:  # Text: a record's strings are shown as written, never read as markup
        cells = (record.id, record.target, record.backend, record.model, record.status, record.created_at,
                 eval_loss(record, "before"), eval_loss(record, "after"))  # fmt: skip
        table.add_row(*map(Text, cells))
    console.print(table)


def render_job(console: Console, record: JobRecord) -> None:
    """One job's details, a line per field that has a value."""
    lines = {
        "id": record.id, "target": record.target, "backend": record.backend, "model": record.model,
        "status": record.status, "created": record.created_at, "started": record.started_at,
        "finished": record.finished_at, "arn": record.external_id, "output": record.output_path,
        "progress": progress_text(record) if record.progress else None, "error": record.error,
    }  # fmt: skip
    for key, value in lines.items():
        if value:
            console.print(f"{key:>11}: {value}", markup=False)
    for when in ("before", "after"):
        if eval_loss(record, when) != "-":
            console.print(f"{'eval ' + when:>11}: {eval_loss(record, when)}")
