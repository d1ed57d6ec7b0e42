"""The experiment loop on real autoresearch workspaces (the CPU-sized fixture): the evaluator is prepare.py
plus the run's data cache and tokenizer, restored and checked around every run; with `verify`, a fork
that saves a checkpoint is scored apart from training like the built-in template."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from pathlib import Path

import pytest

from multiagenttrainer.agents.command import CommandAgent
from multiagenttrainer.config import AutoresearchConfig, TrainingConfig
from multiagenttrainer.experiments.runner import Runner
from multiagenttrainer.history import ExperimentResult
from multiagenttrainer.report import render_report_markdown
from tests.workspace.autoresearch.conftest import ASSET_DIR, PublishedRepo

pytestmark = pytest.mark.integration

AGENTS = ASSET_DIR.parent / "agents"
VAL_SHARD = "cache/autoresearch/data/shard_06542.parquet"


def run_with(
    tmp_path: Path, repo: PublishedRepo, corpus: Path, scripts: dict[int, str], *, verify: bool = False
) -> tuple[Runner, list[ExperimentResult]]:
    agents = {i: CommandAgent(str(AGENTS / script), name=script) for i, script in scripts.items()}

    class ByExperiment:
        name = "by-experiment"

        def propose(self, request):  # type: ignore[no-untyped-def]
            return agents[request.experiment_id].propose(request)

    runner = Runner(
        AutoresearchConfig(repo=str(repo.bare), branch="master", train_time=60, verify=verify),
        TrainingConfig(max_experiments=len(scripts) + 1),
        "ar",
        output_dir=tmp_path,
        agent=ByExperiment(),
    )
    workspace = runner.setup_workspace(corpus)
    workspace.env["MAT_FIXED_STEPS"] = "3"
    workspace.env["MAT_TEST_PYTHON"] = sys.executable  # for follow_old_program.py
    return runner, asyncio.run(runner.run_experiments(workspace))


def reverted(result: ExperimentResult) -> set[tuple[str, str, str]]:
    return {(item["path"], item["change"], item["by"]) for item in result.reverted}


def test_prepare_data_and_tokenizer_are_the_evaluator_and_are_restored(
    tmp_path: Path, fake_autoresearch: PublishedRepo, mat_corpus: Path
) -> None:
    runner, results = run_with(
        tmp_path,
        fake_autoresearch,
        mat_corpus,
        {1: "skip_worktree_prepare.py", 2: "tamper_autoresearch_cache.py", 3: "follow_old_program.py"},
    )
    run_dir = tmp_path / str(runner.run_id)
    state = json.loads((run_dir / "run.json").read_text())
    files = state["evaluator"]["files"]
    assert {"prepare.py", VAL_SHARD, "cache/autoresearch/tokenizer/tokenizer.pkl"} <= set(files)
    assert state["workspace"]["evaluation"] == "summary"
    facts = state["workspace"]["facts"]  # the set-up's facts, for the report and `mat train`
    assert facts["commit"] == fake_autoresearch.head("master") and facts["branch"] == "master"
    assert facts["train_shards"] == 1 and facts["train_rows"] > 0 and facts["val_rows"] > 0
    assert facts["train_tokens"] > facts["train_rows"] and facts["tokens_per_step"] == 8 * 256
    assert facts["corpus_repeats"] == round(3 * 8 * 256 / facts["train_tokens"], 2)  # MAT_FIXED_STEPS=3
    assert any("is not a uv project; that interpreter needs the packages" in n for n in facts["notes"])
    report = render_report_markdown(runner.state)  # type: ignore[arg-type]
    origin = fake_autoresearch.bare.resolve()
    assert f"- autoresearch: {origin} branch master, commit {facts['commit'][:12]}" in report

    baseline, hidden, tampered, downloader = results
    assert hidden.status in {"keep", "discard"} and hidden.notes == ["reverted edits to prepare.py"]
    assert hidden.val_bpb is not None and abs(hidden.val_bpb - (baseline.val_bpb or 0)) < 1.0  # not 0.123
    assert ("prepare.py", "modified", "agent") in reverted(hidden)

    assert {
        ("cache/autoresearch/data/shard_00050.parquet", "added", "agent"),
        (VAL_SHARD, "modified", "agent"),
    } <= reverted(tampered)
    assert not (run_dir / "cache/autoresearch/data/shard_00050.parquet").exists()
    assert hashlib.sha256((run_dir / VAL_SHARD).read_bytes()).hexdigest() == files[VAL_SHARD]
    assert tampered.evaluator_hash == baseline.evaluator_hash == state["evaluator"]["hash"]

    # An agent that follows autoresearch's own program.md runs prepare.py to download data: refused.
    agent_log = (run_dir / "logs" / "exp-003.agent.log").read_text()
    assert agent_log.count("RuntimeError: downloads are disabled in this workspace by mat") == 2, agent_log
    assert downloader.status in {"keep", "discard"} and downloader.reverted == []
    assert sorted(p.name for p in (run_dir / "cache/autoresearch/data").iterdir()) == [
        "shard_00000.parquet",
        "shard_06542.parquet",
    ]
    assert downloader.evaluator_hash == baseline.evaluator_hash


def test_verify_rescored_a_forks_checkpoint_and_catches_a_constant(
    tmp_path: Path, checkpoint_fork: PublishedRepo, mat_corpus: Path
) -> None:
    runner, results = run_with(tmp_path, checkpoint_fork, mat_corpus, {1: "fake_val_bpb.py"}, verify=True)
    baseline, faked = results
    assert baseline.status == "keep" and baseline.evaluation["causality"]["passed"]
    assert baseline.evaluation["rescored_val_bpb"] == pytest.approx(
        baseline.evaluation["printed_val_bpb"], abs=2e-3
    )
    assert baseline.val_bpb == baseline.evaluation["val_bpb"]
    assert faked.status == "crash"
    assert (faked.error or "").startswith("val_bpb printed by train.py (0.123000) does not match the ")
