"""Machine and SES settings kept in Prefect blocks, so neither the config file nor a deployment's parameters
(both visible in the UI) need to carry hosts, key paths or addresses.

- A machine named in the config without an `execution:` takes its settings from the `mat-machine` block
  of the same name (`gpu_large` -> `gpu-large`): execution, agent_command and gpus. What the config file
  sets always wins.
- Without `notifications.ses` in the config, the `mat-ses-alerts` block named `default` is used when it
  exists.

`mat deploy` registers both block types, so they can be created in the UI (Blocks > +), or in Python:

    MachineSettings(execution={"type": "ssh", "ssh_host": "trainer1"}, gpus=1).save("gpu-large")
    SesAlertSettings(from_email="alerts@example.com", to_emails=["oncall@example.com"]).save("default")

The flows apply them when they load their config (`with_setting_blocks`); the library never sees a block.
"""

from __future__ import annotations

import re
from typing import Any, cast

from prefect.blocks.core import Block
from pydantic import Field, ValidationError

from multiagenttrainer.config import Config, MachineConfig, NotificationsConfig, SesConfig
from multiagenttrainer.errors import ConfigError

DEFAULT_SES_BLOCK = "default"


class MachineSettings(Block):
    """How to reach one training machine (the `execution:` of a `machines:` entry) and what it runs."""

    _block_type_name = "mat machine"
    _block_type_slug = "mat-machine"
    _description = "A machine of mat's `machines:` list: execution target, agent command, GPU count."

    execution: dict[str, Any] = Field(
        default_factory=lambda: {"type": "local"},
        description="As in the config: {type: ssh, ssh_host: ..., ssh_key: ...} or {type: docker, ...}",
    )
    agent_command: str | None = Field(None, description="Overrides training.agent_command on this machine")
    gpus: int = Field(0, ge=0, description="GPUs: the machine's work pool runs this many flow runs at once")


class SesAlertSettings(Block):
    """Where mat's failure alerts go (the `notifications.ses` section)."""

    _block_type_name = "mat SES alerts"
    _block_type_slug = "mat-ses-alerts"
    _description = "Amazon SES alerts for crashed experiments and failed runs (notifications.ses)."

    from_email: str = Field(description="A sender address verified in SES")
    to_emails: list[str] = Field(min_length=1)
    region: str | None = None
    subject_prefix: str = "[MultiAgentTrainer]"


BLOCK_TYPES: tuple[type[Block], ...] = (MachineSettings, SesAlertSettings)


def block_name(name: str) -> str:
    """A Prefect block document name (lowercase letters, digits, dashes) for a machine's name."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "machine"


def register_block_types() -> list[str]:
    """Register mat's block types with the server (so the UI can create them); their slugs."""
    for block_type in BLOCK_TYPES:
        block_type.register_type_and_schema()
    return [block_type.get_block_type_slug() for block_type in BLOCK_TYPES]


def load_block(block_type: type[Block], name: str) -> dict[str, Any] | None:
    """A saved block's fields, or None when there is no block of that type and name."""
    try:
        block = cast(Block, block_type.load(name))  # sync here: flows and the CLI are synchronous
    except ValueError:  # Prefect's "Unable to find block document named ..." (also: type not registered)
        return None
    return {name: getattr(block, name) for name in type(block).model_fields}  # the settings, not Prefect's


def machine_with_block(machine: MachineConfig) -> MachineConfig:
    """The machine, with what its config entry leaves out taken from its `mat-machine` block."""
    if "execution" in machine.model_fields_set:
        return machine
    saved = load_block(MachineSettings, block_name(machine.name))
    if saved is None:
        return machine
    try:
        return MachineConfig.model_validate({**saved, **machine.model_dump(exclude_unset=True)})
    except ValidationError as exc:
        problems = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(
            [f"mat-machine block {block_name(machine.name)!r}: {problem}" for problem in problems]
        ) from None


def ses_from_block() -> SesConfig | None:
    """The SES settings of the `mat-ses-alerts/default` block, if there is one."""
    saved = load_block(SesAlertSettings, DEFAULT_SES_BLOCK)
    return None if saved is None else SesConfig.model_validate(saved)


def with_setting_blocks(cfg: Config) -> Config:
    """The config with machine and SES settings it leaves out filled in from their blocks."""
    machines = [machine_with_block(machine) for machine in cfg.machines]
    notifications = cfg.notifications
    if notifications.ses is None:
        ses = ses_from_block()
        if ses is not None:
            notifications = NotificationsConfig(ses=ses)
    return cfg.model_copy(update={"machines": machines, "notifications": notifications})
