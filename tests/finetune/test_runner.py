"""finetune/runner.py without Prefect: a failing target, progress callbacks, and the machine split."""

from __future__ import annotations

import os
from pathlib import Path

from multiagenttrainer.config import Config
from multiagenttrainer.finetune.base import JobRecord
from multiagenttrainer.finetune.runner import plan_jobs, split_gpus, start_targets, status
from tests.finetune.conftest import opensource_section


def test_a_failing_target_leaves_a_failed_record_and_the_others_finish(
    tmp_path: Path, tiny_model_dir: Path, corpus_dir: Path
) -> None:
    cfg = Config.model_validate({
        "finetuner": {
            "jobs_dir": str(tmp_path / "jobs"),
            "opensource": opensource_section(tiny_model_dir, tmp_path / "models", max_steps=2),
            "targets": [{"name": "local"}, {"name": "cloud", "backend": "bedrock"}],
        },
    })  # fmt: skip
    seen: list[list[JobRecord]] = []

    records = start_targets(cfg, corpus_dir / "corpus.jsonl", "mixed", on_progress=seen.append)

    by_target = {r.target: r for r in records}
    assert by_target["local"].status == "completed"
    assert by_target["cloud"].status == "failed"
    assert "is not set; the Bedrock backend needs it" in str(by_target["cloud"].error)
    assert status(cfg, by_target["cloud"].id).status == "failed"
    assert seen and seen[-1][0].id == by_target["local"].id and seen[-1][0].status == "completed"
    assert by_target["local"].metrics["worker_pid"] != os.getpid()


def test_threads_and_gpus_are_split_between_local_targets() -> None:
    cfg = Config.model_validate({"finetuner": {"targets": [{"name": "a"}, {"name": "b"}, {"name": "c",
                                                "backend": "bedrock"}]}})  # fmt: skip
    from multiagenttrainer.finetune.registry import resolve_targets

    planned = plan_jobs(resolve_targets(cfg.finetuner), "split")

    local = [p for p in planned if p.job_id]
    assert len(local) == 2 and planned[2].job_id is None
    assert all(p.threads == max(1, (os.cpu_count() or 1) // 2) for p in local)
    assert split_gpus(["0", "1", "2", "3"], 2) == ["0,1", "2,3"]
    assert split_gpus(["0"], 3) == ["0", "0", "0"]
    assert split_gpus([], 2) == [None, None]
