"""The experiment loop: agent -> commit -> train -> score -> keep or reset -> results.tsv -> run.json.

Experiment 0 is the unmodified baseline, trained without an agent. After it, each experiment is one of:

harness mode (default)   the agent edits train.py; mat reverts any other edit, commits train.py, restores
                         the evaluator, runs training through the executor under a timeout of
                         2 x train_time + margin, checks the evaluator is untouched, scores the run and
                         keeps the commit or resets to the best one.
agent mode               the agent runs the whole experiment itself as program.md says (commit, train,
                         append a row to results.tsv, keep or reset); mat then reverts edits outside
                         train.py, adopts the rows the agent appended (re-deciding keep/discard with
                         its own rule), copies run.log, and leaves the branch at the best commit
                         (agent_mode.py).

Scoring: with independent evaluation (the built-in template; autoresearch with `verify`), the val_bpb
recorded is mat's own score of the checkpoint train.py saved, computed apart from training
(workspace/scoring.py); what train.py printed must agree with it. Otherwise it is train.py's summary.
Everything mat does not trust (the agent, the training run) is followed by the Guard (guard.py): mat's
git config back first, then every other change undone by content and listed on the result.

A crash (non-zero exit, timeout, no finite val_bpb, an agent that changed nothing, an evaluator changed
by training, a score that does not reproduce) is recorded as `crash` with the reason and the log tail,
and the loop goes on, except for a baseline that shows the machine cannot run train.py at all (a missing
package, no CUDA GPU): that stops the run with the reason and the fix. The order of the last steps makes
a kill at any point recoverable: git is settled first, then the row is appended to results.tsv (the commit
point that `--resume` trusts), then run.json is rewritten.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from multiagenttrainer.agents.base import Agent, AgentOutcome, AgentRequest
from multiagenttrainer.clock import now_iso
from multiagenttrainer.config import TrainingConfig
from multiagenttrainer.errors import ExperimentError, MatError
from multiagenttrainer.execution.base import Executor, RunOutcome
from multiagenttrainer.execution.local import LocalExecutor
from multiagenttrainer.experiments.decide import decide
from multiagenttrainer.experiments.guard import Guard, Undone
from multiagenttrainer.experiments.results import (
    RESULTS_FILE,
    append_result,
)
from multiagenttrainer.experiments.run_state import CurrentExperiment, Phase, RunLock, RunState
from multiagenttrainer.history import ExperimentResult, Status
from multiagenttrainer.workspace import gitops
from multiagenttrainer.workspace.evaluator import Evaluator, load_evaluator, workspace_imports
from multiagenttrainer.workspace.scoring import (
    CHECKPOINT_FILE,
    PREPARE_FILE,
    Verdict,
    prepare_scoring,
    read_result,
    verdict,
)
from multiagenttrainer.workspace.setup import Workspace
from multiagenttrainer.workspace.summary import parse_run_summary

log = logging.getLogger(__name__)

ResultHook = Callable[[ExperimentResult], None]
ProposalHook = Callable[[int, str], None]  # (experiment id, the change's description), before training
BASELINE_DESCRIPTION = "baseline"
RUN_LOG = "run.log"
MAX_NOTED_PATHS = 5


class RunInterrupted(ExperimentError):
    """mat was asked to stop (Ctrl-C, SIGTERM, cancellation) in the middle of an experiment."""


class Sharing(Protocol):
    """How the machines of one run share the best commit (experiments/fleet.py); None on one machine."""

    def base_for(self, loop: Loop) -> str:
        """The commit the next experiment starts from, present in this machine's work tree."""
        ...

    def publish(self, loop: Loop, result: ExperimentResult) -> None:
        """Make a kept commit available to every machine; called before its row is recorded."""
        ...


@dataclass
class LoopOptions:
    """Knobs of the loop that are not part of the user's config."""

    timeout_margin_s: float = 60.0  # training may take 2 x train_time + this before it is killed
    log_tail_lines: int = 30  # lines of the training log kept in a crash's error


@dataclass
class Loop:
    """Everything one experiment loop works with. `state` is shared with the caller and saved often."""

    run_dir: Path
    workspace: Workspace
    state: RunState
    agent: Agent | None
    executor: Executor
    training: TrainingConfig
    hooks: Sequence[ResultHook] = ()
    options: LoopOptions = field(default_factory=LoopOptions)
    stop: threading.Event = field(default_factory=threading.Event)
    save_lock: RunLock | None = None  # shared by a run's machines; its own lock by default
    sharing: Sharing | None = None
    last_outcome: RunOutcome | None = None  # how the last training run on this machine ended
    proposal_hooks: Sequence[ProposalHook] = ()
    evaluator: Evaluator | None = None  # loaded from the run directory when not given
    scoring_executor: Executor | None = None  # made on first use (see `scorer`)

    def __post_init__(self) -> None:
        if self.save_lock is None:
            self.save_lock = RunLock(self.run_dir, self.state)

    @property
    def lock(self) -> RunLock:
        """The run's state lock (save_lock, always set once the loop exists)."""
        assert self.save_lock is not None
        return self.save_lock

    @property
    def machine(self) -> str:
        return self.executor.name

    @property
    def scorer(self) -> Executor:
        """Where the independent evaluation runs: on this machine, which holds the held-out data and mat's
        copies (they never go to the target); the loop's own executor when that is local."""
        if self.scoring_executor is None:
            local = isinstance(self.executor, LocalExecutor)
            self.scoring_executor = self.executor if local else LocalExecutor(machine_name="scoring")
        return self.scoring_executor

    @property
    def guard(self) -> Guard:
        if self.evaluator is None:
            self.evaluator = load_evaluator(self.run_dir)
        self.evaluator = self.evaluator.for_workspace(self.workspace.path)  # a machine's own work tree
        return Guard(self.workspace, self.evaluator)

    @property
    def results_path(self) -> Path:
        return self.run_dir / RESULTS_FILE


@dataclass
class Attempt:
    """An experiment in progress: what will be trained and what has been noted so far."""

    experiment_id: int
    base: str  # the best commit when the experiment started; discards reset to it
    started_at: str = field(default_factory=now_iso)
    clock: float = field(default_factory=time.monotonic)
    commit: str = ""
    description: str = BASELINE_DESCRIPTION
    notes: list[str] = field(default_factory=list)
    reverted: list[dict[str, str]] = field(default_factory=list)  # every change undone, and by whom
    evaluator_hash: str = ""

    def undone(self, items: list[Undone], by: str) -> list[str]:
        """Record changes mat undid (`by` the agent or the training run); return their paths."""
        self.reverted += [{"path": item.path, "change": item.change, "by": by} for item in items]
        return [item.path for item in items]


# ---------------------------------------------------------------- small helpers


def log_name(experiment_id: int, suffix: str = "log") -> str:
    """`logs/exp-007.log` (training) or `logs/exp-007.agent.log` (agent), relative to the run dir."""
    return f"logs/exp-{experiment_id:03d}.{suffix}"


def tail(text: str, lines: int) -> str:
    """The last `lines` lines of a log (progress lines rewritten with \\r count as lines)."""
    return "\n".join(text.splitlines()[-lines:])


def read_log(path: Path) -> str:
    """A log file's text, or "" when there is none."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def name_paths(paths: list[str]) -> str:
    """`a, b and 3 more` for a note about reverted files."""
    shown = ", ".join(paths[:MAX_NOTED_PATHS])
    return shown + (f" and {len(paths) - MAX_NOTED_PATHS} more" if len(paths) > MAX_NOTED_PATHS else "")


def best_val(loop: Loop) -> float | None:
    """The lowest kept val_bpb so far, or None before the first success."""
    best = loop.state.best
    return best.val_bpb if best else None


def best_commit(loop: Loop) -> str:
    """The commit the branch should point at: the best kept experiment's, else the baseline commit."""
    best = loop.state.best
    return best.commit if best else loop.workspace.baseline_commit


def training_timeout_s(loop: Loop) -> float:
    """How long a training run may take before its process group is killed."""
    return 2 * loop.workspace.train_time_s + loop.options.timeout_margin_s


def check_stop(loop: Loop) -> None:
    """Raise RunInterrupted once mat has been asked to stop."""
    if loop.stop.is_set():
        run_id = loop.state.run_id
        raise RunInterrupted(f"run {run_id} was interrupted; continue it with `mat train --resume {run_id}`")


def save_state(loop: Loop) -> None:
    """Rewrite run.json (one writer at a time)."""
    with loop.lock:
        loop.state.save(loop.run_dir)


def set_phase(loop: Loop, attempt: Attempt, phase: Phase) -> None:
    """Record in run.json which experiment this machine is on and in which phase, for `mat watch`."""
    with loop.lock:
        others = [c for c in loop.state.current if c.machine != loop.machine]
        mine = CurrentExperiment(attempt.experiment_id, phase, attempt.started_at, loop.machine)
        loop.state.current = [*others, mine]
        save_state(loop)


def clean_to(loop: Loop, commit: str) -> list[Undone]:
    """Put the branch on `commit`, the work tree and the evaluator as recorded; return what differed."""
    undone = loop.guard.clean(commit)
    for item in undone:
        log.info("run %s: reverted %s (%s) at %s", loop.state.run_id, item.path, item.change, commit[:7])
    return undone


def make_result(
    attempt: Attempt, status: Status, val_bpb: float | None, *, error: str | None = None, **extra: Any
) -> ExperimentResult:
    """An ExperimentResult for an attempt, timed from its start to now; `extra` sets other fields."""
    return ExperimentResult(
        experiment_id=attempt.experiment_id,
        commit=attempt.commit or attempt.base,
        val_bpb=val_bpb,
        memory_gb=float(extra.pop("memory_gb", 0.0)),
        status=status,
        description=attempt.description,
        duration_s=round(time.monotonic() - attempt.clock, 3),
        started_at=attempt.started_at,
        finished_at=now_iso(),
        error=error,
        notes=list(attempt.notes),
        reverted=list(attempt.reverted),
        evaluator_hash=attempt.evaluator_hash,
        **extra,
    )


def recheck_keep(loop: Loop, result: ExperimentResult) -> None:
    """A keep judged against the best it started from is judged again against the best now: with several
    machines another one may have kept a better change meanwhile, and then this one is a discard."""
    best = loop.state.best
    if result.status != "keep" or result.val_bpb is None or best is None or best.val_bpb is None:
        return
    if decide(result.val_bpb, best.val_bpb) == "keep":
        return
    result.status = "discard"
    result.notes.append(
        f"beat the best it started from, but not experiment {best.experiment_id} "
        f"({best.val_bpb:.6f}, kept on {best.machine} meanwhile)"
    )


def record(loop: Loop, result: ExperimentResult) -> None:
    """Append the row (the commit point), then add the result to run.json, then call the hooks."""
    with loop.lock:
        recheck_keep(loop, result)
        if loop.sharing is not None and result.status == "keep":
            loop.sharing.publish(loop, result)
        append_result(loop.results_path, result)
        loop.state.experiments.append(result)
        loop.state.current = [c for c in loop.state.current if c.machine != loop.machine]
        save_state(loop)
    log.info("experiment %d: %s %s", result.experiment_id, result.status, result.val_bpb)
    for hook in loop.hooks:
        try:
            hook(result)
        except Exception:  # a failed alert or progress line must not stop the experiments
            log.warning(
                "on_result hook %r failed for experiment %d", hook, result.experiment_id, exc_info=True
            )


# ---------------------------------------------------------------- the agent's turn


def build_request(loop: Loop, experiment_id: int, mode: str, timeout_s: float) -> AgentRequest:
    """The agent's request: the workspace, the history and the prompt for this experiment."""
    from multiagenttrainer.agents.prompt import build_prompt

    history = list(loop.state.experiments)
    prompt = build_prompt(loop.workspace.path, experiment_id, history, mode, loop.workspace.train_command)
    return AgentRequest(
        workspace=loop.workspace.path,
        experiment_id=experiment_id,
        history=history,
        prompt=prompt,
        timeout_s=timeout_s,
        mode=mode,
        env=dict(loop.workspace.env),
    )


def call_agent(loop: Loop, attempt: Attempt, mode: str, timeout_s: float) -> AgentOutcome:
    """Run the agent once and keep its output in logs/exp-NNN.agent.log."""
    if loop.agent is None:
        raise ExperimentError("no agent configured for experiments after the baseline")
    set_phase(loop, attempt, "agent")
    outcome = loop.agent.propose(build_request(loop, attempt.experiment_id, mode, timeout_s))
    check_stop(loop)
    agent_log = loop.run_dir / log_name(attempt.experiment_id, "agent.log")
    agent_log.parent.mkdir(parents=True, exist_ok=True)
    agent_log.write_text(outcome.log, encoding="utf-8")
    if outcome.exit_code != 0 and not outcome.timed_out:
        attempt.notes.append(f"agent exited with code {outcome.exit_code}")
    return outcome


def revert_other_edits(loop: Loop, attempt: Attempt) -> None:
    """Undo edits outside train.py (committed ones, ignored files and the evaluator's data too) and note
    them in the notes and the description. mat's git config goes back first, before git reads it."""
    workspace, branch = loop.workspace.path, loop.workspace.branch
    guard = loop.guard
    reverted = attempt.undone(guard.secure_git(), "agent")
    if gitops.current_branch(workspace) != branch:
        gitops.attach_head(workspace, branch)  # the agent switched branches: come back, keeping its edits
    if gitops.head_sha(workspace) != attempt.base:
        gitops.reset_soft(workspace, attempt.base)  # the agent committed: judge its changes as edits
    reverted += attempt.undone(guard.revert(attempt.base, keep=(gitops.TRAIN_FILE,)), "agent")
    if reverted:
        attempt.notes.append(f"reverted edits to {name_paths(reverted)}")
        attempt.description += f" (reverted edits to {name_paths(reverted)})"


def agent_failure(loop: Loop, attempt: Attempt, outcome: AgentOutcome) -> str | None:
    """Why the agent's turn produced nothing to train, or None when train.py changed (by content)."""
    if outcome.timed_out:
        return f"agent timed out after {loop.training.agent_timeout} s"
    if not gitops.train_py_changed(loop.workspace.path, attempt.base):
        return "agent made no change to train.py"
    return None


# ---------------------------------------------------------------- harness mode


def announce_proposal(loop: Loop, attempt: Attempt) -> None:
    """Tell the proposal hooks what the experiment will try (a failing hook is only logged)."""
    for hook in loop.proposal_hooks:
        try:
            hook(attempt.experiment_id, attempt.description)
        except Exception:
            log.warning(
                "proposal hook %r failed for experiment %d", hook, attempt.experiment_id, exc_info=True
            )


def propose_change(loop: Loop, attempt: Attempt) -> ExperimentResult | None:
    """The agent's turn in harness mode; a crash result when there is nothing to train."""
    outcome = call_agent(loop, attempt, "harness", float(loop.training.agent_timeout))
    attempt.description = " ".join(outcome.description.split()) or "no description"
    announce_proposal(loop, attempt)
    revert_other_edits(loop, attempt)
    reason = agent_failure(loop, attempt, outcome)
    if reason is None:
        attempt.commit = gitops.commit_paths(loop.workspace.path, attempt.description, [gitops.TRAIN_FILE])
        return None
    clean_to(loop, attempt.base)
    error = f"{reason}\n{tail(outcome.log, loop.options.log_tail_lines)}".rstrip()
    return make_result(
        attempt, "crash", None, error=error, log_path=log_name(attempt.experiment_id, "agent.log")
    )


def train(loop: Loop, attempt: Attempt) -> tuple[RunOutcome, str, list[str]]:
    """Run training on the executor with the evaluator restored; return how it ended, the log text and
    the evaluator paths the run changed (which make it a crash)."""
    set_phase(loop, attempt, "training")
    workspace = loop.workspace
    log_path = loop.run_dir / log_name(attempt.experiment_id)
    restored, attempt.evaluator_hash = loop.guard.before_training()
    if restored:
        attempt.notes.append(f"restored {name_paths(attempt.undone(restored, 'agent'))} before training")
    loop.executor.sync(workspace.path, [gitops.TRAIN_FILE])
    outcome = loop.executor.run(
        workspace.path, workspace.train_command, training_timeout_s(loop), log_path, workspace.env
    )
    loop.last_outcome = outcome
    check_stop(loop)
    refused = fetch_outputs(loop, outcome)
    undone, tampered = loop.guard.after_training(attempt.commit, attempt.evaluator_hash)
    tampered = sorted({*tampered, *refused})
    if undone:
        attempt.notes.append(f"training changed {name_paths(attempt.undone(undone, 'training'))} (reverted)")
    return outcome, read_log(log_path), tampered


def fetch_outputs(loop: Loop, outcome: RunOutcome) -> list[str]:
    """From a remote target, after a run that ended well, copy back what the guard and the scorer read: the
    checkpoint, prepare.py and the workspace modules train.py imports (the data stays there: the next sync
    puts it right, and the held-out score does not depend on it). Returns the paths the target refused to
    copy (a link or an odd file where a file should be, which only the training run can have made)."""
    if isinstance(loop.executor, LocalExecutor) or outcome.exit_code != 0 or outcome.error:
        return []  # a crash either way; nothing is scored
    workspace = loop.workspace.path
    wanted = [CHECKPOINT_FILE, PREPARE_FILE]
    wanted += [str(path.relative_to(workspace)) for path in workspace_imports(workspace)]
    refused = []
    for path in dict.fromkeys(wanted):
        try:
            loop.executor.fetch(workspace, [path])
        except MatError as exc:
            log.warning("run %s: %s", loop.state.run_id, exc)
            refused.append(path)
    return refused


def crash_reason(outcome: RunOutcome, summary: dict[str, int | float] | None, timeout_s: float) -> str | None:
    """Why a training run produced no result, or None when it did."""
    if outcome.error:  # the target failed (a lost connection): its own reason
        return outcome.error
    if outcome.timed_out:
        return f"training timed out after {timeout_s:.0f} s (2 x train_time + margin) and was killed"
    if outcome.exit_code != 0:
        return f"training exited with code {outcome.exit_code}"
    if summary is None:
        return "training printed no finite val_bpb in its summary block"
    return None


def tampering_reason(tampered: list[str]) -> str | None:
    """The crash reason for a training run that changed the evaluator, or None."""
    if not tampered:
        return None
    return (
        f"the training run changed the evaluator ({name_paths(tampered)}); mat put it back, but this run "
        "was not scored by the fixed evaluator"
    )


def judge(
    loop: Loop, attempt: Attempt, outcome: RunOutcome, log_text: str, tampered: Sequence[str] = ()
) -> ExperimentResult:
    """Turn a finished run into a result: crash, keep or discard."""
    summary = parse_run_summary(log_text)
    reason = crash_reason(outcome, summary, training_timeout_s(loop)) or tampering_reason(list(tampered))
    extra: dict[str, Any] = {"training_s": round(outcome.duration_s, 3), "machine": loop.machine}
    extra["log_path"] = log_name(attempt.experiment_id)
    if reason is None and summary is not None and loop.workspace.evaluation == "independent":
        scored = score_independently(loop, attempt, float(summary["val_bpb"]))
        reason, extra["evaluation"] = scored.reason, scored.evaluation
        summary = {**summary, "val_bpb": scored.val_bpb} if scored.val_bpb is not None else summary
    if reason is not None:
        log_excerpt = tail(log_text, loop.options.log_tail_lines)
        error = f"{reason}\n{log_excerpt}".rstrip()
        return make_result(attempt, "crash", None, error=error, summary=dict(summary or {}), **extra)
    assert summary is not None
    val_bpb = float(summary["val_bpb"])
    memory_gb = float(summary.get("peak_vram_mb", 0.0)) / 1024
    status = decide(val_bpb, best_val(loop))
    return make_result(attempt, status, val_bpb, summary=dict(summary), memory_gb=memory_gb, **extra)


def scoring_timeout_s(loop: Loop) -> float:
    """How long the independent evaluation may take (it re-runs only the evaluation, not training)."""
    return max(120.0, float(loop.workspace.train_time_s)) + loop.options.timeout_margin_s


def score_independently(loop: Loop, attempt: Attempt, printed: float) -> Verdict:
    """Score the checkpoint of `attempt.commit` apart from training, on this machine (`Loop.scorer`)."""
    workspace = loop.workspace
    job = prepare_scoring(
        loop.run_dir, workspace.path, workspace.kind, workspace.python, attempt.commit, loop.guard.evaluator
    )
    if job is None:
        reason = (
            "train.py saved no checkpoint (prepare.py's save_checkpoint writes checkpoint.pt), so its "
            "val_bpb cannot be checked: mat scores the checkpoint, not the number train.py prints"
        )
        return Verdict(None, reason, {})
    set_phase(loop, attempt, "scoring")
    log_path = loop.run_dir / log_name(attempt.experiment_id, "score.log")
    outcome = loop.scorer.run(job.directory, job.command, scoring_timeout_s(loop), log_path, workspace.env)
    check_stop(loop)
    result = read_result(job.result_path)
    if result is None:
        how = "timed out" if outcome.timed_out else f"exited with code {outcome.exit_code}"
        log_excerpt = tail(read_log(log_path), loop.options.log_tail_lines)
        return Verdict(None, f"the independent evaluation {how} without a result\n{log_excerpt}", {})
    return verdict(workspace.kind, printed, result)


def run_harness_experiment(loop: Loop, attempt: Attempt) -> list[ExperimentResult]:
    """One experiment where mat trains: agent (not for the baseline) -> commit -> train -> keep or reset."""
    if attempt.experiment_id == 0:
        attempt.commit = attempt.base
    else:
        crashed = propose_change(loop, attempt)
        if crashed is not None:
            return [crashed]
    outcome, log_text, tampered = train(loop, attempt)
    set_phase(loop, attempt, "recording")
    result = judge(loop, attempt, outcome, log_text, tampered)
    if result.status != "keep":
        clean_to(loop, attempt.base)
    return [result]


# ---------------------------------------------------------------- the loop


def run_agent_mode(loop: Loop, attempt: Attempt) -> list[ExperimentResult]:
    """Agent mode (experiments/agent_mode.py, which builds on this module)."""
    from multiagenttrainer.experiments.agent_mode import run_agent_experiment

    return run_agent_experiment(loop, attempt)


MODES: dict[str, Callable[[Loop, Attempt], list[ExperimentResult]]] = {
    "harness": run_harness_experiment,
    "agent": run_agent_mode,
}


def run_experiment(loop: Loop, experiment_id: int) -> list[ExperimentResult]:
    """Run one experiment (the baseline always in harness mode) and record its result(s).

    A baseline that crashed because the machine cannot run train.py stops the run (BaselineUnusable).
    """
    base = loop.sharing.base_for(loop) if loop.sharing is not None else best_commit(loop)
    attempt = Attempt(experiment_id, base)
    clean_to(loop, attempt.base)
    mode = "harness" if experiment_id == 0 else loop.training.mode
    results = MODES[mode](loop, attempt)
    if experiment_id == 0 and results:
        note_corpus_repeats(loop, results[0])
    for result in results:
        record(loop, result)
    if experiment_id == 0 and results and results[0].status == "crash":
        check_baseline_runs(loop, read_log(loop.run_dir / log_name(0)))
    return results


# ---------------------------------------------------------------- how often the corpus repeats

REPEATS_WARNING = 10.0  # more passes over the training data than this in one budget: mostly memorising


def note_corpus_repeats(loop: Loop, baseline: ExperimentResult) -> None:
    """Add to the workspace's facts (run.json) how many times the baseline went through the training data."""
    facts = loop.workspace.facts
    found = corpus_repeats(facts, baseline.summary or {})
    if found is None:
        return
    facts.update(found)
    loop.state.workspace = {**loop.state.workspace, "facts": dict(facts)}  # a machine's tree is not the run's


def corpus_repeats(facts: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any] | None:
    """{corpus_repeats, corpus_repeats_how[, warning]} from the baseline's summary, or None when unknown.

    Tokens trained: the baseline's steps x the tokens one step trains on (train.py's constants), else the
    summary's total_tokens_M; over the training tokens set-up counted.
    """
    train_tokens, per_step = facts.get("train_tokens"), facts.get("tokens_per_step")
    steps, total_m = summary.get("num_steps"), summary.get("total_tokens_M")
    if not isinstance(train_tokens, int) or train_tokens <= 0:
        return None
    if isinstance(steps, int | float) and steps > 0 and isinstance(per_step, int) and per_step > 0:
        trained, how = int(steps) * per_step, f"{int(steps)} steps x {per_step:,} tokens per step"
    elif isinstance(total_m, int | float) and total_m > 0:
        trained, how = int(total_m * 1e6), f"total_tokens_M {total_m} in its summary"
    else:
        return None
    repeats = trained / train_tokens
    found: dict[str, Any] = {
        "corpus_repeats": round(repeats, 2),
        "corpus_repeats_how": f"the baseline trained {how} = {trained:,} tokens; the corpus has "
        f"{train_tokens:,} training tokens",
    }
    if repeats > REPEATS_WARNING:
        found["warning"] = (
            f"the corpus repeats about {repeats:.0f} times within one training budget, so the model mostly "
            "memorises it; add repositories to the corpus or shorten autoresearch.train_time"
        )
    return found


# ---------------------------------------------------------------- a baseline the machine cannot run

_MISSING_MODULE = re.compile(r"^ModuleNotFoundError: No module named '(?P<name>[^']+)'", re.MULTILINE)
_NO_GPU = re.compile(
    r"Torch not compiled with CUDA enabled|Found no NVIDIA driver|No CUDA GPUs are available"
    r"|CUDA is not available|CUDA driver version is insufficient|no CUDA-capable device"
    r"|NVIDIA driver on your system is too old",
    re.IGNORECASE,
)


class BaselineUnusable(ExperimentError):
    """The baseline crashed for a reason no change to train.py can fix: every experiment would crash too."""


def check_baseline_runs(loop: Loop, log_text: str) -> None:
    """Raise BaselineUnusable when the baseline's log shows a missing package or a missing GPU."""
    reason = missing_package_reason(loop, log_text) or missing_gpu_reason(loop, log_text)
    if reason is not None:
        raise BaselineUnusable(
            f"the baseline crashed: {reason}; the run is stopped, since every experiment would crash "
            f"the same way (see {loop.run_dir / 'logs' / log_name(0)}; fix it, then start a new run)"
        )


def missing_package_reason(loop: Loop, log_text: str) -> str | None:
    """Why and how to fix a ModuleNotFoundError in the baseline's log, or None."""
    found = _MISSING_MODULE.search(log_text)
    if found is None:
        return None
    command = loop.workspace.train_command
    where = f"the interpreter mat trains with ({command[0]}) cannot import {found['name']!r}"
    if command[:2] == ["uv", "run"]:
        return f"{where}; run `uv sync` in {loop.workspace.path} so uv installs the workspace's packages"
    fix = f"install the packages the workspace's train.py needs into {command[0]}"
    if loop.workspace.kind == "autoresearch":
        fix += " (those in its pyproject.toml), or install uv so mat runs `uv run train.py`"
    return f"{where}; {fix}"


def missing_gpu_reason(loop: Loop, log_text: str) -> str | None:
    """Why and how to fix a baseline that needs a CUDA GPU the training machine lacks, or None."""
    found = _NO_GPU.search(log_text)
    if found is None:
        return None
    return (
        f"train.py needs a CUDA GPU and the machine that trains has none ({found.group(0)}); run on a "
        "machine with an NVIDIA GPU and its driver (training.execution: an ssh or docker target), or use "
        "a CPU fork of autoresearch (autoresearch.repo/branch)"
    )
