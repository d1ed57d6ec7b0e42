"""The independent evaluation of an experiment, mat's side: what score_checkpoint.py needs, and its verdict.

    <run_dir>/scoring/       rebuilt for every experiment
        train.py             the trained commit's train.py (from git: the run may have changed the work tree)
        prepare.py           the base commit's prepare.py (the evaluator's recorded copy)
        checkpoint.pt        moved out of the workspace once training has ended
        spec.json            read, then deleted, by the scorer
        result.json          the scores, the device, the causality check

The experiment loop runs `ScoringJob.command` through its executor (a timeout kills it like a training
run) and turns the result into a verdict with `verdict`. What is compared and what is recorded:

    built-in      train.py prints val_bpb on data/val.bin (the dev split); mat re-scores the checkpoint on
                  that split (must agree with the printed value) and on the held-out split, which is the
                  val_bpb recorded
    autoresearch  (with autoresearch.verify) mat re-scores the checkpoint on prepare.py's own val shard; it
                  must agree with the printed value and is the val_bpb recorded
"""

from __future__ import annotations

import json
import math
import secrets
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multiagenttrainer.atomic import write_json_atomically
from multiagenttrainer.workspace import gitops
from multiagenttrainer.workspace.evaluator import Evaluator

SCORER = Path(__file__).with_name("score_checkpoint.py")
SCORING_DIR = "scoring"
CHECKPOINT_FILE = "checkpoint.pt"
PREPARE_FILE = "prepare.py"
BUILTIN_BATCH_SIZE = 32  # windows per forward pass: speed only, the windows scored are fixed
DEFAULT_EVAL_BATCH_SIZE = 8
TOLERANCE_ABS = 0.002  # printed and re-scored val_bpb may differ by this much (bf16 kernels, batch shapes)...
TOLERANCE_REL = 0.005  # ...or by this share of the value, whichever is larger


@dataclass(frozen=True)
class ScoringJob:
    """A prepared independent evaluation: the command to run (anywhere cwd) and where its result goes."""

    directory: Path
    command: list[str]
    result_path: Path


@dataclass(frozen=True)
class Verdict:
    """What the independent evaluation decided: the val_bpb to record, or why the experiment crashed."""

    val_bpb: float | None
    reason: str | None
    evaluation: dict[str, Any]


def reset_scoring_dir(run_dir: Path) -> Path:
    """An empty <run_dir>/scoring."""
    directory = run_dir / SCORING_DIR
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    return directory


def take_checkpoint(workspace: Path, directory: Path) -> bool:
    """Move the workspace's checkpoint.pt (a regular file) into `directory`; whether there was one."""
    source = workspace / CHECKPOINT_FILE
    if source.is_symlink() or not source.is_file():
        gitops.delete_path(workspace, CHECKPOINT_FILE)
        return False
    shutil.move(source, directory / CHECKPOINT_FILE)
    return True


def base_prepare(evaluator: Evaluator) -> Path:
    """mat's copy of the base commit's prepare.py."""
    for fixed in evaluator.files:
        if fixed.root == str(evaluator.workspace) and fixed.path == PREPARE_FILE:
            return evaluator.object_path(fixed.sha256)
    raise ValueError("the evaluator has no prepare.py")


def scoring_splits(kind: str, workspace: Path, run_dir: Path) -> dict[str, str | None]:
    """The data each split is scored on: the built-in's dev and held-out splits, autoresearch's own val."""
    if kind == "builtin":
        return {"dev": str(workspace / "data"), "holdout": str(run_dir / "evaluator" / "holdout")}
    return {"val": None}


def eval_batch_size(kind: str, train_source: str) -> int:
    """The batch size to score with: fixed for the built-in; train.py's own for autoresearch, whose
    evaluate_bpb scores EVAL_TOKENS // (batch * MAX_SEQ_LEN) whole batches."""
    if kind == "builtin":
        return BUILTIN_BATCH_SIZE
    from multiagenttrainer.workspace.autoresearch import read_constants

    try:
        constants = read_constants(train_source)
    except SyntaxError:
        return DEFAULT_EVAL_BATCH_SIZE
    for name in ("EVAL_BATCH_SIZE", "DEVICE_BATCH_SIZE"):
        value = constants.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return DEFAULT_EVAL_BATCH_SIZE


def prepare_scoring(
    run_dir: Path, workspace: Path, kind: str, python: list[str], commit: str, evaluator: Evaluator
) -> ScoringJob | None:
    """Lay out <run_dir>/scoring for `commit`'s checkpoint; None when training saved no checkpoint."""
    directory = reset_scoring_dir(run_dir)
    if not take_checkpoint(workspace, directory):
        return None
    train_source = gitops.run_git_bytes(workspace, "cat-file", "blob", f"{commit}:{gitops.TRAIN_FILE}")
    (directory / gitops.TRAIN_FILE).write_bytes(train_source)
    shutil.copyfile(base_prepare(evaluator), directory / PREPARE_FILE)
    result_path = directory / "result.json"
    spec = {
        "call": kind,
        "prepare": str(base_prepare(evaluator)),
        "splits": scoring_splits(kind, workspace, run_dir),
        "batch_size": eval_batch_size(kind, train_source.decode("utf-8", "replace")),
        "result": str(result_path),
        "seed": secrets.randbits(31),
    }
    write_json_atomically(directory / "spec.json", spec)
    command = [
        *scoring_python(python, workspace),
        "-I",
        str(SCORER),
        str(directory / "spec.json"),
        str(directory),
    ]
    return ScoringJob(directory, command, result_path)


def scoring_python(python: list[str], workspace: Path) -> list[str]:
    """The workspace's interpreter, run from the scoring directory: `uv run` is told where the project is."""
    if not python:
        return [sys.executable]
    if python[:2] == ["uv", "run"]:
        return ["uv", "run", "--project", str(workspace), *python[2:]]
    return list(python)


def read_result(path: Path) -> dict[str, Any] | None:
    """The scorer's result, or None when it wrote none (it crashed or was killed)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def agrees(printed: float, rescored: float) -> bool:
    """Whether two val_bpb values agree within the tolerance."""
    return abs(printed - rescored) <= max(TOLERANCE_ABS, TOLERANCE_REL * abs(rescored))


def verdict(kind: str, printed: float, result: dict[str, Any]) -> Verdict:
    """Turn the scorer's result into the recorded val_bpb, or a crash reason."""
    if not result.get("ok"):
        reason = f"the independent evaluation failed: {result.get('error', 'no reason given')}"
        return Verdict(None, reason, {})
    scores = {name: float(value) for name, value in result.get("scores", {}).items()}
    compared, recorded = ("dev", "holdout") if kind == "builtin" else ("val", "val")
    evaluation = {
        "printed_val_bpb": printed,
        "rescored_val_bpb": scores.get(compared),
        "val_bpb": scores.get(recorded),
        "device": result.get("device"),
        "causality": result.get("causality", {}),
        "seconds": result.get("seconds"),
    }
    if kind == "builtin":
        evaluation["held_out_split"] = "evaluator/holdout/val.bin"
    return Verdict(*_decide(printed, scores.get(compared), scores.get(recorded), result), evaluation)


def _decide(
    printed: float, rescored: float | None, recorded: float | None, result: dict[str, Any]
) -> tuple[float | None, str | None]:
    if rescored is None or recorded is None or not (math.isfinite(rescored) and math.isfinite(recorded)):
        return None, f"the independent evaluation gave no finite val_bpb ({rescored}, {recorded})"
    check = result.get("causality", {})
    if not check.get("passed", False):
        return None, (
            "the model's predictions depend on later bytes of its input (changing the input from position "
            f"{check.get('cut')} on changed the logits before it by {check.get('max_difference', 0):.4g}): "
            "it reads the answer instead of predicting it"
        )
    if not agrees(printed, rescored):
        return None, (
            f"val_bpb printed by train.py ({printed:.6f}) does not match the independent evaluation "
            f"of its checkpoint ({rescored:.6f})"
        )
    return recorded, None
