"""Agents: what changes train.py between experiments (a coding agent's command line, or the built-in one)."""

from multiagenttrainer.agents.base import Agent, AgentOutcome, AgentRequest
from multiagenttrainer.agents.builtin import BuiltinSearchAgent
from multiagenttrainer.agents.command import CommandAgent, describe_train_change
from multiagenttrainer.agents.prompt import DESCRIPTION_FILE, build_prompt
from multiagenttrainer.agents.registry import AGENT_PRESETS, make_agent, resolve_command

__all__ = [
    "AGENT_PRESETS",
    "DESCRIPTION_FILE",
    "Agent",
    "AgentOutcome",
    "AgentRequest",
    "BuiltinSearchAgent",
    "CommandAgent",
    "build_prompt",
    "describe_train_change",
    "make_agent",
    "resolve_command",
]
