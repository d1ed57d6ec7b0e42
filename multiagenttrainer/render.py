"""Terminal rendering for the CLI: live ingest progress, training progress lines, summary tables."""

from __future__ import annotations

import threading
from pathlib import Path
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from multiagenttrainer.experiments.run_state import RunState
from multiagenttrainer.history import ExperimentResult
from multiagenttrainer.progress import CORPUS_STARTED_LINE, corpus_finished_line, source_line, source_outcome
from multiagenttrainer.report import (
    corpus_line,
    experiment_line,
    run_started_line,
    setup_fact_lines,
    setup_warning,
)


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class IngestReporter:
    """An IngestProgress that draws progress bars on a terminal, and prints plain lines otherwise."""

    def __init__(self, console: Console, enabled: bool = True) -> None:
        self.console = console
        self.enabled = enabled
        self.live = enabled and console.is_terminal
        self._lock = threading.Lock()
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._sources: dict[str, TaskID] = {}
        self._corpus: TaskID | None = None
        self._bytes = 0

    def __enter__(self) -> IngestReporter:
        if self.live:
            self._progress.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        if self.live:
            self._progress.stop()

    def _say(self, text: str) -> None:
        if self.enabled and not self.live:
            self.console.print(text)

    def source_started(self, source: str) -> None:
        with self._lock:
            if self.live and source not in self._sources:
                self._sources[source] = self._progress.add_task(f"fetch {source}", total=1, detail="")

    def source_finished(self, source: str, error: str | None, cached: bool) -> None:
        outcome = source_outcome(error, cached)
        with self._lock:
            task = self._sources.get(source)
            if self.live and task is not None:
                self._progress.update(task, completed=1, detail=f"[red]{outcome}[/red]" if error else outcome)
        self._say(source_line(source, error, cached))

    def corpus_started(self, total_files: int | None) -> None:
        with self._lock:
            if self.live and self._corpus is None:
                self._corpus = self._progress.add_task("build corpus", total=total_files, detail="")
        self._say(CORPUS_STARTED_LINE)

    def corpus_advanced(self, files: int, nbytes: int) -> None:
        with self._lock:
            self._bytes += nbytes
            if self.live and self._corpus is not None:
                self._progress.update(self._corpus, advance=files, detail=human_bytes(self._bytes))

    def corpus_finished(self, reused: bool) -> None:
        with self._lock:
            if self.live and self._corpus is not None:
                task = self._progress.tasks[self._corpus]
                self._progress.update(
                    self._corpus,
                    total=task.completed or 1,
                    completed=task.completed or 1,
                    detail="unchanged" if reused else human_bytes(self._bytes),
                )
        self._say(corpus_finished_line(reused))


def render_ingest_summary(console: Console, summary: dict[str, Any]) -> None:
    """Where the corpus is, then its stats: totals, per source, skip reasons, redactions."""
    stats = summary.get("stats") or {}
    if not stats:
        console.print("No corpus was written: every source failed.")
        return
    console.print(f"Corpus: {summary.get('corpus_txt')}")
    totals = Table(
        "files", "size", "train files", "val files", "secrets redacted", box=None, header_style="bold"
    )
    splits = stats.get("splits", {})
    totals.add_row(
        str(stats.get("files", 0)),
        human_bytes(stats.get("bytes", 0)),
        str(splits.get("train", {}).get("files", 0)),
        str(splits.get("val", {}).get("files", 0)),
        str(stats.get("secrets_redacted", 0)),
    )
    console.print(totals)
    per_source = Table("source", "type", "files", "size", "commit", box=None, header_style="bold")
    for name, info in stats.get("sources", {}).items():
        commits = list((info.get("commits") or {}).values())
        commit = (
            "-"
            if not commits
            else ((commits[0] or "-")[:12] if len(commits) == 1 else f"{len(commits)} repos")
        )
        per_source.add_row(
            name, info.get("type", ""), str(info.get("files", 0)), human_bytes(info.get("bytes", 0)), commit
        )
    console.print(per_source)
    skipped = {k: v for k, v in (stats.get("skipped") or {}).items() if v}
    if skipped:
        console.print(
            "skipped: " + ", ".join(f"{reason} {count}" for reason, count in sorted(skipped.items()))
        )


# --------------------------------------------------------------------------- training


class TrainReporter:
    """A TrainProgress that prints one line per event and remembers which run it is, for the closing lines."""

    def __init__(self, console: Console, enabled: bool = True) -> None:
        self.console = console
        self.enabled = enabled
        self.run_id: str | None = None
        self.run_dir: Path | None = None

    def _say(self, text: str) -> None:
        if self.enabled:
            self.console.print(text)

    def corpus_ready(self, corpus_dir: str, status: str) -> None:
        self._say(corpus_line(corpus_dir, status))

    def run_started(self, run_dir: Path, state: RunState) -> None:
        self.run_id, self.run_dir = state.run_id, run_dir
        self._say(run_started_line(run_dir, state))
        if not state.done:
            for fact in setup_fact_lines(state.workspace):
                self._say(f"  {escape(fact)}")

    def experiment_finished(self, result: ExperimentResult, state: RunState) -> None:
        self._say(experiment_line(result, state))
        if result.experiment_id != 0:
            return
        facts = setup_fact_lines(state.workspace, detail=False)
        repeats = next((fact for fact in facts if fact.startswith("the corpus repeats")), None)
        if repeats:
            self._say(f"  {escape(repeats)}")
        warning = setup_warning(state.workspace)
        if warning:
            self._say(f"warning: {escape(warning)}")
