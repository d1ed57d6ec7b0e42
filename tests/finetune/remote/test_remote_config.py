"""Which targets go to a machine, checked before anything starts: unknown machines, Bedrock targets on a
machine, and the QLoRA gate, which a remote machine applies to its own GPU."""

from __future__ import annotations

import logging

import pytest

from multiagenttrainer.config import Config
from multiagenttrainer.errors import ConfigError
from multiagenttrainer.finetune.opensource import cuda_available
from multiagenttrainer.finetune.registry import resolve_targets
from multiagenttrainer.finetune.remote import machine_execution
from multiagenttrainer.finetune.runner import check_targets, plan_jobs

SSH = {"type": "ssh", "ssh_host": "trainer@gpu-1.example.com"}


def config(targets: list[dict[str, object]]) -> Config:
    return Config.model_validate({"machines": [{"name": "gpu", "execution": SSH}, {"name": "here"}],
                                  "finetuner": {"targets": targets}})  # fmt: skip


def test_a_machine_not_in_machines_only_labels_its_target_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The product description's multi-target example names machines it does not define ("metadata")."""
    cfg = config([{"name": "t", "machine": "gpu-big"}])
    with caplog.at_level(logging.WARNING, logger="multiagenttrainer"):
        check_targets(resolve_targets(cfg.finetuner), cfg.machines)
    assert machine_execution("gpu-big", cfg.machines) is None  # trains on this machine
    assert "target 't': machine 'gpu-big' is not in machines (configured: gpu, here), so it only labels" in (
        caplog.text
    )


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
