"""The fine-tune stage, written once: every target side by side; then finding, refreshing or cancelling jobs.

    records = start_targets(cfg, "corpus/corpus.jsonl", "nightly")           # plain calls
    records = start_targets(cfg, corpus, name, step=prefect_step)          # flows/finetune.py

Every target starts at once (`run_targets`). An open-source target trains in a child process of its own
(`python -m multiagenttrainer.finetune.worker`), because accelerate and torch keep process-wide
state; the CPU threads (and GPUs, when there are any) are split between those children. An open-source
target whose `machine:` is an ssh or docker machine trains there instead, through that machine's executor
(finetune/remote.py); `status` and `cancel` reach it there. A Bedrock target returns as soon as AWS has
accepted the job. A target that fails leaves a `failed` record
with its error and does not stop the others; `failed_targets` names them afterwards. The step that runs
one target is the only thing a caller swaps (`run_planned` here, a Prefect task in the flow).
"""

from __future__ import annotations

import contextvars
import logging
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from multiagenttrainer.atomic import write_json_atomically
from multiagenttrainer.clock import now_iso
from multiagenttrainer.config import Config, MachineConfig, OpenSourceConfig, expand_path
from multiagenttrainer.errors import BackendError, ConfigError, CorpusError, MatError, TargetFailed
from multiagenttrainer.finetune.base import JobRecord, JobStore, SkippedRecord
from multiagenttrainer.finetune.registry import (
    ResolvedTarget,
    make_finetuner,
    model_name,
    resolve_targets,
    select_target,
)
from multiagenttrainer.finetune.remote import (
    RemoteExecution,
    cancel_on_machine,
    machine_execution,
    refresh,
    train_on_machine,
    unknown_machine,
)
from multiagenttrainer.finetune.worker import target_spec

log = logging.getLogger(__name__)

ProgressCallback = Callable[[list[JobRecord]], None]
POLL_INTERVAL_S = 0.5
STDERR_TAIL_CHARS = 2000
LOCAL_BACKENDS = frozenset({"opensource"})


@dataclass(frozen=True)
class PlannedJob:
    """One target ready to start: its settings, the job id (open-source jobs), its share of this machine,
    or the ssh/docker machine it trains on."""

    target: ResolvedTarget
    job_id: str | None = None
    threads: int = 1
    gpus: str | None = None  # CUDA_VISIBLE_DEVICES for a local child; None leaves it unset
    execution: RemoteExecution | None = None  # the target's machine, when it is not this one


# --------------------------------------------------------------------------- planning


def jobs_store(cfg: Config) -> JobStore:
    """The job store under finetuner.jobs_dir (absolute, so child processes agree on it)."""
    return JobStore(expand_path(cfg.finetuner.jobs_dir).resolve())


def default_corpus_path(cfg: Config) -> Path:
    """`<corpus.dir>/corpus.jsonl`."""
    return expand_path(cfg.corpus.dir) / "corpus.jsonl"


def corpus_or_error(cfg: Config, corpus: str | Path | None) -> Path:
    """The corpus to fine-tune on; CorpusError when it does not exist."""
    path = Path(corpus) if corpus else default_corpus_path(cfg)
    if not path.exists():
        raise CorpusError(f"no corpus at {path}; run `mat ingest` first or pass --corpus PATH")
    return path.resolve()


def chosen_targets(cfg: Config, target: str | None) -> list[ResolvedTarget]:
    """Every configured target, or only the one named by --target; open-source paths made absolute."""
    targets = resolve_targets(cfg.finetuner)
    if target is not None:
        targets = [select_target(targets, target)]
    return [with_absolute_paths(t) for t in targets]


def with_absolute_paths(target: ResolvedTarget) -> ResolvedTarget:
    """The target with its output_dir absolute, so a child process writes where the parent looks."""
    if not isinstance(target.config, OpenSourceConfig):
        return target
    output = str(expand_path(target.config.output_dir).resolve())
    config = target.config.model_copy(update={"output_dir": output})
    return ResolvedTarget(target.name, target.backend, config, target.machine)


def check_targets(targets: list[ResolvedTarget], machines: Sequence[MachineConfig] = ()) -> None:
    """Refuse settings that cannot run (a Bedrock target sent to a machine, QLoRA without CUDA on this
    machine) before any target starts; a machine `machines` does not list only labels its target (a warning
    says so, as the product description's multi-target example uses it)."""
    from multiagenttrainer.finetune.opensource import check_4bit_supported

    for target in targets:
        if note := unknown_machine(target.machine, machines):
            log.warning("target %r: %s", target.name, note)
        try:
            remote = machine_execution(target.machine, machines) is not None
            if remote and target.backend not in LOCAL_BACKENDS:
                raise ConfigError(
                    f"finetuner.targets: {target.backend} jobs run at their provider, not on machine "
                    f"{target.machine!r}; remove the target's machine"
                )
            if isinstance(target.config, OpenSourceConfig) and not remote:
                check_4bit_supported(target.config)  # a remote machine checks its own GPU
        except ConfigError as exc:
            raise ConfigError([f"target {target.name!r}: {p}" for p in exc.problems]) from None


def visible_gpus() -> list[str]:
    """GPU indices this process may use: CUDA_VISIBLE_DEVICES, else what nvidia-smi lists."""
    declared = os.environ.get("CUDA_VISIBLE_DEVICES")
    if declared is not None:
        return [g for g in declared.split(",") if g.strip() and g.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listing = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return []
    if listing.returncode != 0:
        return []
    return [line.strip() for line in listing.stdout.splitlines() if line.strip()]


def split_gpus(gpus: list[str], parts: int) -> list[str | None]:
    """GPU lists for `parts` children: contiguous shares, or round robin when GPUs are fewer."""
    if not gpus or parts <= 0:
        return [None] * parts
    if len(gpus) < parts:
        return [gpus[i % len(gpus)] for i in range(parts)]
    share = len(gpus) // parts
    return [",".join(gpus[i * share : (i + 1) * share]) for i in range(parts)]


def plan_jobs(
    targets: list[ResolvedTarget], name: str, machines: Sequence[MachineConfig] = ()
) -> list[PlannedJob]:
    """Job ids for open-source targets; each local child's share of CPU threads and GPUs, or its machine."""
    from multiagenttrainer.finetune.opensource import new_job_id

    executions = [machine_execution(t.machine, machines) for t in targets]
    local = [t for t, e in zip(targets, executions, strict=True) if t.backend in LOCAL_BACKENDS and e is None]
    threads = max(1, (os.cpu_count() or 1) // max(1, len(local)))
    gpu_shares = iter(split_gpus(visible_gpus(), len(local)))
    planned = []
    for target, execution in zip(targets, executions, strict=True):
        if target.backend not in LOCAL_BACKENDS:
            planned.append(PlannedJob(target))
        elif execution is not None:
            planned.append(PlannedJob(target, new_job_id(f"{name}-{target.name}"), execution=execution))
        else:
            job_id = new_job_id(f"{name}-{target.name}")
            planned.append(PlannedJob(target, job_id, threads, next(gpu_shares)))
    return planned


# --------------------------------------------------------------------------- running one target


def run_planned(job: PlannedJob, corpus: Path, name: str, store: JobStore) -> JobRecord:
    """Run one target to its returned record; failures end as a `failed` record, never an exception."""
    if job.target.backend in LOCAL_BACKENDS and job.execution is None:
        return run_local_child(job, corpus, name, store)
    if job.target.backend in LOCAL_BACKENDS:
        return run_on_machine(job, corpus, name, store)
    try:
        finetuner = make_finetuner(job.target, store)
        return finetuner.start_job(finetuner.prepare_dataset(corpus), name)
    except MatError as exc:
        return failed_record(store, job, name, str(exc))


def write_target_spec(job: PlannedJob, store: JobStore) -> Path:
    """The validated target, as the child process reads it (a process boundary: a file, not a model)."""
    path = store.spec_path(job.target.name, str(job.job_id))
    write_json_atomically(path, target_spec(job.target))
    return path


def worker_command(job: PlannedJob, corpus: Path, name: str, store: JobStore) -> list[str]:
    """The command line of the child process that trains one local target."""
    return [
        sys.executable, "-m", "multiagenttrainer.finetune.worker",
        "--target", str(write_target_spec(job, store)), "--corpus", str(corpus), "--name", name,
        "--job-id", str(job.job_id), "--jobs-dir", str(store.jobs_dir), "--threads", str(job.threads),
    ]  # fmt: skip


def run_on_machine(job: PlannedJob, corpus: Path, name: str, store: JobStore) -> JobRecord:
    """Train an open-source target on its ssh or docker machine and return its final record."""
    assert job.job_id is not None and job.execution is not None
    try:
        return train_on_machine(job.target, job.job_id, job.execution, corpus, name, store)
    except MatError as exc:
        return failed_record(store, job, name, str(exc), find_record(store, job.job_id))


def child_environment(job: PlannedJob) -> dict[str, str]:
    """The child's environment: its thread count and, on GPU machines, its GPUs."""
    env = {**os.environ, "OMP_NUM_THREADS": str(job.threads), "MKL_NUM_THREADS": str(job.threads)}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if job.gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = job.gpus
    return env


def run_local_child(job: PlannedJob, corpus: Path, name: str, store: JobStore) -> JobRecord:
    """Train a local target in its own process and return the record it left."""
    assert job.job_id is not None
    try:
        finished = subprocess.run(
            worker_command(job, corpus, name, store), env=child_environment(job),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, check=False,
        )  # fmt: skip
    except OSError as exc:
        return failed_record(store, job, name, f"cannot start the training process: {exc}")
    record = find_record(store, job.job_id)
    if record is not None and record.finished:
        return record
    tail = (finished.stderr or "")[-STDERR_TAIL_CHARS:].strip()
    message = f"training process exited with code {finished.returncode}" + (f": {tail}" if tail else "")
    return failed_record(store, job, name, message, record)


def find_record(store: JobStore, job_id: str) -> JobRecord | None:
    """The record with this id, or None while it does not exist."""
    try:
        return store.get(job_id)
    except MatError:
        return None


def failed_record(
    store: JobStore, job: PlannedJob, name: str, error: str, record: JobRecord | None = None
) -> JobRecord:
    """Save (and return) a `failed` record for a target that could not run."""
    model = model_name(job.target.config)
    if record is None:
        from multiagenttrainer.finetune.opensource import new_job_id

        job_id = job.job_id or new_job_id(f"{name}-{job.target.name}")
        record = JobRecord(id=job_id, backend=job.target.backend, target=job.target.name, model=model,
                           status="failed", name=name)  # fmt: skip
    record.status, record.error, record.finished_at, record.pid = "failed", error, now_iso(), None
    return store.save(record)


# --------------------------------------------------------------------------- all targets


class TargetStep(Protocol):
    """Runs one planned target to its returned record (plain `run_planned`, or a Prefect task)."""

    def __call__(self, job: PlannedJob, corpus: Path, name: str, store: JobStore) -> JobRecord: ...


def outcome_of(future: Future[JobRecord], job: PlannedJob, name: str, store: JobStore) -> JobRecord:
    """A target's final record; a step that raised leaves (or finds) a `failed` record instead."""
    error = future.exception()
    if error is None:
        return future.result()
    if not isinstance(error, MatError):
        raise error
    if isinstance(error, TargetFailed):  # the step's own record of the failure
        return JobRecord.from_dict(error.record)
    record = find_record(store, job.job_id) if job.job_id else None
    if record is not None and record.finished:
        return record
    return failed_record(store, job, name, str(error), record)


def start_targets(
    cfg: Config,
    corpus_path: str | Path | None,
    name: str,
    target: str | None = None,
    on_progress: ProgressCallback | None = None,
    step: TargetStep = run_planned,
) -> list[JobRecord]:
    """Start every target (or the one named) at once and return their records once local ones end.

    A failing target does not stop the others: its record says `failed` with the reason.
    """
    targets = chosen_targets(cfg, target)
    check_targets(targets, cfg.machines)
    corpus = corpus_or_error(cfg, corpus_path)
    store = jobs_store(cfg)
    planned = plan_jobs(targets, name, cfg.machines)
    with ThreadPoolExecutor(max_workers=len(planned), thread_name_prefix="mat-finetune") as pool:
        context = contextvars.copy_context
        futures = [pool.submit(context().run, step, job, corpus, name, store) for job in planned]
        ids = [job.job_id for job in planned if job.job_id]
        watch_until(lambda: all(f.done() for f in futures), store, lambda: ids, on_progress)
        return [outcome_of(future, job, name, store) for future, job in zip(futures, planned, strict=True)]


def failed_targets(records: list[JobRecord]) -> list[str]:
    """`target 'x' (job id) failed: reason` for each failed record."""
    return [f"target {r.target!r} (job {r.id}) failed: {r.error}" for r in records if r.status == "failed"]


def watch_until(
    done: Callable[[], bool],
    store: JobStore,
    job_ids: Callable[[], list[str]],
    on_progress: ProgressCallback | None,
) -> None:
    """Call on_progress with the jobs' current records until done() is true (and once more after)."""
    stop = threading.Event()
    while True:
        finished = done()
        if on_progress is not None:
            on_progress([r for r in (find_record(store, i) for i in job_ids()) if r is not None])
        if finished or stop.wait(POLL_INTERVAL_S):
            return


# --------------------------------------------------------------------------- existing jobs


def list_jobs(cfg: Config) -> tuple[list[JobRecord], list[SkippedRecord]]:
    """Every readable job record, oldest first, and the record files that could not be read."""
    return jobs_store(cfg).scan()


def backend_for_record(cfg: Config, record: JobRecord, store: JobStore) -> ResolvedTarget:
    """The target settings that manage a stored job (its target if still configured, else the backend's)."""
    from multiagenttrainer.finetune.registry import backend_defaults

    for candidate in resolve_targets(cfg.finetuner):
        if candidate.name == record.target and candidate.backend == record.backend:
            return with_absolute_paths(candidate)
    return with_absolute_paths(ResolvedTarget(record.target, record.backend,
                                              backend_defaults(cfg.finetuner, record.backend)))  # fmt: skip


def status(cfg: Config, job_id: str) -> JobRecord:
    """The job's record, refreshed from its backend (Bedrock jobs are read from AWS, jobs on a machine from
    the record there)."""
    store = jobs_store(cfg)
    record = store.get(job_id)
    if never_submitted(record):
        return record
    if record.machine is not None:
        if record.finished:
            return record
        return refresh(record, backend_for_record(cfg, record, store), record_machine(cfg, record), store)
    return make_finetuner(backend_for_record(cfg, record, store), store).get_status(record.id)


def never_submitted(record: JobRecord) -> bool:
    """A remote job that failed before its backend accepted it: there is nothing to refresh."""
    return record.backend not in LOCAL_BACKENDS and record.external_id is None and record.finished


def record_machine(cfg: Config, record: JobRecord) -> RemoteExecution:
    """The execution of the machine a job runs on, from the config; BackendError when it is gone from it."""
    try:
        execution = machine_execution(record.machine, cfg.machines)
    except ConfigError:
        execution = None
    if execution is None:
        raise BackendError(
            f"job {record.id} runs on machine {record.machine!r}, which the config no longer lists as an ssh "
            "or docker machine; put it back under machines: to reach the job"
        )
    return execution


@dataclass(frozen=True)
class Cancelled:
    """What `cancel` did: the job's record afterwards, and whether it had already ended before the call."""

    record: JobRecord
    already_ended: bool


def cancel(cfg: Config, job_id: str) -> Cancelled:
    """Cancel the job through its backend; a local job stops at its next training step, one on a machine
    is stopped there at once.

    A job that had already ended (completed, failed or cancelled, as stored or as its backend now says)
    is left as it is, and `already_ended` says so.
    """
    store = jobs_store(cfg)
    before = store.get(job_id)
    if before.machine is not None:
        if before.finished:
            return Cancelled(before, True)
        return Cancelled(cancel_on_machine(before, record_machine(cfg, before), store), False)
    after = make_finetuner(backend_for_record(cfg, before, store), store).cancel_job(before.id)
    return Cancelled(after, before.finished or (after.finished and after.status != "cancelled"))
