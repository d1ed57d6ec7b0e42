"""Set-up failures become MatErrors that name the repository, file or setting and say what to do."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from multiagenttrainer.config import AutoresearchConfig, TrainingConfig
from multiagenttrainer.errors import ConfigError, ExperimentError
from multiagenttrainer.experiments.results import read_results
from multiagenttrainer.experiments.runner import Runner
from multiagenttrainer.workspace.autoresearch import prepare_autoresearch_workspace
from tests.support.git_servers import GitHttpServer, free_port
from tests.workspace.autoresearch.conftest import PIDFILE_ENV, PublishedRepo, set_up

pytestmark = pytest.mark.integration


def test_a_missing_repository_is_a_config_error(
    served_http: GitHttpServer, mat_corpus: Path, tmp_path: Path
) -> None:
    url = f"{served_http.url}/nobody/missing.git"
    with pytest.raises(ConfigError) as caught:
        set_up(url, mat_corpus, tmp_path)
    message = str(caught.value)
    assert "autoresearch.repo" in message and url in message
    assert not (tmp_path / "workspace").exists()  # a retry starts clean


def test_an_unreachable_host_is_a_run_failure(mat_corpus: Path, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/karpathy/autoresearch.git"
    with pytest.raises(ExperimentError, match="cannot clone autoresearch.repo .*connection refused"):
        set_up(url, mat_corpus, tmp_path)


def test_an_unknown_branch_lists_the_branches(
    fake_autoresearch: PublishedRepo, mat_corpus: Path, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as caught:
        set_up(str(fake_autoresearch.bare), mat_corpus, tmp_path, branch="main")
    message = str(caught.value)
    assert message.startswith("autoresearch.branch: 'main' is not a branch of")
    assert "(branches: cpu, master)" in message


def test_a_path_that_does_not_exist(mat_corpus: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"autoresearch.repo: .*nowhere does not exist"):
        set_up(str(tmp_path / "nowhere"), mat_corpus, tmp_path / "run")


def test_a_directory_that_is_not_a_repository(mat_corpus: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "prepare.py").write_text("CACHE_DIR = 'x'\n")
    with pytest.raises(ConfigError, match="no git repository at"):
        set_up(str(plain), mat_corpus, tmp_path / "run")


def test_a_prepare_py_without_the_cache_dir_line(
    no_cache_line_repo: PublishedRepo, mat_corpus: Path, tmp_path: Path
) -> None:
    with pytest.raises(ExperimentError) as caught:
        set_up(str(no_cache_line_repo.bare), mat_corpus, tmp_path)
    message = str(caught.value)
    assert str(tmp_path / "workspace" / "prepare.py") in message
    assert "0 top-level `CACHE_DIR = ...` assignments" in message
    assert 'CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "autoresearch")' in message


def test_a_failing_tokenizer_step_reports_its_log(
    failing_tokenizer_repo: PublishedRepo, mat_corpus: Path, tmp_path: Path
) -> None:
    with pytest.raises(ExperimentError) as caught:
        set_up(str(failing_tokenizer_repo.bare), mat_corpus, tmp_path)
    message = str(caught.value)
    assert "exited with code 3" in message
    assert str(tmp_path / "logs" / "prepare.log") in message
    assert "tokenizer exploded on purpose" in message  # the log tail


def test_a_hanging_tokenizer_step_is_killed(
    hanging_tokenizer_repo: PublishedRepo,
    mat_corpus: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pidfile = tmp_path / "tokenizer.pid"
    monkeypatch.setenv(PIDFILE_ENV, str(pidfile))
    cfg = AutoresearchConfig(repo=str(hanging_tokenizer_repo.bare))
    with pytest.raises(ExperimentError, match="took over 2 s and was stopped"):
        prepare_autoresearch_workspace(
            cfg, mat_corpus, tmp_path / "workspace", tmp_path, tokenizer_timeout_s=2
        )
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_settings_are_checked_before_cloning(
    fake_autoresearch: PublishedRepo, mat_corpus: Path, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="autoresearch.repo is not set"):
        prepare_autoresearch_workspace(AutoresearchConfig(), mat_corpus, tmp_path / "workspace", tmp_path)
    with pytest.raises(ConfigError, match=r"autoresearch.program_md: .*missing.md is not a file"):
        set_up(str(fake_autoresearch.bare), mat_corpus, tmp_path, program_md=str(tmp_path / "missing.md"))
    assert not (tmp_path / "workspace").exists()


def test_a_used_workspace_is_refused(
    fake_autoresearch: PublishedRepo, mat_corpus: Path, tmp_path: Path
) -> None:
    (tmp_path / "workspace").mkdir()
    (tmp_path / "workspace" / "notes.txt").write_text("someone else's")
    with pytest.raises(ExperimentError, match="already exists and is not empty"):
        set_up(str(fake_autoresearch.bare), mat_corpus, tmp_path)


def test_a_baseline_missing_a_package_stops_the_run_with_the_fix(
    missing_package_repo: PublishedRepo, mat_corpus: Path, tmp_path: Path
) -> None:
    """An agent-less run (the built-in search would edit train.py next) stops after the baseline."""
    runner = Runner(
        AutoresearchConfig(repo=str(missing_package_repo.bare), train_time=60),
        TrainingConfig(max_experiments=3),
        "nopkg",
        output_dir=tmp_path,
    )
    workspace = runner.setup_workspace(mat_corpus)
    workspace.env["MAT_FIXED_STEPS"] = "1"
    with pytest.raises(ExperimentError) as raised:
        asyncio.run(runner.run_experiments(workspace))
    message = str(raised.value)
    assert message.startswith("the baseline crashed: the interpreter mat trains with")
    assert "cannot import 'mat_fixture_missing_kernels'" in message
    assert "(those in its pyproject.toml), or install uv so mat runs `uv run train.py`" in message
    run_dir = tmp_path / str(runner.run_id)
    assert [row.status for row in read_results(run_dir / "results.tsv")] == ["crash"]
    assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"
