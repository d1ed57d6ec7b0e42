"""The child process that trains one local fine-tuning target: `python -m multiagenttrainer.finetune.worker`.

The parent (finetune/runner.py) passes the path of the resolved target (JSON), the corpus, the job name and
id, the jobs directory and this process's share of CPU threads. Everything the parent needs comes
back through the job record; the exit status is 0 when the job completed or was cancelled.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from multiagenttrainer.clock import now_iso
from multiagenttrainer.config import OpenSourceConfig
from multiagenttrainer.errors import MatError
from multiagenttrainer.finetune.base import JobRecord, JobStore
from multiagenttrainer.finetune.registry import ResolvedTarget, make_finetuner


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    """The worker's command line."""
    parser = argparse.ArgumentParser(prog="python -m multiagenttrainer.finetune.worker")
    parser.add_argument("--target", required=True, type=Path, help="JSON file: the resolved target")
    parser.add_argument("--corpus", required=True, type=Path)
    parser.add_argument("--name", required=True)
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--jobs-dir", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_args(argv)


def read_target(path: Path) -> ResolvedTarget:
    """The resolved open-source target the parent wrote."""
    spec = json.loads(path.read_text(encoding="utf-8"))
    config = OpenSourceConfig.model_validate(spec["config"])
    return ResolvedTarget(spec["name"], spec["backend"], config, spec.get("machine"))


def limit_threads(threads: int) -> None:
    """Use only this process's share of the CPU (the parent also sets OMP_NUM_THREADS)."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(max(1, threads))


def note_worker_pid(store: JobStore, job_id: str) -> None:
    """Keep the training process id in the record's metrics (`pid` is cleared when a job ends)."""
    record = store.get(job_id)
    record.metrics = {**record.metrics, "worker_pid": os.getpid()}
    store.save(record)


def save_failure(store: JobStore, target: ResolvedTarget, args: argparse.Namespace, error: str) -> None:
    """A failed record, with the error, for a job that ended before (or while) training.

    A record already final keeps its own outcome, but gains the error if it has none.
    """
    try:
        record = store.get(args.job_id)
    except MatError:
        assert isinstance(target.config, OpenSourceConfig)
        record = JobRecord(id=args.job_id, backend=target.backend, target=target.name,
                           model=target.config.model_id, status="pending", name=args.name)  # fmt: skip
    if not record.finished:
        record.status, record.finished_at, record.pid = "failed", now_iso(), None
    if record.status == "failed" and not record.error:
        record.error = error
    record.metrics = {**record.metrics, "worker_pid": os.getpid()}
    store.save(record)


def main(argv: list[str] | None = None) -> int:
    """Prepare the dataset and train the target; 0 when it completed or was cancelled, else 1."""
    args = parse_arguments(argv)
    target = read_target(args.target)
    store = JobStore(args.jobs_dir)
    limit_threads(args.threads)
    finetuner = make_finetuner(target, store)
    try:
        dataset = finetuner.prepare_dataset(args.corpus)
        record = finetuner.start_job(dataset, args.name, job_id=args.job_id)  # type: ignore[call-arg]
    except MatError as exc:
        save_failure(store, target, args, str(exc))
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # an unexpected failure still ends as a failed record with its reason
        save_failure(store, target, args, f"{type(exc).__name__}: {exc}")
        raise
    note_worker_pid(store, record.id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
