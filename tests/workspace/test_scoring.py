"""The independent evaluation: score_checkpoint.py run as mat runs it, on a real built-in workspace, and
the pure verdict that turns its result into a val_bpb or a crash reason."""

from __future__ import annotations

import importlib.machinery
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
import torch

from multiagenttrainer.config import AutoresearchConfig
from multiagenttrainer.workspace import gitops
from multiagenttrainer.workspace.evaluator import load_evaluator
from multiagenttrainer.workspace.scoring import prepare_scoring, read_result, verdict
from multiagenttrainer.workspace.setup import Workspace, setup_workspace
from tests.support.experiments import library_records, write_corpus_dir

BIGRAM_TRAIN_PY = '''\
"""A bigram model: each byte's logits depend on that byte only, so it is causal by construction."""
import sys

import torch

from prepare import VOCAB_SIZE

WIDTH = 16
{extra}

def build_model():
    return torch.nn.Sequential(torch.nn.Embedding(VOCAB_SIZE, WIDTH), torch.nn.Linear(WIDTH, VOCAB_SIZE))


if __name__ == "__main__":
    print("training would happen here")
'''


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """A built-in workspace (dev split in data/val.bin, held-out split in the run directory)."""
    root = tmp_path_factory.mktemp("scoring")
    records = [r for r in library_records() if 2000 < len(r["text"]) < 8000][:12]
    records[0]["split"] = "val"
    corpus = write_corpus_dir(root / "corpus", records)
    return setup_workspace(root / "run", corpus, AutoresearchConfig(train_time=5), run_tag="s")


def commit_model(workspace: Workspace, extra: str = "", width: int = 16) -> tuple[str, torch.nn.Module]:
    """Commit the bigram train.py and save a checkpoint of a (seeded, untrained) model of `width`."""
    (workspace.path / "train.py").write_text(BIGRAM_TRAIN_PY.format(extra=extra))
    commit = gitops.commit_paths(workspace.path, "bigram", ["train.py"])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(256, width), torch.nn.Linear(width, 256))
    torch.save({"model": model.state_dict()}, workspace.path / "checkpoint.pt")
    return commit, model


def score(workspace: Workspace, commit: str) -> dict[str, object]:
    run_dir = workspace.path.parent
    job = prepare_scoring(run_dir, workspace.path, "builtin", [], commit, load_evaluator(run_dir))
    assert job is not None
    subprocess.run(job.command, cwd=job.directory, check=False, capture_output=True, timeout=300)
    assert not (job.directory / "spec.json").exists()  # read, then deleted before the model is loaded
    result = read_result(job.result_path)
    assert result is not None
    return result


def template_prepare(data_dir: Path, source: Path) -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("template_prepare_under_test", str(source))
    module = ModuleType(loader.name)
    module.__file__ = str(source)
    loader.exec_module(module)
    module.DATA_DIR = data_dir
    return module


def test_an_honest_checkpoint_is_scored_by_the_base_evaluator(workspace: Workspace) -> None:
    commit, model = commit_model(workspace)
    result = score(workspace, commit)
    assert result["ok"] is True and result["device"] == "cpu"
    prepare = template_prepare(workspace.path / "data", workspace.path / "prepare.py")
    expected_dev = prepare.evaluate_bpb(model, 32)  # the same evaluator, in this process
    scores = result["scores"]
    assert isinstance(scores, dict) and scores["dev"] == pytest.approx(expected_dev, abs=1e-9)
    holdout = template_prepare(workspace.path.parent / "evaluator" / "holdout", workspace.path / "prepare.py")
    assert scores["holdout"] == pytest.approx(holdout.evaluate_bpb(model, 32), abs=1e-9)
    causality = result["causality"]
    assert isinstance(causality, dict) and causality["passed"] and causality["max_difference"] == 0.0
    assert not (workspace.path / "checkpoint.pt").exists()  # moved into the scoring directory


def test_broken_contracts_are_reported_not_scored(workspace: Workspace) -> None:
    commit, _ = commit_model(workspace, extra="sys.exit(3)  # training at import time")
    assert "keep training under __main__" in str(score(workspace, commit)["error"])
    commit, _ = commit_model(workspace, width=8)
    message = str(score(workspace, commit)["error"])
    assert message.startswith("train.py's model could not be scored: the checkpoint does not fit")
    (workspace.path / "checkpoint.pt").unlink(missing_ok=True)
    run_dir = workspace.path.parent
    assert prepare_scoring(run_dir, workspace.path, "builtin", [], commit, load_evaluator(run_dir)) is None


def test_verdicts() -> None:
    causal = {"passed": True, "cut": 5, "max_difference": 0.0}
    ok = {"ok": True, "device": "cpu", "scores": {"dev": 6.861, "holdout": 6.9}, "causality": causal}
    honest = verdict("builtin", 6.8612, ok)
    assert (honest.val_bpb, honest.reason) == (6.9, None) and honest.evaluation["rescored_val_bpb"] == 6.861
    faked = verdict("builtin", 0.123, ok)
    assert faked.val_bpb is None and faked.reason == (
        "val_bpb printed by train.py (0.123000) does not match the independent evaluation of its "
        "checkpoint (6.861000)"
    )
    assert verdict("builtin", 6.89, ok).reason is None  # within 0.5 % of 6.861 (bf16 kernels differ)
    assert verdict("builtin", 6.90, ok).reason is not None  # beyond it
    peeking = verdict(
        "builtin", 6.861, {**ok, "causality": {"passed": False, "cut": 9, "max_difference": 3.2}}
    )
    assert "depend on later bytes of its input" in (peeking.reason or "") and peeking.val_bpb is None
    autoresearch = verdict("autoresearch", 1.0, {**ok, "scores": {"val": 1.001}})
    assert (autoresearch.val_bpb, autoresearch.reason) == (1.001, None)
    failed = verdict("builtin", 1.0, {"ok": False, "error": "boom"})
    assert failed.reason == "the independent evaluation failed: boom"
