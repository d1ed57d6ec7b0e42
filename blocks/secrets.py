"""Tokens from Prefect Secret blocks, for machines where the environment does not hold them.

A source names the environment variable with its token (`token_env`, GITHUB_TOKEN by default).
When that variable is unset, the Secret block named after it is used instead: GITHUB_TOKEN ->
"github-token". Save one with `save_secret("GITHUB_TOKEN", value)` or in the Prefect UI.
Values are handed to sources through SourceContext.env only; they are never logged.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping

from prefect.blocks.system import Secret

log = logging.getLogger(__name__)


def secret_block_name(env_name: str) -> str:
    """The Secret block that stands in for an environment variable (GITHUB_TOKEN -> github-token)."""
    name = re.sub(r"[^a-z0-9]+", "-", env_name.lower()).strip("-")
    if not name:
        raise ValueError(f"{env_name!r} cannot name a Secret block; use letters, digits and underscores")
    return name


def load_secret(env_name: str) -> str | None:
    """The value of the Secret block for `env_name`, or None when there is no such block."""
    block_name = secret_block_name(env_name)
    try:
        value = Secret.load(block_name).get()  # type: ignore[union-attr]
    except ValueError:  # Prefect's "Unable to find block document named ..."
        return None
    if not isinstance(value, str) or not value:
        log.warning("Secret block %r does not hold a text token; ignoring it", block_name)
        return None
    return value


def save_secret(env_name: str, value: str) -> str:
    """Store a token as the Secret block for `env_name` (overwriting it); returns the block name."""
    block_name = secret_block_name(env_name)
    Secret(value=value).save(block_name, overwrite=True)
    return block_name


def environment_with_secrets(
    env_names: Iterable[str | None], env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A copy of the environment where each named variable that is unset comes from its Secret block."""
    merged = dict(os.environ if env is None else env)
    for env_name in {name for name in env_names if name}:
        if merged.get(env_name):
            continue
        value = load_secret(env_name)
        if value is not None:
            log.info(
                "%s is not set; using the Prefect Secret block %r", env_name, secret_block_name(env_name)
            )
            merged[env_name] = value
    return merged
