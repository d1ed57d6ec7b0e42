"""Prefect task for fine-tuning: one target per task run.

Not cached (a job must run each time it is asked for) and not retried (a failed job keeps its
record; starting it again is the user's choice). The task fails when its target's record ends
`failed`, so the flow shows which target broke while the others finish.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from multiagenttrainer.errors import TargetFailed
from multiagenttrainer.finetune.base import JobRecord, JobStore
from multiagenttrainer.finetune.runner import PlannedJob, run_planned


def target_task_name(parameters: dict[str, object]) -> str:
    """`finetune-<target>` for the task run's name in the UI."""
    job = parameters.get("job")
    return f"finetune-{job.target.name}" if isinstance(job, PlannedJob) else "finetune"


@task(name="finetune-target", task_run_name=target_task_name, cache_policy=NO_CACHE, retries=0)  # type: ignore[arg-type]
def run_target(job: PlannedJob, corpus: Path, name: str, store: JobStore) -> JobRecord:
    """Run one target (a local child process, or a Bedrock submission); fail when its job failed."""
    record = run_planned(job, corpus, name, store)
    if record.status == "failed":  # the record travels with the failure: a remote job's id is its backend's
        raise TargetFailed(
            f"target {job.target.name!r} (job {record.id}) failed: {record.error}", record.to_dict()
        )
    return record
