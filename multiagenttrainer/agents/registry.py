"""Which agent an experiment uses: a configured command line (or a preset), else the built-in search.

training.agent_command: claude -p {prompt} ...     any command line with {prompt} / {prompt_file}
training.agent_command: preset:claude              one of AGENT_PRESETS below
machines[i].agent_command                          overrides training.agent_command on that machine
(none)                                             BuiltinSearchAgent (harness mode only)
"""

from __future__ import annotations

from multiagenttrainer.agents.base import Agent
from multiagenttrainer.agents.builtin import BuiltinSearchAgent
from multiagenttrainer.agents.command import CommandAgent
from multiagenttrainer.config import TrainingConfig
from multiagenttrainer.errors import ConfigError

PRESET_PREFIX = "preset:"

# Harness mode needs only file edits; agent mode also runs git and python (see config.example.yaml).
AGENT_PRESETS: dict[str, str] = {
    "claude": 'claude -p {prompt} --allowedTools "Bash,Read,Edit" --permission-mode acceptEdits',
    "codex": "codex exec --sandbox workspace-write {prompt}",
    "aider": "aider --yes-always --no-auto-commits --no-gitignore --message-file {prompt_file} train.py",
}


def resolve_command(command: str) -> tuple[str, str]:
    """(agent name, command line) for a configured value; `preset:NAME` expands to AGENT_PRESETS[NAME]."""
    text = command.strip()
    if not text.startswith(PRESET_PREFIX):
        return "command", text
    preset = text[len(PRESET_PREFIX) :].strip()
    if preset not in AGENT_PRESETS:
        raise ConfigError(
            f"training.agent_command: unknown preset {preset!r}; use one of "
            f"{', '.join(PRESET_PREFIX + name for name in AGENT_PRESETS)} or a full command line"
        )
    return preset, AGENT_PRESETS[preset]


def make_agent(training_cfg: TrainingConfig, agent_command: str | None = None, seed: int = 0) -> Agent:
    """The agent for one machine: its own agent_command wins over training.agent_command; none = built-in."""
    command = agent_command or training_cfg.agent_command
    if command and command.strip():
        name, line = resolve_command(command)
        return CommandAgent(line, name=name)
    if training_cfg.mode == "agent":
        raise ConfigError(
            "training.mode: agent needs training.agent_command (the built-in agent cannot run experiments "
            "itself); set a command such as preset:claude, or use mode: harness"
        )
    return BuiltinSearchAgent(seed=seed)
