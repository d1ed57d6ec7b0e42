"""make_agent picks the agent; AGENT_PRESETS match what configs/config.example.yaml documents."""

from __future__ import annotations

from pathlib import Path

import pytest

from multiagenttrainer.agents import AGENT_PRESETS, BuiltinSearchAgent, CommandAgent, make_agent
from multiagenttrainer.config import TrainingConfig
from multiagenttrainer.errors import ConfigError

EXAMPLE_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "config.example.yaml"


def test_no_command_gives_the_builtin_agent_with_the_seed() -> None:
    agent = make_agent(TrainingConfig(), seed=7)
    assert isinstance(agent, BuiltinSearchAgent) and agent.seed == 7


def test_training_command_gives_a_command_agent() -> None:
    agent = make_agent(TrainingConfig(agent_command="my-agent {prompt}"))
    assert isinstance(agent, CommandAgent)
    assert (agent.command, agent.name) == ("my-agent {prompt}", "command")


def test_the_machine_command_wins_over_the_training_command() -> None:
    agent = make_agent(
        TrainingConfig(agent_command="global {prompt}"), agent_command="on-this-machine {prompt}"
    )
    assert isinstance(agent, CommandAgent) and agent.command == "on-this-machine {prompt}"


@pytest.mark.parametrize("preset", sorted(AGENT_PRESETS))
def test_a_preset_expands_to_its_command_line(preset: str) -> None:
    agent = make_agent(TrainingConfig(agent_command=f"preset:{preset}"))
    assert isinstance(agent, CommandAgent)
    assert (agent.command, agent.name) == (AGENT_PRESETS[preset], preset)


def test_an_unknown_preset_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="preset:aider, preset:claude|preset:claude, preset:codex"):
        make_agent(TrainingConfig(agent_command="preset:cursor"))


def test_agent_mode_without_a_command_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="training.mode: agent needs training.agent_command"):
        make_agent(TrainingConfig(mode="agent"))


@pytest.mark.parametrize("preset", sorted(AGENT_PRESETS))
def test_every_preset_is_documented_in_the_example_config(preset: str) -> None:
    documented = EXAMPLE_CONFIG.read_text()
    assert f"preset:{preset}" in documented
    assert AGENT_PRESETS[preset] in documented
