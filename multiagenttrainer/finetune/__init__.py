"""Fine-tuning: backends behind the FineTuner contract, targets, and the job store."""

from multiagenttrainer.finetune.base import (
    DEFAULT_TARGET,
    FINAL_STATUSES,
    FineTuner,
    JobRecord,
    JobStatus,
    JobStore,
    PreparedDataset,
)
from multiagenttrainer.finetune.registry import (
    BACKENDS,
    ResolvedTarget,
    backend_class,
    make_finetuner,
    register_backend,
    resolve_targets,
    select_target,
)

__all__ = [
    "BACKENDS",
    "DEFAULT_TARGET",
    "FINAL_STATUSES",
    "FineTuner",
    "JobRecord",
    "JobStatus",
    "JobStore",
    "PreparedDataset",
    "ResolvedTarget",
    "backend_class",
    "make_finetuner",
    "register_backend",
    "resolve_targets",
    "select_target",
]
