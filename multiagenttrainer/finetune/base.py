"""The fine-tuning contract: a FineTuner per backend, job records, and the job store under `jobs_dir`.

A backend turns the corpus into its own dataset format, starts a job, reports its status and
cancels it. Job records are JSON files written atomically, one per job, in a subdirectory per
target, so `mat finetune list/status/cancel` work from any process.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from multiagenttrainer.atomic import write_json_atomically
from multiagenttrainer.clock import now_iso
from multiagenttrainer.errors import BackendError

JobStatus = Literal["pending", "running", "completed", "failed", "cancelled"]
FINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "cancelled"})
DEFAULT_TARGET = "default"


@dataclass
class JobRecord:
    """One fine-tuning job as stored in `<jobs_dir>/<target>/<id>.json`."""

    id: str
    backend: str
    target: str
    model: str
    status: JobStatus
    name: str = ""
    created_at: str = field(default_factory=now_iso)
    updated_at: str = field(default_factory=now_iso)
    started_at: str | None = None
    finished_at: str | None = None
    external_id: str | None = None  # e.g. the Bedrock job ARN
    output_path: str | None = None
    dataset: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    progress: dict[str, Any] = field(default_factory=dict)  # step, total_steps, loss, tokens_per_s, eta_s
    error: str | None = None
    pid: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobRecord:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    @property
    def finished(self) -> bool:
        return self.status in FINAL_STATUSES


class JobStore:
    """Job records under `jobs_dir`, one subdirectory per target."""

    def __init__(self, jobs_dir: Path) -> None:
        self.jobs_dir = Path(jobs_dir)

    def path_for(self, record: JobRecord) -> Path:
        return self.jobs_dir / safe_name(record.target or DEFAULT_TARGET) / f"{safe_name(record.id)}.json"

    def spec_path(self, target: str, job_id: str) -> Path:
        """Where a local job's resolved target is written for its training process."""
        return self.jobs_dir / safe_name(target or DEFAULT_TARGET) / f"{safe_name(job_id)}.target"

    def save(self, record: JobRecord) -> JobRecord:
        """Write the record atomically (readers never see half a file)."""
        record.updated_at = now_iso()
        write_json_atomically(self.path_for(record), record.to_dict())
        return record

    def all(self) -> list[JobRecord]:
        """Every job, oldest first; unreadable files are skipped."""
        records = []
        for path in self.jobs_dir.glob("*/*.json"):
            try:
                records.append(JobRecord.from_dict(json.loads(path.read_text(encoding="utf-8"))))
            except (OSError, ValueError, TypeError):
                continue
        return sorted(records, key=lambda r: r.created_at)

    def get(self, job_id: str) -> JobRecord:
        """The job with this id (or Bedrock ARN); BackendError naming `mat finetune list` if unknown."""
        for record in self.all():
            if job_id in (record.id, record.external_id):
                return record
        raise BackendError(
            f"no fine-tuning job {job_id!r} in {self.jobs_dir}; `mat finetune list` shows the jobs"
        )


def safe_name(text: str) -> str:
    """A string reduced to characters safe in a file name."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text) or "_"


@dataclass
class PreparedDataset:
    """What prepare_dataset produced: where the data is and how much of it."""

    location: str  # a local path or an s3:// URI
    train_records: int
    val_records: int = 0
    details: dict[str, Any] = field(default_factory=dict)


class FineTuner(ABC):
    """One fine-tuning backend. Subclass it, implement the five methods, register it in registry.py."""

    backend: str = ""

    def __init__(self, store: JobStore, target: str = DEFAULT_TARGET) -> None:
        self.store = store
        self.target = target

    @abstractmethod
    def prepare_dataset(self, corpus_path: Path) -> PreparedDataset:
        """Turn the corpus (corpus.jsonl or corpus.txt) into this backend's training data."""

    @abstractmethod
    def start_job(self, dataset: PreparedDataset, job_name: str) -> JobRecord:
        """Start a job on the dataset; blocking backends return when training has finished."""

    @abstractmethod
    def get_status(self, job_id: str) -> JobRecord:
        """The job's current record, refreshed from the backend where it lives elsewhere."""

    @abstractmethod
    def cancel_job(self, job_id: str) -> JobRecord:
        """Stop the job (a local one at its next step); the record ends as `cancelled`."""

    @abstractmethod
    def describe(self) -> str:
        """One line: backend, model and the settings that matter."""
