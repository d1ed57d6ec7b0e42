"""Agent mode: the agent runs a whole experiment itself, as program.md says; mat checks and records it.

agent: edit train.py, commit, `python train.py > run.log 2>&1`, append a row to results.tsv, keep or reset
mat:   put its git config back, revert uncommitted edits outside train.py (and the evaluator's data),
       adopt the rows the agent appended (re-deciding keep/discard with its own rule), re-score the last
       row's checkpoint when the workspace is scored independently, rebuild a kept commit that touched
       other files with train.py alone, copy run.log, and leave the branch at the best commit
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from multiagenttrainer.atomic import write_bytes_atomically
from multiagenttrainer.experiments.decide import decide
from multiagenttrainer.experiments.loop import (
    RUN_LOG,
    Attempt,
    Loop,
    best_val,
    call_agent,
    clean_to,
    log_name,
    make_result,
    name_paths,
    read_log,
    score_independently,
    set_phase,
    tail,
    training_timeout_s,
)
from multiagenttrainer.experiments.results import (
    RESULTS_FILE,
    ResultRow,
    link_results,
    parse_rows,
    read_results,
)
from multiagenttrainer.history import ExperimentResult
from multiagenttrainer.workspace import gitops
from multiagenttrainer.workspace.summary import parse_run_summary


def read_agent_results(loop: Loop, before: str) -> list[ResultRow]:
    """Rows the agent appended to results.tsv; the file is then restored to `before` (mat appends them).

    The agent may have rewritten the file, or replaced the workspace link with a file of its own; rows
    that were not there before are taken in order either way.
    """
    link = loop.workspace.path / RESULTS_FILE
    replaced = link.exists() and not link.is_symlink()
    after = read_log(link if replaced else loop.results_path)
    if after.startswith(before):
        added = parse_rows(after[len(before) :])
    else:
        known = set(before.splitlines())
        added = parse_rows("\n".join(line for line in after.splitlines() if line not in known))
    if replaced:
        gitops.delete_path(loop.workspace.path, RESULTS_FILE)
    restore_text(loop.results_path, before)
    link_results(loop.run_dir, loop.workspace.path)
    return added


def restore_text(path: Path, text: str) -> None:
    """Rewrite a small file atomically (temp file + rename)."""
    write_bytes_atomically(path, text.encode("utf-8"))


def adopt_rows(loop: Loop, attempt: Attempt, rows: list[ResultRow], log_text: str) -> list[ExperimentResult]:
    """ExperimentResults for the agent's rows, with keep/discard decided by mat's rule."""
    results: list[ExperimentResult] = []
    best = best_val(loop)
    summary = parse_run_summary(log_text) or {}
    for index, row in enumerate(rows):
        last = index == len(rows) - 1
        status = "crash" if row.status == "crash" else decide(row.val_bpb, best)
        notes = list(attempt.notes)
        if status != row.status:
            notes.append(f"the agent recorded {row.status}; mat's rule says {status}")
        if status == "keep":
            best = row.val_bpb
        step = Attempt(attempt.experiment_id + index, attempt.base, attempt.started_at, attempt.clock)
        step.commit = gitops.resolve_commit(loop.workspace.path, row.commit) or row.commit
        step.description, step.notes = row.description or "no description", notes
        step.reverted = list(attempt.reverted)
        error = None
        if status == "crash":
            error = f"the agent recorded a crash\n{tail(log_text, loop.options.log_tail_lines)}"
        extra: dict[str, Any] = {"machine": loop.machine, "memory_gb": row.memory_gb}
        if last:
            extra.update(log_path=log_name(attempt.experiment_id), summary=dict(summary))
        results.append(
            make_result(step, status, None if status == "crash" else row.val_bpb, error=error, **extra)
        )
    return results


def keep_only_train_py(loop: Loop, attempt: Attempt, result: ExperimentResult) -> None:
    """If a kept commit changed files besides train.py, rebuild it on the base with train.py alone."""
    workspace = loop.workspace.path
    changed = gitops.changed_between(workspace, attempt.base, result.commit)
    others = [path for path in changed if path != gitops.TRAIN_FILE]
    if not others:
        return
    message = gitops.commit_message(workspace, result.commit) or result.description
    clean_to(loop, attempt.base)
    gitops.run_git(workspace, "checkout", result.commit, "--", gitops.TRAIN_FILE)
    result.commit = gitops.commit_paths(workspace, message, [gitops.TRAIN_FILE])
    result.reverted += [{"path": path, "change": "committed", "by": "agent"} for path in others]
    result.notes.append(f"reverted edits to {name_paths(others)}")
    result.description += f" (reverted edits to {name_paths(others)})"


def settle_agent_branch(loop: Loop, attempt: Attempt, results: list[ExperimentResult]) -> None:
    """Leave the branch at the best commit: the last kept row's (train.py changes only) or the base."""
    kept = [r for r in results if r.status == "keep"]
    if kept and gitops.resolve_commit(loop.workspace.path, kept[-1].commit):
        keep_only_train_py(loop, attempt, kept[-1])
        leftovers = clean_to(loop, kept[-1].commit)
    else:
        for result in kept:  # a kept row whose commit does not exist cannot be the best
            result.status, result.val_bpb = "crash", None
            result.error = f"commit {result.commit[:7]} of the agent's row does not exist"
        leftovers = clean_to(loop, attempt.base)
    results[-1].reverted += [{"path": u.path, "change": u.change, "by": "agent"} for u in leftovers]


def run_agent_experiment(loop: Loop, attempt: Attempt) -> list[ExperimentResult]:
    """One experiment that the agent runs itself; mat checks and records what it did."""
    workspace = loop.workspace.path
    read_results(loop.results_path)  # repairs a torn line before the agent appends
    before = read_log(loop.results_path)
    (workspace / RUN_LOG).unlink(missing_ok=True)
    timeout_s = loop.training.agent_timeout + training_timeout_s(loop)
    outcome = call_agent(loop, attempt, "agent", timeout_s)
    set_phase(loop, attempt, "recording")
    rows = read_agent_results(loop, before)
    run_log = read_log(workspace / RUN_LOG)
    if run_log:
        (loop.run_dir / log_name(attempt.experiment_id)).write_text(run_log, encoding="utf-8")
    guard = loop.guard
    reverted = attempt.undone(guard.secure_git(), "agent")
    reverted += attempt.undone(guard.revert_uncommitted(), "agent")
    if reverted:
        attempt.notes.append(f"reverted uncommitted edits to {name_paths(reverted)}")
    if not rows:
        reason = "agent left no row in results.tsv"
        if outcome.timed_out:
            reason = f"agent timed out after {timeout_s:.0f} s"
        clean_to(loop, attempt.base)
        logs = tail(run_log or outcome.log, loop.options.log_tail_lines)
        return [make_result(attempt, "crash", None, error=f"{reason}\n{logs}".rstrip(), machine=loop.machine)]
    results = adopt_rows(loop, attempt, rows, run_log)
    if loop.workspace.evaluation == "independent":
        verify_agent_rows(loop, attempt, results)
    settle_agent_branch(loop, attempt, results)
    return results


def verify_agent_rows(loop: Loop, attempt: Attempt, results: list[ExperimentResult]) -> None:
    """Independent evaluation in agent mode: the last row is re-scored from the checkpoint its run left
    (its val_bpb must agree; the held-out score is recorded); an earlier kept row cannot be checked, since
    only the last run's checkpoint is left, so it is a crash."""
    for result in results[:-1]:
        if result.status == "keep":
            unverified(
                result, "only the last run's checkpoint is left, so this kept row could not be checked"
            )
    last = results[-1]
    if last.status == "crash" or last.val_bpb is None:
        return
    step = Attempt(last.experiment_id, attempt.base, attempt.started_at, attempt.clock, commit=last.commit)
    scored = score_independently(loop, step, last.val_bpb)
    last.evaluation = scored.evaluation
    if scored.reason is not None or scored.val_bpb is None:
        unverified(last, scored.reason or "the independent evaluation gave no val_bpb")
        return
    last.val_bpb = scored.val_bpb
    last.summary = {**last.summary, "val_bpb": scored.val_bpb}
    last.status = decide(scored.val_bpb, best_val(loop))


def unverified(result: ExperimentResult, reason: str) -> None:
    """Turn an adopted row into a crash with `reason`."""
    result.notes.append(f"the agent recorded {result.status} with val_bpb {result.val_bpb}")
    result.status, result.val_bpb, result.error = "crash", None, reason
