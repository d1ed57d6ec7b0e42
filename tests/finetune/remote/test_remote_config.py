"""Which targets go to a machine, checked before anything starts: unknown machines, Bedrock targets on a
machine, and the QLoRA gate, which a remote machine applies to its own GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from multiagenttrainer.config import Config
from multiagenttrainer.errors import ConfigError
from multiagenttrainer.finetune.opensource import cuda_available
from multiagenttrainer.finetune.registry import resolve_targets
from multiagenttrainer.finetune.runner import check_targets, plan_jobs
from tests.finetune.remote.conftest import mat

SSH = {"type": "ssh", "ssh_host": "trainer@gpu-1.example.com"}


def config(targets: list[dict[str, object]]) -> Config:
    return Config.model_validate({"machines": [{"name": "gpu", "execution": SSH}, {"name": "here"}],
                                  "finetuner": {"targets": targets}})  # fmt: skip


def test_a_target_on_an_unknown_machine_exits_2_naming_the_machines(tmp_path: Path) -> None:
    targets = [{"name": "t", "machine": "gpu-big"}]
    document = {"machines": [{"name": "gpu", "execution": SSH}], "corpus": {"dir": str(tmp_path)},
                "finetuner": {"jobs_dir": str(tmp_path / "jobs"), "targets": targets}}  # fmt: skip
    (tmp_path / "mat.yaml").write_text(yaml.safe_dump(document))
    (tmp_path / "corpus.jsonl").write_text('{"text": "x"}\n')

    result = mat("finetune", "start", "--config", str(tmp_path / "mat.yaml"))

    assert result.returncode == 2
    assert (
        "target 't': finetuner.targets: machine 'gpu-big' is not in machines (configured: gpu)"
        in result.stderr
    )
    assert not (tmp_path / "jobs").exists()


def test_a_bedrock_target_cannot_be_sent_to_a_machine() -> None:
    cfg = config([{"name": "titan", "backend": "bedrock", "machine": "gpu"}])
    with pytest.raises(ConfigError, match="bedrock jobs run at their provider, not on machine 'gpu'"):
        check_targets(resolve_targets(cfg.finetuner), cfg.machines)


def test_qlora_is_left_to_the_remote_machine_and_local_machines_train_here() -> None:
    cfg = config([{"name": "big", "machine": "gpu", "use_4bit": True}, {"name": "small", "machine": "here"}])
    targets = resolve_targets(cfg.finetuner)

    check_targets(targets, cfg.machines)  # no CUDA here: only a local QLoRA target would be refused
    planned = plan_jobs(targets, "n", cfg.machines)

    assert planned[0].execution is not None and planned[0].execution.type == "ssh" and planned[0].job_id
    assert planned[1].execution is None and planned[1].job_id
    if cuda_available():
        return  # this machine could run QLoRA itself
    with pytest.raises(ConfigError, match="QLoRA needs"):
        local = config([{"name": "big", "machine": "here", "use_4bit": True}])
        check_targets(resolve_targets(local.finetuner), local.machines)
