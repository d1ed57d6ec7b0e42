"""How `mat train` and the train flow end when things go wrong: a missing source, a missing corpus, a
config error, Ctrl-C in the middle of training."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import yaml

from flows.train import run_train
from multiagenttrainer.experiments.progress import NullTrainProgress
from multiagenttrainer.experiments.run_state import load_run
from tests.support.experiments import processes_with
from tests.training.conftest import FIXED_STEPS, mat, only_run_dir, start_mat, wait_until, write_config

pytestmark = pytest.mark.integration


class CorpusRecorder(NullTrainProgress):
    """Keeps the corpus_ready events."""

    def __init__(self) -> None:
        self.corpora: list[tuple[str, str]] = []

    def corpus_ready(self, corpus_dir: str, status: str) -> None:
        self.corpora.append((corpus_dir, status))


def test_a_failed_source_is_noted_and_training_goes_on_with_the_others(
    prefect_api: str, tiny_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MAT_FIXED_STEPS", FIXED_STEPS)
    config = write_config(tmp_path, tiny_source, training={"max_experiments": 1})
    document = yaml.safe_load(config.read_text())
    document["sources"].append({"type": "local_repo", "path": str(tmp_path / "gone"), "name": "gone"})
    config.write_text(yaml.safe_dump(document))
    progress = CorpusRecorder()

    summary = run_train(config, name="partial", progress=progress)

    assert summary["status"] == "completed" and summary["experiments"] == 1
    (note,) = summary["notes"]
    assert note.startswith("some sources failed and were left out of the corpus: gone (path ")
    assert progress.corpora == [(str(tmp_path / "corpus"), "built")]


def test_cli_exit_codes_config_error_2_run_failure_1(prefect_api: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("training:\n  max_experiments: 0\n")
    result = mat("train", "--config", str(bad))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"training.max_experiments: input should be greater than or equal to 1 ({bad}:2)" in result.stderr

    agent_mode = write_config(tmp_path, None, training={"mode": "agent"})
    result = mat("train", "--config", str(agent_mode))
    assert result.returncode == 2 and "training.mode: agent needs training.agent_command" in result.stderr

    no_corpus = write_config(tmp_path, None)
    result = mat("train", "--config", str(no_corpus), "--name", "nothing")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"error: no corpus at {tmp_path / 'corpus'}" in result.stderr
    assert load_run(only_run_dir(tmp_path / "runs")).status == "failed"


def test_ctrl_c_stops_training_marks_the_run_interrupted_and_says_how_to_resume(
    prefect_api: str, tiny_source: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path, tiny_source)
    log = tmp_path / "mat.log"
    process = start_mat("train", "--config", str(config), "--name", "ctrlc", log=log, steps="1000000")
    try:
        runs = tmp_path / "runs"

        def training() -> bool:
            run_files = list(runs.glob("*/run.json")) if runs.is_dir() else []
            current = json.loads(run_files[0].read_text())["current"] if run_files else []
            return any(c["phase"] == "training" for c in current)

        wait_until(training, 120, "the baseline to start training")
        workspace = only_run_dir(runs) / "workspace"
        wait_until(
            lambda: bool(processes_with("train.py") and trainers_in(workspace)), 30, "train.py to start"
        )
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 130, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)

    run_dir = only_run_dir(runs)
    assert f"interrupted; continue it with `mat train --resume {run_dir.name}`" in log.read_text()
    state = load_run(run_dir)
    assert state.status == "interrupted" and state.current == [] and state.experiments == []
    assert trainers_in(run_dir / "workspace") == []


def trainers_in(workspace: Path) -> list[int]:
    """Live train.py processes working in `workspace`."""
    found = []
    for pid in processes_with("train.py"):
        try:
            cwd = Path(f"/proc/{pid}/cwd").readlink()
        except OSError:
            continue
        if cwd == workspace.resolve():
            found.append(pid)
    return found
