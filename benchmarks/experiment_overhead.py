"""Benchmark: mat's own time per experiment, outside training and the agent.

    python benchmarks/experiment_overhead.py [--experiments 10] [--reps 1] [--workdir DIR] [--json FILE]

It sets up a run through the public API (`Runner.setup_workspace` on a small generated corpus), swaps
in a trivial train.py that prints the summary block and exits, and runs `--experiments` experiments
with a trivial agent that sets one constant. The agent and the executor are thin timing wrappers (the
agent's edit and the training subprocess are what they time); everything else is mat:

    per experiment wall = time between consecutive on_result calls (the first from run_experiments' start)
    overhead            = wall - agent time - training run time
                        = git (reset, revert check, commit), the guard (mat's git config back,
                          every file compared with the commit by content, the evaluator's files
                          checked and fingerprinted before and after training), sync, log read +
                          summary parse, decide, results.tsv append (fsync), run.json writes (fsync)
                          at each phase, hooks

It prints the median, p90 and max overhead per experiment in ms and the total, against a target of
1 s per experiment. The last line of stdout is a JSON summary (also written to --json FILE).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

from multiagenttrainer.agents.base import AgentOutcome, AgentRequest  # noqa: E402
from multiagenttrainer.config import AutoresearchConfig, TrainingConfig  # noqa: E402
from multiagenttrainer.execution.base import RunOutcome  # noqa: E402
from multiagenttrainer.execution.local import LocalExecutor  # noqa: E402
from multiagenttrainer.experiments import ExperimentResult, Runner  # noqa: E402
from multiagenttrainer.workspace import gitops  # noqa: E402

TARGET_S = 1.0
TRIVIAL_TRAIN_PY = """\
LEARNING_RATE = 0.004
print("---")
print(f"val_bpb:          {2.0 + abs(LEARNING_RATE - 0.001) * 100:.6f}")
print("training_seconds: 0.0")
print("peak_vram_mb:     1024.0")
"""
WORDS = ("value", "result", "items", "index", "count", "name", "path", "config", "data", "buffer", "stream")


class TimedAgent:
    """Sets LEARNING_RATE to a random value; records how long each proposal took."""

    name = "timed"

    def __init__(self, seed: int = 0) -> None:
        self.random = random.Random(seed)
        self.seconds: dict[int, float] = {}

    def propose(self, request: AgentRequest) -> AgentOutcome:
        started = time.perf_counter()
        train = request.workspace / "train.py"
        value = f"{self.random.uniform(0.0005, 0.006):.6f}"
        lines = train.read_text().splitlines(keepends=True)
        lines[0] = f"LEARNING_RATE = {value}\n"
        train.write_text("".join(lines))
        self.seconds[request.experiment_id] = time.perf_counter() - started
        return AgentOutcome(f"LEARNING_RATE -> {value}")


class TimedExecutor(LocalExecutor):
    """The local executor, recording how long each training command ran."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: list[float] = []

    def run(
        self, workspace: Path, command: list[str], timeout_s: float, log_path: Path, env: dict[str, str]
    ) -> RunOutcome:
        started = time.perf_counter()
        outcome = super().run(workspace, command, timeout_s, log_path, env)
        self.seconds.append(time.perf_counter() - started)
        return outcome


def write_corpus(directory: Path, seed: int = 0) -> Path:
    """A corpus.jsonl of generated text: 40 train documents and 4 val documents of about 2 KB."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    for index in range(44):
        text = "\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(30))
        record = {"source": "bench", "repo": "bench", "path": f"f{index}.txt", "text": text}
        lines.append(orjson.dumps({**record, "split": "val" if index % 11 == 0 else "train"}))
    (directory / "corpus.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return directory


def measure(workdir: Path, experiments: int, rep: int) -> list[float]:
    """One run of `experiments` experiments; returns mat's overhead per experiment in seconds."""
    agent, executor = TimedAgent(seed=rep), TimedExecutor()
    finished: list[float] = []
    training = TrainingConfig(max_experiments=experiments)
    runner = Runner(
        AutoresearchConfig(train_time=60), training, f"bench-{rep}", output_dir=workdir / "runs",
        agent=agent, executor=executor, on_result=lambda result: finished.append(time.perf_counter()),
    )  # fmt: skip
    workspace = runner.setup_workspace(write_corpus(workdir / "corpus"))
    (workspace.path / "train.py").write_text(TRIVIAL_TRAIN_PY)
    workspace.baseline_commit = gitops.commit_paths(workspace.path, "trivial train.py", ["train.py"])
    workspace.evaluation = "summary"  # it saves no checkpoint; the scoring process is not mat's bookkeeping
    started = time.perf_counter()
    results: list[ExperimentResult] = asyncio.run(runner.run_experiments(workspace))
    assert len(results) == experiments and all(r.status != "crash" for r in results), results
    walls = [end - begin for begin, end in zip([started, *finished], finished, strict=False)]
    return [
        wall - agent.seconds.get(index, 0.0) - executor.seconds[index] for index, wall in enumerate(walls)
    ]


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiments", type=int, default=10)
    parser.add_argument("--reps", type=int, default=1, help="runs of --experiments each; all pooled")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mat-overhead-") as scratch:
        workdir = args.workdir or Path(scratch)
        overheads = [
            s for rep in range(args.reps) for s in measure(workdir / f"rep-{rep}", args.experiments, rep)
        ]
    summary: dict[str, Any] = {
        "experiments": len(overheads),
        "median_ms": round(1000 * statistics.median(overheads), 1),
        "p90_ms": round(1000 * percentile(overheads, 0.9), 1),
        "max_ms": round(1000 * max(overheads), 1),
        "total_s": round(sum(overheads), 3),
        "target_ms": 1000 * TARGET_S,
    }
    summary["within_target"] = summary["p90_ms"] < summary["target_ms"]
    count = summary["experiments"]
    print(f"mat overhead per experiment over {count} experiments (training and agent excluded):")
    print(f"  median {summary['median_ms']} ms, p90 {summary['p90_ms']} ms, max {summary['max_ms']} ms")
    print(f"  total  {summary['total_s']} s; target < {TARGET_S:.0f} s per experiment: "
          f"{'met' if summary['within_target'] else 'MISSED'}")  # fmt: skip
    line = json.dumps(summary)
    if args.json:
        args.json.write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
