"""A fine-tuning backend defined outside mat, exactly as README.md's "Adding a backend" shows it.

`mycloud` stands in for a managed service (nothing here can reach a real one): `start_job` counts the
corpus records and "submits" the job, which is running at once and completed when its status is next
read; a `model_id` of `missing-model` is refused the way a service refuses an unknown model. mat finds
this module through MAT_PLUGINS=tests.finetune.mycloud_backend or an entry point of the group
`multiagenttrainer.backends`; nothing in mat's own code names it.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from multiagenttrainer.clock import now_iso
from multiagenttrainer.config import set_by_targets
from multiagenttrainer.errors import BackendError
from multiagenttrainer.finetune import FineTuner, JobRecord, JobStore, PreparedDataset, register_backend

UNKNOWN_MODEL = "missing-model"


class MyCloudConfig(BaseModel):
    """The `finetuner.mycloud:` section."""

    model_config = ConfigDict(extra="forbid")
    model_id: str = Field("mycloud-base", json_schema_extra=set_by_targets("model_id"))
    epochs: int = Field(1, ge=1, le=100, json_schema_extra=set_by_targets("epochs", "num_epochs"))


class MyCloudFineTuner(FineTuner):
    backend = "mycloud"

    def __init__(self, cfg: MyCloudConfig, store: JobStore, target: str) -> None:
        super().__init__(store, target)
        self.cfg = cfg

    def prepare_dataset(self, corpus_path: Path) -> PreparedDataset:
        """corpus.jsonl -> the number of records this service would receive."""
        lines = Path(corpus_path).read_text(encoding="utf-8").splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
        return PreparedDataset(str(corpus_path), train_records=len(records))

    def start_job(self, dataset: PreparedDataset, job_name: str) -> JobRecord:
        """Submit; the record is saved in self.store."""
        if self.cfg.model_id == UNKNOWN_MODEL:
            raise BackendError(f"mycloud has no model {UNKNOWN_MODEL!r}; set finetuner.mycloud.model_id")
        job_id = f"{job_name}-{self.target}-mycloud"
        record = JobRecord(
            id=job_id,
            backend=self.backend,
            target=self.target,
            model=self.cfg.model_id,
            status="running",
            name=job_name,
            started_at=now_iso(),
            external_id=f"mycloud:{job_id}",
            dataset={"train_records": dataset.train_records},
        )
        return self.store.save(record)

    def get_status(self, job_id: str) -> JobRecord:
        """Refresh the record from the service: a running job has completed by the time it is asked about."""
        record = self.store.get(job_id)
        if record.status == "running":
            record.status, record.finished_at = "completed", now_iso()
            self.store.save(record)
        return record

    def cancel_job(self, job_id: str) -> JobRecord:
        record = self.get_status(job_id)
        if not record.finished:
            record.status, record.finished_at = "cancelled", now_iso()
            self.store.save(record)
        return record

    def describe(self) -> str:
        return f"mycloud {self.cfg.model_id} epochs={self.cfg.epochs}"


register_backend("mycloud", MyCloudFineTuner, MyCloudConfig)
