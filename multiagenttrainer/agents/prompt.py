"""The instruction text a command agent gets for one experiment.

program.md (the workspace's protocol, unchanged)
---
the results so far (a compact table), the best val_bpb
what to do now: harness mode = one change to train.py, nothing else;
                agent mode   = run exactly one experiment as program.md describes, then stop
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from pathlib import Path

from multiagenttrainer.errors import ConfigError
from multiagenttrainer.history import ExperimentResult

DESCRIPTION_FILE = ".mat-description"  # the agent's one-line description of its change (git-ignored)
MAX_TABLE_ROWS = 40  # beyond this, older discarded and crashed rows are summarised in one line
MAX_DESCRIPTION_CHARS = 80
DEFAULT_TRAIN_COMMAND = ("python", "train.py")  # only when the caller does not say how training runs


def best_result(history: list[ExperimentResult]) -> ExperimentResult | None:
    """The kept experiment with the lowest val_bpb."""
    kept = [r for r in history if r.status == "keep" and r.val_bpb is not None]
    return min(kept, key=lambda r: r.val_bpb or 0.0) if kept else None


def shown_rows(history: list[ExperimentResult]) -> tuple[list[ExperimentResult], int]:
    """The rows worth showing (baseline, every keep, the latest others) and how many were left out."""
    ordered = sorted(history, key=lambda r: r.experiment_id)
    if len(ordered) <= MAX_TABLE_ROWS:
        return ordered, 0
    always = [r for r in ordered if r.experiment_id == 0 or r.status == "keep"]
    recent = [r for r in ordered if r not in always][-max(MAX_TABLE_ROWS - len(always), 10) :]
    rows = sorted(always + recent, key=lambda r: r.experiment_id)
    return rows, len(ordered) - len(rows)


def clip(text: str, limit: int = MAX_DESCRIPTION_CHARS) -> str:
    """One line of at most `limit` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def results_section(history: list[ExperimentResult]) -> str:
    """The results so far as a compact table, plus the best val_bpb."""
    if not history:
        return "## Results so far\n\nNone yet: this is the first experiment.\n"
    rows, omitted = shown_rows(history)
    lines = ["## Results so far (lower val_bpb is better)", "", "| # | status | val_bpb | description |"]
    lines.append("|---|---|---|---|")
    for r in rows:
        bpb = f"{r.val_bpb:.6f}" if r.val_bpb is not None else "-"
        lines.append(f"| {r.experiment_id} | {r.status} | {bpb} | {clip(r.description)} |")
    if omitted:
        lines.append(f"\n({omitted} older discarded or crashed experiments not shown.)")
    best = best_result(history)
    if best is not None:
        lines.append(
            f"\nBest so far: val_bpb {best.val_bpb:.6f} (experiment {best.experiment_id}, "
            f"commit {best.commit[:7]}); the current train.py is that version."
        )
    return "\n".join(lines) + "\n"


def run_line(train_command: Sequence[str]) -> str:
    """The exact shell line that trains: mat's training command with its output sent to run.log."""
    return f"{shlex.join(train_command)} > run.log 2>&1"


def harness_instructions(experiment_id: int, best: float | None, train_command: Sequence[str]) -> str:
    """Harness mode: one edit to train.py; mat commits, trains and records."""
    return (
        f"## Your task: experiment {experiment_id}\n\n"
        "- Make exactly one change to `train.py` (one idea) that you expect to lower val_bpb.\n"
        "- Do not run training or any experiment: after you stop, mat runs "
        f"`{shlex.join(train_command)}` in this directory.\n"
        "- Do not touch any other file (prepare.py, program.md, data/) and do not commit: "
        "mat reverts other edits and commits train.py itself.\n"
        f"- Write a one-line description of your change to the file `{DESCRIPTION_FILE}` in this "
        "directory (it is ignored by git), then stop.\n"
    )


def agent_instructions(experiment_id: int, best: float | None, train_command: Sequence[str]) -> str:
    """Agent mode: run one whole experiment as program.md describes, then stop."""
    target = f" (the best so far is {best:.6f})" if best is not None else ""
    if experiment_id == 0:
        change = "- This is the baseline: do not edit `train.py`; run it unchanged and record it as `keep`.\n"
    else:
        change = "- Edit `train.py` (one idea; no other file) and `git commit` it.\n"
    return (
        f"## Your task: experiment {experiment_id}\n\n"
        "Run exactly one experiment following program.md, then stop:\n"
        f"{change}"
        f"- Run `{run_line(train_command)}` in this directory (exactly this command: it is the one mat "
        "runs) and read the result from run.log.\n"
        "- Append exactly one row to `results.tsv`.\n"
        f"- Keep the commit if val_bpb improved{target}; otherwise reset to the best commit.\n"
        f"- Write the row's description also to the file `{DESCRIPTION_FILE}` (ignored by git).\n"
        "- Do not start another experiment.\n"
    )


MODE_INSTRUCTIONS: dict[str, Callable[[int, float | None, Sequence[str]], str]] = {
    "harness": harness_instructions,
    "agent": agent_instructions,
}


def read_program(workspace: Path) -> str:
    """program.md of the workspace, or a one-line stand-in when it is missing."""
    try:
        return (workspace / "program.md").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return "# Experiment protocol\n\nChange `train.py` so that val_bpb (printed by a run) goes down."


def build_prompt(
    workspace: Path,
    experiment_id: int,
    history: list[ExperimentResult],
    mode: str,
    train_command: Sequence[str] = DEFAULT_TRAIN_COMMAND,
) -> str:
    """program.md, the results so far and the instructions for this experiment, as one text.

    `train_command` is the command mat trains with in this workspace; the prompt names it exactly.
    """
    if mode not in MODE_INSTRUCTIONS:
        raise ConfigError(f"training.mode: {mode!r} is not one of {sorted(MODE_INSTRUCTIONS)}")
    best = best_result(history)
    instructions = MODE_INSTRUCTIONS[mode](experiment_id, best.val_bpb if best else None, train_command)
    return f"{read_program(workspace)}\n\n---\n\n{results_section(history)}\n{instructions}"
