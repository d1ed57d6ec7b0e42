"""The report of a training run: report.md (tables and figures) and progress.png (val_bpb per experiment).

Both are rewritten after every experiment, so they are written atomically (temp file + rename) and a
reader never sees half a file. `render_report_markdown` and `results_table` are pure functions of a
RunState; matplotlib is imported only when a plot is drawn, and only through its object API (no pyplot
global state), so reports can be written from worker threads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from multiagenttrainer.atomic import write_atomically
from multiagenttrainer.experiments.run_state import RunState
from multiagenttrainer.history import ExperimentResult

REPORT_FILE = "report.md"
PLOT_FILE = "progress.png"
MAX_ERROR_CHARS = 160  # a crash's error is cut to one short line in the table
DASH = "—"
PLOT_SIZE_IN = (10.0, 5.5)
PLOT_DPI = 110
STATUS_COLORS = {"keep": "#2ca02c", "discard": "#9e9e9e", "crash": "#d62728"}


@dataclass(frozen=True)
class ExperimentRow:
    """One experiment as the report shows it."""

    experiment_id: int
    status: str
    val_bpb: float | None
    delta_vs_best: float | None
    best_after: float | None
    duration_s: float
    machine: str
    commit: str
    description: str


# ---------------------------------------------------------------- numbers


def format_bpb(value: float | None) -> str:
    """val_bpb as autoresearch prints it: six decimals."""
    return DASH if value is None else f"{value:.6f}"


def format_delta(value: float | None) -> str:
    """A signed val_bpb difference, six decimals; negative is better."""
    return DASH if value is None else f"{value:+.6f}"


def format_duration(seconds: float) -> str:
    """42.3 -> '42.3 s', 125 -> '2m 05s', 3725 -> '1h 02m'."""
    if seconds < 59.95:  # anything that would print as "60.0 s" reads better as "1m 00s"
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole // 3600}h {whole % 3600 // 60:02d}m"


def first_line(text: str | None, limit: int = MAX_ERROR_CHARS) -> str:
    """The first non-blank line of `text`, cut to `limit` characters."""
    line = next((part.strip() for part in (text or "").splitlines() if part.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


# ---------------------------------------------------------------- progress lines (printed and logged)


def best_before(state: RunState, experiment_id: int) -> float | None:
    """The lowest val_bpb kept by the experiments before `experiment_id`."""
    kept = [
        e.val_bpb
        for e in state.experiments
        if e.experiment_id < experiment_id and e.status == "keep" and e.val_bpb is not None
    ]
    return min(kept) if kept else None


def experiment_line(result: ExperimentResult, state: RunState) -> str:
    """`[3/8] keep val_bpb 2.431200 (-0.012000) 21.4s  LEARNING_RATE 3e-3 -> 6e-3` for one experiment
    (`[3/8 on gpu-small]` when the run has several machines)."""
    where = f" on {result.machine}" if len(state.machines) > 1 else ""
    position = f"[{result.experiment_id + 1}/{state.max_experiments}{where}]"
    duration = f"{result.duration_s:.1f}s"
    if result.status == "crash" or result.val_bpb is None:
        reason = first_line(result.error)
        description = f"{result.description} ({reason})" if reason else result.description
        return f"{position} crash {duration}  {description}"
    best = best_before(state, result.experiment_id)
    delta = f" ({result.val_bpb - best:+.6f})" if best is not None else ""
    return f"{position} {result.status} val_bpb {result.val_bpb:.6f}{delta} {duration}  {result.description}"


def experiment_outcome(results: list[ExperimentResult]) -> str:
    """keep when a result was kept, crash when every result crashed, else discard (one step may record
    several experiments in agent mode)."""
    statuses = {result.status for result in results}
    if "keep" in statuses:
        return "keep"
    return "crash" if statuses == {"crash"} else "discard"


def corpus_line(corpus_dir: str, status: str) -> str:
    """`corpus: /path (built)`: the corpus a run trains on."""
    return f"corpus: {corpus_dir} ({status})"


def run_started_line(run_dir: Path, state: RunState) -> str:
    """The line that opens a run (new or resumed)."""
    machines = [str(m.get("name")) for m in state.config.get("machines", []) if isinstance(m, dict)]
    on = f" on {len(machines)} machines at once: {', '.join(machines)}" if len(machines) > 1 else ""
    if state.done:
        return f"run {state.run_id}: resuming after {state.done} of {state.max_experiments} experiments{on}"
    return f"run {state.run_id}: {state.max_experiments} experiments in {run_dir}{on}"


def run_finished_lines(summary: dict[str, Any]) -> list[str]:
    """The lines that close a run: how it ended, where it is, where its report is."""
    return [
        f"run {summary['run_id']} {summary['status']}: {summary['run_dir']}",
        f"report: {summary['report']}",
    ]


def experiment_rows(state: RunState) -> list[ExperimentRow]:
    """The experiments in order, each with its delta against the best val_bpb kept before it."""
    rows = []
    best: float | None = None
    for result in sorted(state.experiments, key=lambda e: e.experiment_id):
        value = result.val_bpb if result.status != "crash" else None
        delta = value - best if value is not None and best is not None else None
        if result.status == "keep" and value is not None:
            best = value if best is None else min(best, value)
        rows.append(_row(result, value, delta, best))
    return rows


def _row(
    result: ExperimentResult, value: float | None, delta: float | None, best: float | None
) -> ExperimentRow:
    description = result.description
    if result.status == "crash" and result.error:
        description = (
            f"{description} (error: {first_line(result.error)})" if description else first_line(result.error)
        )
    return ExperimentRow(
        experiment_id=result.experiment_id,
        status=result.status,
        val_bpb=value,
        delta_vs_best=delta,
        best_after=best,
        duration_s=result.duration_s,
        machine=result.machine,
        commit=result.commit[:7],
        description=description,
    )


def improvement_over_baseline(state: RunState) -> tuple[float, float] | None:
    """(baseline - best, the same as % of the baseline), or None until both are known."""
    baseline, best = state.baseline, state.best
    if baseline is None or baseline.val_bpb is None or best is None or best.val_bpb is None:
        return None
    gain = baseline.val_bpb - best.val_bpb
    return gain, (100.0 * gain / baseline.val_bpb if baseline.val_bpb else 0.0)


def machines_used(state: RunState) -> list[str]:
    """The distinct machines experiments ran on, in order of first use."""
    return list(
        dict.fromkeys(result.machine for result in sorted(state.experiments, key=lambda e: e.experiment_id))
    )


def machine_summaries(state: RunState) -> list[dict[str, Any]]:
    """Per machine of a multi-machine run: experiments, keeps, crashes, best, and whether it was dropped."""
    summaries = []
    for machine in state.machines:
        mine = [e for e in state.experiments if e.machine == machine.name]
        scored = [e.val_bpb for e in mine if e.val_bpb is not None and e.status != "crash"]
        summaries.append(
            {
                "machine": machine.name,
                "type": machine.type,
                "experiments": len(mine),
                **{status: sum(1 for e in mine if e.status == status) for status in STATUS_COLORS},
                "best_val_bpb": min(scored) if scored else None,
                "status": machine.status,
                "reason": machine.reason,
            }
        )
    return summaries


def machine_lines(state: RunState) -> list[str]:
    """The report's table of machines."""
    lines = [
        "| machine | type | experiments | keep | discard | crash | best val_bpb | status |",
        "|:--|:--|--:|--:|--:|--:|--:|:--|",
    ]
    for row in machine_summaries(state):
        best = "n/a" if row["best_val_bpb"] is None else format_bpb(row["best_val_bpb"])
        status = (
            row["status"] if row["reason"] is None else f"{row['status']}: {first_line(row['reason'], 200)}"
        )
        cells = [row["machine"], row["type"], str(row["experiments"]), str(row["keep"]), str(row["discard"])]
        cells += [str(row["crash"]), best, status]
        lines.append("| " + " | ".join(escape_cell(cell) for cell in cells) + " |")
    return lines


# ---------------------------------------------------------------- markdown


def escape_cell(text: str) -> str:
    """Make free text safe inside one markdown table cell."""
    return " ".join(text.split()).replace("\\", "\\\\").replace("|", "\\|")


def render_report_markdown(state: RunState) -> str:
    """The whole report.md for a run."""
    lines = [f"# Training run {state.name} ({state.run_id})", "", *_summary_lines(state), ""]
    lines += _setup_lines(state)
    if state.machines:
        lines += ["## Machines", "", *machine_lines(state), ""]
    lines += ["## Experiments", "", *_table_lines(state), ""]
    if state.experiments:
        lines += [
            "¹ val_bpb minus the best val_bpb kept before that experiment (lower is better, so a negative "
            "delta beat the best so far); the baseline has nothing to compare with.",
            "",
        ]
    lines += _reverted_lines(state)
    lines += [f"![val_bpb per experiment]({PLOT_FILE})", ""]
    return "\n".join(lines)


WHO = {"agent": "by the agent", "training": "by the training run"}


def _reverted_lines(state: RunState) -> list[str]:
    """Every change mat undid, by experiment and by file (empty when there was none)."""
    entries = []
    for result in sorted(state.experiments, key=lambda e: e.experiment_id):
        by_who: dict[str, list[str]] = {}
        for item in result.reverted:
            change = f"{item.get('path', '?')} ({item.get('change', 'changed')})"
            by_who.setdefault(item.get("by", "agent"), []).append(change)
        for who, changes in by_who.items():
            files = escape_cell(", ".join(dict.fromkeys(changes)))
            entries.append(f"- Experiment {result.experiment_id}, {WHO.get(who, who)}: {files}")
    if not entries:
        return []
    intro = (
        "Only train.py may change. mat put back everything else that changed, from the experiment's "
        "base commit or its own record of the evaluator, before anything ran again:"
    )
    return ["## Changes mat reverted", "", intro, "", *entries, ""]


def _fact(facts: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    """facts[key] when it has the expected type (run.json may have been edited), else None."""
    value = facts.get(key)
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


def setup_fact_lines(workspace: Mapping[str, Any], detail: bool = True) -> list[str]:
    """What set-up found, as plain sentences: report.md's Set-up section and `mat train`'s first lines
    (without `detail`: not how the repeat count was estimated)."""
    facts = workspace.get("facts")
    if not isinstance(facts, Mapping):
        return []
    lines = []
    if _fact(facts, "repo", str):
        commit = (_fact(facts, "commit", str) or "?")[:12]
        lines.append(f"autoresearch: {facts['repo']} branch {_fact(facts, 'branch', str)}, commit {commit}")
    if _fact(facts, "train_shards", int) is not None:
        lines.append(
            f"data: {facts['train_shards']} train shards ({_fact(facts, 'train_rows', int)} rows), "
            f"val shard {_fact(facts, 'val_rows', int)} rows"
        )
    if _fact(facts, "train_tokens", int):
        val = _fact(facts, "val_tokens", int) or 0
        lines.append(f"tokens: {facts['train_tokens']:,} to train on, {val:,} to validate on")
    if _fact(facts, "recut_documents", int):
        lines.append(f"{facts['recut_documents']} documents were cut finer to fit MAX_SEQ_LEN tokens a row")
    if _fact(facts, "corpus_repeats", (float, int)) is not None:
        how = f" ({_fact(facts, 'corpus_repeats_how', str) or 'estimate'})" if detail else ""
        lines.append(f"the corpus repeats {facts['corpus_repeats']} times within one training budget{how}")
    lines += [note for note in (_fact(facts, "notes", list) or []) if isinstance(note, str)]
    return lines


def setup_warning(workspace: Mapping[str, Any]) -> str | None:
    """The set-up's warning (a corpus that repeats many times in one budget), if any."""
    facts = workspace.get("facts")
    return _fact(facts, "warning", str) if isinstance(facts, Mapping) else None


def _setup_lines(state: RunState) -> list[str]:
    facts = setup_fact_lines(state.workspace)
    warning = setup_warning(state.workspace)
    if not facts and not warning:
        return []
    lines = ["## Set-up", ""]
    lines += [f"- **Warning:** {escape_cell(warning)}"] if warning else []
    return [*lines, *(f"- {escape_cell(fact)}" for fact in facts), ""]


def _summary_lines(state: RunState) -> list[str]:
    counts = {status: sum(1 for e in state.experiments if e.status == status) for status in STATUS_COLORS}
    lines = [
        f"- Status: {state.status}",
        f"- Started: {state.created_at}" + (f", finished: {state.finished_at}" if state.finished_at else ""),
        f"- Experiments: {state.done} of {state.max_experiments} "
        f"(keep {counts['keep']}, discard {counts['discard']}, crash {counts['crash']})",
        f"- Baseline val_bpb: {_baseline_text(state)}",
        f"- Best val_bpb: {_best_text(state)}",
        f"- Improvement over baseline: {_improvement_text(state)}",
        f"- Duration: {_durations_text(state)}",
        f"- Workspace branch: {_branch_text(state)}",
        f"- Scoring: {_scoring_text(state)}",
    ]
    if len(machines_used(state)) > 1:
        lines.append(f"- Machines: {', '.join(machines_used(state))}")
    if state.error:
        lines.append(f"- Error: {escape_cell(first_line(state.error, 400))}")
    return lines


def _baseline_text(state: RunState) -> str:
    baseline = state.baseline
    if baseline is None:
        return "not run yet"
    return "crashed" if baseline.val_bpb is None else format_bpb(baseline.val_bpb)


def _best_text(state: RunState) -> str:
    best = state.best
    if best is None:
        return "none yet"
    return f"{format_bpb(best.val_bpb)} (experiment {best.experiment_id}, commit `{best.commit[:7]}`)"


def _improvement_text(state: RunState) -> str:
    improvement = improvement_over_baseline(state)
    if improvement is None:
        return "n/a (needs a finished baseline and a kept experiment)"
    gain, percent = improvement
    return f"{gain:.6f} ({percent:.2f}%)"


def _durations_text(state: RunState) -> str:
    if not state.experiments:
        return "no experiment finished yet"
    total = sum(e.duration_s for e in state.experiments)
    mean = total / len(state.experiments)
    return f"total {format_duration(total)}, mean {format_duration(mean)} per experiment"


SCORING = {
    "independent": "independent: mat re-scores the checkpoint train.py saves, apart from training",
    "summary": "the val_bpb train.py prints (autoresearch's contract)",
}


def _scoring_text(state: RunState) -> str:
    text = SCORING.get(str(state.workspace.get("evaluation", "")), "unknown")
    digest = str(state.evaluator.get("hash", ""))
    return f"{text}; evaluator sha256 `{digest[:12]}`" if digest else text


def _branch_text(state: RunState) -> str:
    branch = state.workspace.get("branch")
    return f"`{branch}`" if branch else "unknown"


def _table_lines(state: RunState) -> list[str]:
    rows = experiment_rows(state)
    if not rows:
        return ["No experiment has finished yet."]
    with_machine = len(machines_used(state)) > 1
    header = [
        "#",
        "status",
        "val_bpb",
        "delta vs best¹",
        "duration",
        *(["machine"] if with_machine else []),
        "description",
    ]
    align = ["--:", ":--", "--:", "--:", "--:", *([":--"] if with_machine else []), ":--"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    for row in rows:
        cells = [
            str(row.experiment_id),
            row.status,
            "crash" if row.status == "crash" else format_bpb(row.val_bpb),
            format_delta(row.delta_vs_best),
            format_duration(row.duration_s),
            *([escape_cell(row.machine)] if with_machine else []),
            escape_cell(row.description),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def results_table(state: RunState) -> list[dict[str, Any]]:
    """The experiments as rows for a Prefect table artifact (JSON-able, one dict per experiment)."""
    return [
        {
            "#": row.experiment_id,
            "status": row.status,
            "val_bpb": "crash" if row.status == "crash" else format_bpb(row.val_bpb),
            "delta vs best": format_delta(row.delta_vs_best),
            "duration": format_duration(row.duration_s),
            "machine": row.machine,
            "commit": row.commit,
            "description": " ".join(row.description.split()),
        }
        for row in experiment_rows(state)
    ]


# ---------------------------------------------------------------- plot


def plot_progress(state: RunState, handle: IO[bytes]) -> None:
    """Draw val_bpb per experiment (kept green, discarded grey, crashes red x) and the running best."""
    from matplotlib.figure import Figure  # lazy: matplotlib costs ~0.3 s to import
    from matplotlib.ticker import MaxNLocator

    rows = experiment_rows(state)
    figure = Figure(figsize=PLOT_SIZE_IN, dpi=PLOT_DPI, layout="constrained")
    axes = figure.add_subplot()
    values = [row.val_bpb for row in rows if row.val_bpb is not None]
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    pad = (high - low) * 0.08 or max(abs(high) * 0.02, 0.01)
    _plot_points(axes, rows)
    _plot_running_best(axes, rows)
    baseline = state.baseline
    if baseline is not None and baseline.val_bpb is not None:
        axes.axhline(baseline.val_bpb, color="#1f77b4", linestyle="--", linewidth=1, label="baseline")
    axes.set_ylim(low - 2 * pad, high + 2 * pad)
    axes.set_xlim(-0.5, max([row.experiment_id for row in rows] + [state.max_experiments - 1, 1]) + 0.5)
    axes.set_xlabel("experiment #")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # experiments are counted, not measured
    axes.set_ylabel("val_bpb (lower is better)")
    axes.set_title(_plot_title(state))
    axes.grid(True, alpha=0.3)
    if not rows:
        axes.text(
            0.5, 0.5, "no experiment has finished yet", transform=axes.transAxes, ha="center", color="grey"
        )
    else:
        axes.legend(loc="best", fontsize="small")
    figure.savefig(handle, format="png")


def _plot_title(state: RunState) -> str:
    best = state.best
    suffix = f" (best {format_bpb(best.val_bpb)})" if best is not None else ""
    return f"{state.name}: val_bpb over {state.done} experiments{suffix}"


def _plot_points(axes: Any, rows: list[ExperimentRow]) -> None:
    kept = [row for row in rows if row.status == "keep" and row.val_bpb is not None]
    discarded = [row for row in rows if row.status == "discard" and row.val_bpb is not None]
    crashed = [row for row in rows if row.val_bpb is None]
    if discarded:
        axes.scatter(
            [r.experiment_id for r in discarded],
            [r.val_bpb for r in discarded],
            s=30,
            color=STATUS_COLORS["discard"],
            alpha=0.7,
            label="discard",
            zorder=2,
        )
    if kept:
        axes.scatter(
            [r.experiment_id for r in kept],
            [r.val_bpb for r in kept],
            s=60,
            color=STATUS_COLORS["keep"],
            edgecolors="black",
            linewidths=0.6,
            label="keep",
            zorder=4,
        )
    if crashed:  # no val_bpb: drawn on the bottom edge (x in data units, y in axes units)
        axes.scatter(
            [r.experiment_id for r in crashed],
            [0.03] * len(crashed),
            marker="x",
            s=50,
            color=STATUS_COLORS["crash"],
            label="crash",
            zorder=3,
            transform=axes.get_xaxis_transform(),
            clip_on=False,
        )
    for row in kept:
        axes.annotate(
            _short(row.description),
            (row.experiment_id, row.val_bpb),
            textcoords="offset points",
            xytext=(4, 6),
            fontsize=7,
            rotation=20,
            color="#1b5e20",
        )


def _plot_running_best(axes: Any, rows: list[ExperimentRow]) -> None:
    points = [(row.experiment_id, row.best_after) for row in rows if row.best_after is not None]
    if points:
        axes.step(
            [x for x, _ in points],
            [y for _, y in points],
            where="post",
            color="#1b5e20",
            linewidth=1.5,
            label="running best",
            zorder=3,
        )


def _short(text: str, limit: int = 32) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---------------------------------------------------------------- files


def write_report(run_dir: Path, state: RunState) -> tuple[Path, Path]:
    """Write report.md and progress.png into `run_dir`; returns their paths."""
    report_path, plot_path = Path(run_dir) / REPORT_FILE, Path(run_dir) / PLOT_FILE
    markdown = render_report_markdown(state).encode("utf-8")

    def write_markdown(handle: IO[bytes]) -> None:
        handle.write(markdown)

    write_atomically(report_path, write_markdown)
    write_atomically(plot_path, lambda handle: plot_progress(state, handle))
    return report_path, plot_path
