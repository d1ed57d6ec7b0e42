"""The Prefect profile `mat` that `mat server start` writes for the plain `prefect` command."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from multiagenttrainer.cli import prefect_profile
from multiagenttrainer.cli.prefect_profile import (
    mat_profile_exists,
    switch_back_command,
    user_profiles_path,
    write_mat_profile,
)
from multiagenttrainer.errors import ServerError

USER_PROFILES = """\
active = "work"

[profiles.work]
PREFECT_API_URL = "http://prefect.example.com/api"
"""


@pytest.fixture
def mat_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "mat-home"
    monkeypatch.setenv("MAT_HOME", str(home))
    return home


def test_the_profiles_file_is_the_one_the_users_prefect_command_reads(tmp_path: Path) -> None:
    explicit = {"PREFECT_PROFILES_PATH": str(tmp_path / "p.toml"), "PREFECT_HOME": str(tmp_path / "h")}
    assert user_profiles_path(explicit) == tmp_path / "p.toml"
    assert user_profiles_path({"PREFECT_HOME": str(tmp_path / "h")}) == tmp_path / "h" / "profiles.toml"
    assert user_profiles_path({}) == Path.home() / ".prefect" / "profiles.toml"


def test_the_profile_points_at_the_server_and_mats_storage_and_becomes_active(
    tmp_path: Path, mat_home: Path
) -> None:
    path = tmp_path / "profiles.toml"
    path.write_text(USER_PROFILES, encoding="utf-8")

    written = write_mat_profile("http://127.0.0.1:4321/api", path)

    document = tomllib.loads(path.read_text(encoding="utf-8"))
    assert document["active"] == "mat"
    assert document["profiles"]["work"] == {"PREFECT_API_URL": "http://prefect.example.com/api"}
    assert document["profiles"]["mat"] == {
        "PREFECT_API_URL": "http://127.0.0.1:4321/api",
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(mat_home / "prefect" / "storage"),
        "PREFECT_LOGGING_EXTRA_LOGGERS": "multiagenttrainer",
    }
    assert written.path == path and switch_back_command(written.previous) == "prefect profile use work"
    assert mat_profile_exists(path)

    again = write_mat_profile("http://127.0.0.1:4200/api", path)  # a restart on another port
    assert (
        tomllib.loads(path.read_text())["profiles"]["mat"]["PREFECT_API_URL"] == "http://127.0.0.1:4200/api"
    )
    assert again.previous == "work"  # remembered, though `mat` was the active profile this time


def test_without_a_profiles_file_the_way_back_is_prefects_default(tmp_path: Path, mat_home: Path) -> None:
    path = tmp_path / "new" / "profiles.toml"
    written = write_mat_profile("http://127.0.0.1:4321/api", path)
    assert path.is_file() and written.previous is None
    assert switch_back_command(written.previous) == f"prefect profile use {prefect_profile.FALLBACK_PROFILE}"


def test_the_plain_prefect_command_reads_the_profile(tmp_path: Path, mat_home: Path) -> None:
    path = tmp_path / "profiles.toml"
    write_mat_profile("http://127.0.0.1:4321/api", path)
    env = {
        "HOME": str(tmp_path),
        "PATH": str(Path(sys.executable).parent),
        "PREFECT_PROFILES_PATH": str(path),
    }
    shown = subprocess.run(
        [sys.executable, "-m", "prefect", "config", "view"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert "PREFECT_PROFILE='mat'" in shown.stdout
    assert "PREFECT_API_URL='http://127.0.0.1:4321/api'" in shown.stdout


def test_a_profiles_file_that_is_not_toml_is_reported(tmp_path: Path, mat_home: Path) -> None:
    path = tmp_path / "profiles.toml"
    path.write_text("active = [unclosed\n", encoding="utf-8")
    with pytest.raises(ServerError, match=f"could not write the Prefect profile 'mat' to {path}"):
        write_mat_profile("http://127.0.0.1:4321/api", path)
