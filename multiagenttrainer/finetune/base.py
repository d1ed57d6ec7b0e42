"""The fine-tuning contract: a FineTuner per backend, job records, and the job store under `jobs_dir`.

A backend turns the corpus into its own dataset format, starts a job, reports its status and
cancels it. Job records are JSON files written atomically, one per job, in a subdirectory per
target, so `mat finetune list/status/cancel` work from any process.

Record files are read as untrusted input: one that is not JSON, too large, or has a missing,
null or wrong-typed field is skipped (and reported by the caller, naming the file), so one bad
file never breaks `list` or the `status` of another job.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter, ValidationError

from multiagenttrainer.atomic import write_json_atomically
from multiagenttrainer.clock import now_iso
from multiagenttrainer.errors import BackendError

JobStatus = Literal["pending", "running", "completed", "failed", "cancelled"]
FINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "cancelled"})
DEFAULT_TARGET = "default"
MAX_RECORD_BYTES = 1 << 20  # a record is a few KB
ProcessId = Annotated[int, Field(ge=1, le=2**31 - 1)]


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
    pid: ProcessId | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> JobRecord:
        """A record from its JSON form; ValueError naming each missing or wrong-typed field."""
        try:
            return _RECORD.validate_python(data)
        except ValidationError as exc:
            problems = [
                f"{'.'.join(map(str, e['loc'])) or 'record'}: {e['msg'].lower()}" for e in exc.errors()
            ]
            raise ValueError("; ".join(problems[:3])) from None

    @property
    def finished(self) -> bool:
        return self.status in FINAL_STATUSES


_RECORD: TypeAdapter[JobRecord] = TypeAdapter(JobRecord)


@dataclass(frozen=True)
class SkippedRecord:
    """A record file that could not be read, and why."""

    path: Path
    reason: str

    @property
    def warning(self) -> str:
        return f"{self.path}: not a valid job record ({self.reason}); skipped; restore it or delete it"


def read_record(path: Path) -> JobRecord:
    """The record in one file; ValueError or OSError saying what is wrong with it."""
    if path.stat().st_size > MAX_RECORD_BYTES:
        raise ValueError(f"larger than {MAX_RECORD_BYTES // 1024} KiB")
    data = json.loads(path.read_bytes())
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return JobRecord.from_dict(data)


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

    def scan(self) -> tuple[list[JobRecord], list[SkippedRecord]]:
        """Every readable job, oldest first, and every record file that could not be read."""
        records: list[JobRecord] = []
        skipped: list[SkippedRecord] = []
        for path in sorted(self.jobs_dir.glob("*/*.json")):
            try:
                records.append(read_record(path))
            except OSError as exc:
                skipped.append(SkippedRecord(path, exc.strerror or type(exc).__name__))
            except ValueError as exc:  # not JSON, not UTF-8, or a bad field
                skipped.append(SkippedRecord(path, str(exc) or type(exc).__name__))
            except RecursionError:
                skipped.append(SkippedRecord(path, "JSON nested too deeply"))
        return sorted(records, key=lambda r: r.created_at), skipped

    def all(self) -> list[JobRecord]:
        """Every readable job, oldest first (see `scan` for the files that were skipped)."""
        return self.scan()[0]

    def get(self, job_id: str) -> JobRecord:
        """The job with this id (or Bedrock ARN); BackendError naming the fix when unknown or unreadable."""
        records, skipped = self.scan()
        for record in records:
            if job_id in (record.id, record.external_id):
                return record
        for bad in skipped:
            if bad.path.stem == safe_name(job_id):
                raise BackendError(
                    f"job {job_id}: its record {bad.path} cannot be read ({bad.reason}); "
                    "restore the file or delete it"
                )
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
