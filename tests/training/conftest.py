"""Shared by the training-pipeline tests: a tiny source tree, configs, and the real `mat` command.

Training runs the built-in template for MAT_FIXED_STEPS=3 steps: deterministic and a couple of
seconds per experiment. The session's Prefect server (`prefect_api`, tests/conftest.py) is used by
every flow, in this process and in `mat` subprocesses alike.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.experiments import library_records, write_corpus_dir

ROOT = Path(__file__).resolve().parents[2]
MAT = [sys.executable, "-m", "multiagenttrainer.cli"]
AGENTS = ROOT / "tests" / "assets" / "agents"
FIXED_STEPS = "3"
COMMAND_TIMEOUT_S = 240
RESULTS_HEADER = ["commit", "val_bpb", "memory_gb", "status", "description"]


@pytest.fixture(scope="session")
def tiny_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plain directory of about 40 KB of Python (mat's own modules): enough to train and evaluate on."""
    root = tmp_path_factory.mktemp("tiny-source")
    files = sorted(
        (p for p in (ROOT / "multiagenttrainer").rglob("*.py") if 2000 < p.stat().st_size < 8000),
        key=lambda p: str(p),
    )[:10]
    for path in files:
        target = root / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return root


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A corpus directory (corpus.jsonl, corpus.txt) of about 40 KB, for runs set up without ingest."""
    records = [r for r in library_records() if 2000 < len(r["text"]) < 8000][:10]
    return write_corpus_dir(tmp_path_factory.mktemp("tiny-corpus"), records)


def write_config(directory: Path, source: Path | None, **sections: dict[str, Any]) -> Path:
    """mat.yaml in `directory`: `source` as a local_repo (or no sources), corpus and runs inside `directory`.

    `sections` are merged over the defaults per section (training={"max_experiments": 2}, ...).
    """
    document: dict[str, Any] = {
        "corpus": {"dir": str(directory / "corpus"), "staging_dir": str(directory / "staging")},
        "training": {"max_experiments": 3, "output_dir": str(directory / "runs")},
        "autoresearch": {"train_time": 30},
    }
    if source is not None:
        document["sources"] = [{"type": "local_repo", "path": str(source), "name": "tiny"}]
    for section, values in sections.items():
        document[section] = {**document.get(section, {}), **values}
    path = directory / "mat.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return path


def mat_env(**extra: str) -> dict[str, str]:
    """The environment of a `mat` subprocess: the session's Prefect server, fixed training steps."""
    return {
        **os.environ,
        "MAT_FIXED_STEPS": FIXED_STEPS,
        "OMP_NUM_THREADS": "1",
        "COLUMNS": "200",
        "NO_COLOR": "1",
        **extra,
    }


def mat(*args: str, timeout: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run `mat ARGS` to completion from the repository root."""
    return subprocess.run(
        [*MAT, *args], cwd=ROOT, env=mat_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def start_mat(*args: str, log: Path, steps: str = FIXED_STEPS) -> subprocess.Popen[bytes]:
    """Start `mat ARGS` in the background (training `steps` steps), stdout and stderr to `log`."""
    with log.open("wb") as handle:
        return subprocess.Popen(
            [*MAT, *args],
            cwd=ROOT,
            env=mat_env(MAT_FIXED_STEPS=steps),
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )


def results_rows(path: Path) -> list[list[str]]:
    """The data rows of a results.tsv (header checked), or [] while it is missing."""
    if not path.is_file():
        return []
    with path.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.reader(handle, delimiter="\t"))
    if rows:
        assert rows[0] == RESULTS_HEADER
    return [row for row in rows[1:] if len(row) == len(RESULTS_HEADER)]


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.1) -> None:
    """Poll `predicate` until it holds; fail the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def only_run_dir(runs: Path) -> Path:
    """The single run directory under `runs`."""
    (run_dir,) = [p for p in runs.iterdir() if (p / "run.json").is_file()]
    return run_dir
