"""mat's work pools: `mat-local`, and `mat-<machine>` per configured machine, with their limits.

Kept apart from register.py (and free of Prefect imports), so `mat worker start` knows the pools without
loading Prefect.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from multiagenttrainer.config import Config, MachineConfig
from multiagenttrainer.errors import ConfigError

DEFAULT_WORK_POOL = "mat-local"
POOL_PREFIX = "mat-"


@dataclass(frozen=True)
class Pool:
    """A work pool mat registers: its name and its limit of flow runs at once (None: no limit)."""

    name: str
    limit: int | None = None


def pool_name(machine: str) -> str:
    """`mat-gpu-large` for the machine `gpu-large` (work pool names: letters, digits, dashes)."""
    return POOL_PREFIX + (re.sub(r"[^a-z0-9]+", "-", machine.lower()).strip("-") or "machine")


def machine_pool(machine: MachineConfig) -> Pool:
    """A machine's pool; a GPU machine (gpus > 0) runs at most that many flow runs at once."""
    return Pool(pool_name(machine.name), machine.gpus or None)


def pools_for(cfg: Config | None, default_pool: str = DEFAULT_WORK_POOL) -> list[Pool]:
    """`mat-local` (or `default_pool`) and one pool per configured machine."""
    pools = [Pool(default_pool), *(machine_pool(m) for m in (cfg.machines if cfg else []))]
    names = [pool.name for pool in pools]
    clashes = sorted({name for name in names if names.count(name) > 1})
    if clashes:
        raise ConfigError(f"machines: names that give the same work pool ({', '.join(clashes)}); rename one")
    return pools
