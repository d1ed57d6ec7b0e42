"""Which machine a run's remaining experiments go to (the experiments-on-machine deployment's `machine`)."""

from __future__ import annotations

import pytest

from multiagenttrainer.config import Config, LocalExecution, SshExecution
from multiagenttrainer.errors import ConfigError
from multiagenttrainer.training import machine_names, on_machine

CONFIG = {
    "training": {"agent_command": "claude -p {prompt}", "execution": {"type": "local"}},
    "machines": [
        {
            "name": "gpu-box",
            "gpus": 2,
            "execution": {"type": "ssh", "ssh_host": "trainer@gpu-box.example.com:2222"},
            "agent_command": "codex exec {prompt}",
        },
        {"name": "docker-box", "execution": {"type": "docker", "container": "trainer"}},
    ],
}


def config() -> Config:
    return Config.model_validate(CONFIG)


def test_a_configured_machine_brings_its_execution_target_and_agent() -> None:
    training = on_machine(config(), "gpu-box").training
    assert isinstance(training.execution, SshExecution)
    assert training.execution.address() == ("trainer", "gpu-box.example.com", 2222)
    assert training.agent_command == "codex exec {prompt}"


def test_a_machine_without_an_agent_keeps_the_configured_one() -> None:
    training = on_machine(config(), "docker-box").training
    assert training.execution.type == "docker" and training.agent_command == "claude -p {prompt}"


def test_local_is_the_config_as_it_is() -> None:
    cfg = config()
    assert on_machine(cfg, "local") is cfg
    assert isinstance(cfg.training.execution, LocalExecution)


def test_an_unknown_machine_is_a_config_error_listing_the_machines() -> None:
    assert machine_names(config()) == ["local", "gpu-box", "docker-box"]
    with pytest.raises(
        ConfigError, match=r"machine 'gpu' is not configured; use one of: local, gpu-box, docker-box"
    ):
        on_machine(config(), "gpu")
