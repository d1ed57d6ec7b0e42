"""What an experiment produced: the record shared by the loop, the agents (as history), the report,
`mat status` and `mat watch`. It lives below `agents/` and `experiments/` so both can use it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["keep", "discard", "crash"]


@dataclass
class ExperimentResult:
    """One finished experiment. Experiment 0 is always the unmodified baseline.

    `commit` is the full SHA of the commit that was trained; results.tsv shows its first 7 characters.
    `val_bpb` is None for a crash (results.tsv then says 0.000000).
    """

    experiment_id: int
    commit: str
    val_bpb: float | None
    memory_gb: float
    status: Status
    description: str
    duration_s: float = 0.0
    training_s: float | None = None
    started_at: str = ""
    finished_at: str = ""
    machine: str = "local"
    log_path: str = ""
    summary: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    # Every change mat undid during the experiment: {"path", "change" (modified/added/deleted), "by" (the
    # agent, or the training run)}; report.md lists them.
    reverted: list[dict[str, str]] = field(default_factory=list)
    evaluator_hash: str = ""  # sha256 over the evaluator's files as training saw them (workspace/evaluator)
    evaluation: dict[str, Any] = field(default_factory=dict)  # the independent evaluation, when there was one

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExperimentResult:
        return cls(**data)
