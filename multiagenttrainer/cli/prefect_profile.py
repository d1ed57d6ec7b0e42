"""The Prefect profile `mat`: what lets the plain `prefect` command (workers, `prefect deployment run`, the
UI's links) talk to mat's local server and share mat's result storage.

`mat server start` writes it with Prefect's own profiles API into the profiles file the user's `prefect`
command reads (PREFECT_PROFILES_PATH, else $PREFECT_HOME/profiles.toml, else ~/.prefect/profiles.toml),
and makes it the active profile. It holds:

- PREFECT_API_URL: the server;
- PREFECT_RESULTS_LOCAL_STORAGE_PATH: mat's result storage ($MAT_HOME/prefect/storage), so a flow run
  that a worker starts finds the cache entries that `mat ingest` wrote, and the other way round;
- PREFECT_LOGGING_EXTRA_LOGGERS=multiagenttrainer: mat's progress lines reach the flow runs' logs.

The file is read before mat points PREFECT_HOME at its own directory, so its location is worked out
from the environment the user started mat with (`user_profiles_path`).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from multiagenttrainer.cli.prefect_server import EXTRA_LOGGER, mat_home, results_storage_path
from multiagenttrainer.errors import ServerError

PROFILE = "mat"
FALLBACK_PROFILE = "ephemeral"  # Prefect's own default profile
PREVIOUS_PROFILE_FILE = "previous-prefect-profile"  # in $MAT_HOME: the profile to switch back to


@dataclass(frozen=True)
class ProfileWritten:
    """Where the profile went and which profile was active before it."""

    path: Path
    previous: str | None


def user_profiles_path(env: Mapping[str, str] | None = None) -> Path:
    """The profiles file the user's plain `prefect` command reads."""
    env = os.environ if env is None else env
    if env.get("PREFECT_PROFILES_PATH"):
        return Path(env["PREFECT_PROFILES_PATH"]).expanduser()
    home = Path(env["PREFECT_HOME"]).expanduser() if env.get("PREFECT_HOME") else Path.home() / ".prefect"
    return home / "profiles.toml"


def write_mat_profile(api_url: str, path: Path | None = None) -> ProfileWritten:
    """Create or update the profile `mat` for the server at `api_url` and make it the active one."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_LOGGING_EXTRA_LOGGERS,
        PREFECT_PROFILES_PATH,
        PREFECT_RESULTS_LOCAL_STORAGE_PATH,
        temporary_settings,
    )
    from prefect.settings.profiles import load_profiles, save_profiles

    path = path or user_profiles_path()
    settings = {
        PREFECT_API_URL: api_url,
        PREFECT_RESULTS_LOCAL_STORAGE_PATH: str(results_storage_path()),
        PREFECT_LOGGING_EXTRA_LOGGERS: EXTRA_LOGGER,
    }
    try:
        with temporary_settings(updates={PREFECT_PROFILES_PATH: path}):
            profiles = load_profiles(include_defaults=False)
            previous = profiles.active_name
            profiles.update_profile(PROFILE, settings)
            profiles.set_active(PROFILE)
            save_profiles(profiles)
    except (OSError, ValueError) as exc:  # a file we cannot write, or one that is not valid TOML
        raise ServerError(
            f"could not write the Prefect profile {PROFILE!r} to {path}: {exc}; fix or move that file, "
            "then run `mat server start` again"
        ) from exc
    return ProfileWritten(path, remembered_previous_profile(previous))


def remembered_previous_profile(active: str | None) -> str | None:
    """The profile that was active before mat's first took over (kept in $MAT_HOME across restarts)."""
    record = mat_home() / PREVIOUS_PROFILE_FILE
    if active is not None and active != PROFILE:
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(active, encoding="utf-8")
        return active
    try:
        return record.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def switch_back_command(previous: str | None) -> str:
    """The command that makes the user's earlier profile active again."""
    return f"prefect profile use {previous or FALLBACK_PROFILE}"


def mat_profile_exists(path: Path | None = None) -> bool:
    """Whether the user's profiles file holds the profile `mat` (read without importing prefect)."""
    try:
        document = tomllib.loads((path or user_profiles_path()).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    profiles = document.get("profiles")
    return isinstance(profiles, dict) and PROFILE in profiles
