"""Benchmark: does the built-in search agent find improvements? 8 experiments on the quickstart corpus.

    python benchmarks/builtin_agent.py [--seeds 0 1 2 3 4] [--experiments 8] [--train-time 20]
                                       [--fixed-steps N] [--workdir DIR] [--json FILE]
    python benchmarks/builtin_agent.py --first-moves --fixed-steps N   # which first change wins?

The corpus is built from configs/quickstart.yaml (this repository's own sources) with the real
Ingester, once per workdir. For each seed, a fresh built-in workspace runs the autoresearch loop in
miniature: experiment 0 is the unmodified baseline, then BuiltinSearchAgent changes train.py, the
template trains it (`python train.py`, one CPU thread), and the change is kept if val_bpb beat the
best so far, else train.py is put back. With --fixed-steps every run trains exactly N steps
(deterministic, but a bigger batch then costs time, not steps); otherwise each run gets --train-time
seconds (the quickstart uses 20). A run that takes longer than 4 x --train-time + 60 s is killed and
counted as a crash, as the loop's timeout would.

It prints one line per experiment and a summary: for how many seeds at least one change was kept,
and the mean improvement of the best val_bpb over the baseline. The last line of stdout is JSON.

With --first-moves it instead trains the baseline and then every coarse (level 0) move the agent could
make from it, each on its own from the unmodified train.py, and prints them best first with their gain
over the baseline: the data behind the order of the agent's first proposals (search_space.RULES).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from multiagenttrainer.agents import AgentRequest, BuiltinSearchAgent  # noqa: E402
from multiagenttrainer.agents.builtin import (  # noqa: E402
    SearchMemory,
    apply_move,
    candidates,
    read_context,
)
from multiagenttrainer.agents.hyperparameter_edits import parse_constants  # noqa: E402
from multiagenttrainer.config import load_config  # noqa: E402
from multiagenttrainer.history import ExperimentResult  # noqa: E402
from multiagenttrainer.ingest import Ingester  # noqa: E402
from multiagenttrainer.workspace.builtin import render_template, write_builtin_data  # noqa: E402
from multiagenttrainer.workspace.summary import parse_run_summary  # noqa: E402

RUN_TIMEOUT_FACTOR = 4  # a run may take this many times its budget (plus a minute) before it is a crash


def build_quickstart_corpus(workdir: Path) -> Path:
    """corpus.jsonl from configs/quickstart.yaml's sources, built once per workdir."""
    corpus_dir = workdir / "corpus"
    jsonl = corpus_dir / "corpus.jsonl"
    if jsonl.is_file():
        return jsonl
    cfg = load_config(ROOT / "configs" / "quickstart.yaml", required=True)
    sources = [s.model_copy(update={"path": str(ROOT)}) for s in cfg.sources]
    options = cfg.corpus.model_copy(update={"dir": str(corpus_dir)})
    ingester = Ingester(sources, workdir / "staging", corpus=options)
    result = ingester.fetch_all()
    if result.failures:
        raise SystemExit(f"ingest failed: {result.failures}")
    ingester.build_corpus(corpus_dir / "corpus.txt")
    return jsonl


def make_workspace(workdir: Path, corpus: Path, seed: int, train_time: int) -> Path:
    """A fresh built-in workspace for one seed (the data is written once and copied)."""
    data = workdir / "data"
    if not (data / "val.bin").is_file():
        write_builtin_data(corpus, data)
    workspace = workdir / f"seed-{seed}"
    shutil.rmtree(workspace, ignore_errors=True)
    render_template(workspace, train_time, None)
    shutil.copytree(data, workspace / "data")
    return workspace


def train(workspace: Path, fixed_steps: int | None, timeout_s: float) -> dict[str, float] | None:
    """Run train.py once; its summary, or None for a crash."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("MAT_FIXED_STEPS", None)
    if fixed_steps is not None:
        env["MAT_FIXED_STEPS"] = str(fixed_steps)
    try:
        run = subprocess.run(
            [sys.executable, "train.py"],
            cwd=workspace,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None
    summary = parse_run_summary(run.stdout + run.stderr)
    return {k: float(v) for k, v in summary.items()} if run.returncode == 0 and summary else None


def run_seed(
    workspace: Path, seed: int, experiments: int, fixed_steps: int | None, budget_s: int
) -> dict[str, Any]:
    """The miniature loop for one seed; returns its results."""
    agent = BuiltinSearchAgent(seed=seed)
    train_py = workspace / "train.py"
    best_source = train_py.read_text()
    history: list[ExperimentResult] = []
    best: float | None = None
    timeout_s = RUN_TIMEOUT_FACTOR * budget_s + 60
    for experiment in range(experiments):
        description = "baseline"
        if experiment > 0:
            request = AgentRequest(workspace, experiment, list(history), prompt="", timeout_s=60)
            description = agent.propose(request).description
        started = time.perf_counter()
        summary = train(workspace, fixed_steps, timeout_s)
        val = summary["val_bpb"] if summary else None
        improved = val is not None and (best is None or val < best)
        status = "keep" if improved else ("discard" if val is not None else "crash")
        if improved:
            best, best_source = val, train_py.read_text()
        else:
            train_py.write_text(best_source)
        history.append(ExperimentResult(experiment, f"{experiment:040x}", val, 0.0, status, description))
        steps = int(summary["num_steps"]) if summary else 0
        shown = f"{val:.6f}" if val is not None else "   crash"
        print(
            f"  seed {seed} exp {experiment}: {shown} {status:7s} steps {steps:5d} "
            f"({time.perf_counter() - started:5.1f} s)  {description}",
            flush=True,
        )
    baseline = history[0].val_bpb
    return {
        "seed": seed,
        "baseline": baseline,
        "best": best,
        "improvement": (baseline - best) if baseline is not None and best is not None else None,
        "kept_changes": sum(1 for r in history[1:] if r.status == "keep"),
        "crashes": sum(1 for r in history if r.status == "crash"),
        "experiments": [
            {"id": r.experiment_id, "val_bpb": r.val_bpb, "status": r.status, "description": r.description}
            for r in history
        ],
    }


def first_moves(workspace: Path, fixed_steps: int | None, budget_s: int) -> list[dict[str, Any]]:
    """The baseline, then every coarse first move on its own, best first, with its gain over the baseline."""
    import random

    train_py = workspace / "train.py"
    baseline_source = train_py.read_text()
    constants = parse_constants(baseline_source)
    ranked = candidates(constants, read_context(workspace), SearchMemory(), random.Random(0))
    moves = [c.move for c in ranked if c.level == 0]
    timeout_s = RUN_TIMEOUT_FACTOR * budget_s + 60
    rows = []
    for move in [None, *moves]:
        source, description = (baseline_source, "baseline")
        if move is not None:
            source, description = apply_move(baseline_source, constants, move)
        train_py.write_text(source)
        started = time.perf_counter()
        summary = train(workspace, fixed_steps, timeout_s)
        seconds = time.perf_counter() - started
        val = summary["val_bpb"] if summary else None
        shown = val if val is not None else "crash"
        print(f"  {description:32s} {shown!s:>10} ({seconds:5.1f} s)", flush=True)
        rows.append({"description": description, "val_bpb": val, "seconds": seconds})
    train_py.write_text(baseline_source)
    baseline = rows[0]["val_bpb"]
    for row in rows:
        known = baseline is not None and row["val_bpb"] is not None
        row["gain"] = baseline - row["val_bpb"] if known else None
    return sorted(rows[1:], key=lambda r: -(r["gain"] if r["gain"] is not None else -9.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--experiments", type=int, default=8)
    parser.add_argument("--train-time", type=int, default=20, help="seconds per run (quickstart: 20)")
    parser.add_argument("--fixed-steps", type=int, default=None, help="train exactly N steps instead")
    parser.add_argument("--workdir", type=Path, default=ROOT / "benchmarks" / ".work" / "builtin_agent")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--first-moves", action="store_true", help="rank every first move on its own")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    corpus = build_quickstart_corpus(args.workdir)
    if args.first_moves:
        workspace = make_workspace(args.workdir, corpus, 0, args.train_time)
        ranked = first_moves(workspace, args.fixed_steps, args.train_time)
        print("first moves, best first (gain = baseline val_bpb - val_bpb):")
        for row in ranked:
            gain = f"{row['gain']:+.6f}" if row["gain"] is not None else "crash"
            print(f"  {gain:>10}  {row['seconds']:5.1f} s  {row['description']}")
        if args.json:
            args.json.write_text(json.dumps(ranked, indent=2))
        print(json.dumps({"fixed_steps": args.fixed_steps, "moves": ranked}))
        return
    mode = (
        f"{args.fixed_steps} fixed steps" if args.fixed_steps is not None else f"{args.train_time} s budget"
    )
    print(f"built-in agent, {args.experiments} experiments per seed, {mode}, corpus {corpus}", flush=True)
    runs = []
    for seed in args.seeds:
        workspace = make_workspace(args.workdir, corpus, seed, args.train_time)
        runs.append(run_seed(workspace, seed, args.experiments, args.fixed_steps, args.train_time))
    improved = [r for r in runs if r["kept_changes"] > 0]
    gains = [r["improvement"] for r in runs if r["improvement"] is not None]
    summary = {
        "mode": mode,
        "experiments_per_seed": args.experiments,
        "seeds": len(runs),
        "seeds_with_a_kept_change": len(improved),
        "mean_improvement_bpb": sum(gains) / len(gains) if gains else None,
        "runs": runs,
    }
    print(
        f"kept at least one change in {len(improved)} of {len(runs)} seeds; "
        f"mean best-vs-baseline improvement {summary['mean_improvement_bpb']}"
    )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}))


if __name__ == "__main__":
    main()
