"""Benchmark: per-experiment overhead of each execution target (local, ssh, docker).

    python benchmarks/executor_overhead.py [--experiments 10] [--targets local,ssh,docker] [--json FILE]
        [--ssh-host USER@HOST:PORT --ssh-key PATH --known-hosts PATH --python PATH]
        [--container NAME --docker-host URL]

Per target it prepares a workspace once (a trivial train.py that prints the summary block at once and
writes result.txt, plus 1 MiB of data), then runs `--experiments` experiments the way the loop does:

    sync     train.py edited, then executor.sync(workspace, ["train.py"])   (copy)
    run      executor.run(workspace, [python, "train.py"], ...)            (start, stream, exit, checks)
    fetch    executor.fetch(workspace, ["result.txt"])                     (copy back)

and prints, per target, the median and p90 of sync + run + fetch in ms, the medians of each part, and the
ratio of the median to local's (the same trivial train.py as a plain local subprocess), against a target of
1.5 s per experiment for ssh and docker on loopback. The load average is printed with the figures; the last
line of stdout is a JSON summary (also written to --json FILE).

Without addresses it starts its own targets with the test suite's helpers (root needed): sshd on 127.0.0.1
with a dedicated user (tests/support/sshd.py) and dockerd with a busybox container that mounts this
machine's Python (tests/support/dockerd.py); all are stopped at the end.

Measurements are a registry (MEASUREMENTS). The second, "machines", runs a real multi-machine run (the
Runner with `machines:`, experiments/fleet.py) with 1 and then 2 local machines: the same trivial agent
(edits LEARNING_RATE) and a train.py that sleeps --train-s seconds like a fixed training budget, and prints
experiments per minute of each after the baseline (which runs alone by design) and overall, and their ratio
(target: 2 machines at least 1.8x one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from multiagenttrainer.config import DockerExecution, LocalExecution, SshExecution  # noqa: E402
from multiagenttrainer.execution import Executor, make_executor  # noqa: E402

TARGET_S = 1.5  # per experiment, ssh and docker on loopback
TRAIN_PY = """\
LEARNING_RATE = {value}
open("result.txt", "w").write(str(LEARNING_RATE))
print("---")
print(f"val_bpb:          {{2.0 + abs(LEARNING_RATE - 0.001) * 100:.6f}}")
print("training_seconds: 0.0")
"""
DATA_BYTES = 1 << 20


# ---------------------------------------------------------------- one target


def new_workspace(root: Path) -> Path:
    workspace = root / "20250101-000000-bench" / "workspace"
    (workspace / "data").mkdir(parents=True)
    (workspace / "data" / "train.bin").write_bytes(os.urandom(DATA_BYTES))
    (workspace / "train.py").write_text(TRAIN_PY.format(value=0.004))
    return workspace


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def time_experiments(executor: Executor, workspace: Path, experiments: int) -> dict[str, Any]:
    """prepare once, then `experiments` rounds of sync + run + fetch; seconds per part and per round."""
    started = time.perf_counter()
    executor.prepare(workspace)
    prepare_s = time.perf_counter() - started
    parts: dict[str, list[float]] = {"sync": [], "run": [], "fetch": [], "total": []}
    for index in range(experiments):
        (workspace / "train.py").write_text(TRAIN_PY.format(value=0.001 + index / 1000))
        marks = [time.perf_counter()]
        executor.sync(workspace, ["train.py"])
        marks.append(time.perf_counter())
        outcome = executor.run(workspace, [sys.executable, "train.py"], 60, workspace.parent / "exp.log", {})
        marks.append(time.perf_counter())
        executor.fetch(workspace, ["result.txt"])
        marks.append(time.perf_counter())
        if outcome.exit_code != 0 or (workspace / "result.txt").read_text() != str(0.001 + index / 1000):
            raise RuntimeError(f"experiment {index} on {executor.name} went wrong: {outcome}")
        for name, start, end in zip(("sync", "run", "fetch"), marks[:-1], marks[1:], strict=True):
            parts[name].append(end - start)
        parts["total"].append(marks[-1] - marks[0])
    executor.cleanup()
    return {"prepare_s": prepare_s, **parts}


def summarize(name: str, timings: dict[str, Any], local_median_s: float | None) -> dict[str, Any]:
    total = timings["total"]
    summary = {
        "target": name,
        "prepare_ms": round(timings["prepare_s"] * 1000, 1),
        "median_ms": round(statistics.median(total) * 1000, 1),
        "p90_ms": round(percentile(total, 0.9) * 1000, 1),
        **{
            f"{part}_median_ms": round(statistics.median(timings[part]) * 1000, 1)
            for part in ("sync", "run", "fetch")
        },
    }
    if local_median_s:
        summary["vs_local"] = round(statistics.median(total) / local_median_s, 2)
    if name != "local":
        summary["meets_target"] = statistics.median(total) < TARGET_S
    return summary


# ---------------------------------------------------------------- targets (own daemons when no address)


@contextlib.contextmanager
def own_ssh_target(workdir: Path) -> Iterator[SshExecution]:
    """sshd on 127.0.0.1 with a dedicated user, as the tests start it."""
    from tests.support.sshd import KeyPair, Sshd, SshUser, missing_prerequisite, traversable

    if reason := missing_prerequisite():
        raise SystemExit(f"cannot start sshd: {reason}; pass --ssh-host to use a running one")
    user, key = SshUser.create(), KeyPair.generate()
    try:
        with traversable(Path(sys.executable), Path(sys.prefix), Path(sys.base_prefix).resolve()):
            server = Sshd.start(user, key.public)
            try:
                (workdir / "known_hosts").write_text(server.known_hosts_line)
                yield SshExecution(
                    type="ssh", ssh_host=f"{user.name}@{server.address}:{server.port}",
                    ssh_key=str(key.write(workdir / "id_ed25519")), known_hosts=str(workdir / "known_hosts"),
                    remote_dir=str(user.owned_dir("mat-bench-")), python=sys.executable,
                )  # fmt: skip
            finally:
                server.stop()
    finally:
        user.remove()


@contextlib.contextmanager
def own_docker_target(workdir: Path) -> Iterator[DockerExecution]:
    """dockerd with a busybox container that mounts /usr and this machine's Python, as the tests start it."""
    from tests.support.dockerd import Dockerd, missing_prerequisite

    if reason := missing_prerequisite():
        raise SystemExit(f"cannot start dockerd: {reason}; pass --container to use a running one")
    daemon = Dockerd.start()
    try:
        mounts = [Path("/usr"), Path(sys.prefix), Path(sys.base_prefix).resolve()]
        container = daemon.run_container(daemon.import_busybox(), mounts)
        yield DockerExecution(
            type="docker", container=container.name, container_dir=f"/tmp/mat-bench-{workdir.name}",
            docker_host=daemon.url, python=sys.executable,
        )  # fmt: skip
    finally:
        daemon.stop()


@contextlib.contextmanager
def target_config(name: str, args: argparse.Namespace, workdir: Path) -> Iterator[Any]:
    """The execution config of a target: given by address, or a daemon started for the benchmark."""
    if name == "local":
        yield LocalExecution()
    elif name == "ssh" and args.ssh_host:
        yield SshExecution(
            type="ssh", ssh_host=args.ssh_host, ssh_key=args.ssh_key, known_hosts=args.known_hosts,
            python=args.python or "python3",
        )  # fmt: skip
    elif name == "ssh":
        with own_ssh_target(workdir) as cfg:
            yield cfg
    elif name == "docker" and args.container:
        yield DockerExecution(
            type="docker",
            container=args.container,
            docker_host=args.docker_host,
            python=args.python or "python3",
        )
    elif name == "docker":
        with own_docker_target(workdir) as cfg:
            yield cfg
    else:
        raise SystemExit(f"unknown target {name!r}; choose from local, ssh, docker")


def measure_targets(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per-experiment overhead of each target in --targets."""
    summaries: list[dict[str, Any]] = []
    local_median: float | None = None
    for name in args.targets.split(","):
        with (
            tempfile.TemporaryDirectory(prefix=f"mat-bench-{name}-") as tmp,
            target_config(name, args, Path(tmp)) as cfg,
        ):
            timings = time_experiments(make_executor(cfg), new_workspace(Path(tmp)), args.experiments)
        summaries.append(summarize(name, timings, local_median))
        if name == "local":
            local_median = statistics.median(timings["total"])
        print(json.dumps(summaries[-1]), flush=True)
    return summaries


# ---------------------------------------------------------------- 2 machines against 1

MACHINES_TARGET = 1.8
SLEEPING_TRAIN_PY = """\
import time
LEARNING_RATE = 0.004
time.sleep({sleep_s})
print("---")
print(f"val_bpb:          {{2.0 + abs(LEARNING_RATE - 0.001) * 100:.6f}}")
print("training_seconds: {sleep_s}")
"""


class NudgingAgent:
    """Moves LEARNING_RATE a little each experiment (the Agent Protocol, no model behind it)."""

    name = "nudging"

    def propose(self, request: Any) -> Any:
        import re

        from multiagenttrainer.agents.base import AgentOutcome

        train = request.workspace / "train.py"
        value = 0.004 - 0.0001 * (request.experiment_id % 30)
        train.write_text(re.sub(r"LEARNING_RATE = \S+", f"LEARNING_RATE = {value:.4f}", train.read_text()))
        return AgentOutcome(f"LEARNING_RATE -> {value:.4f}", log="")


def timed_fleet_run(machines: int, experiments: int, sleep_s: float, root: Path) -> dict[str, Any]:
    """One run on `machines` local machines; experiments per minute after the baseline and overall."""
    import asyncio

    from multiagenttrainer.config import AutoresearchConfig, MachineConfig, TrainingConfig
    from multiagenttrainer.experiments.runner import Runner
    from multiagenttrainer.workspace import gitops

    corpus = root / "corpus.jsonl"
    texts = [f"def f{i}(x):\n    return x * {i}\n" * 40 for i in range(40)]
    corpus.write_text(
        "".join(
            json.dumps({"text": t, "split": "val" if i == 0 else "train"}) + "\n" for i, t in enumerate(texts)
        )
    )
    runner = Runner(
        AutoresearchConfig(train_time=60), TrainingConfig(max_experiments=experiments), "bench",
        output_dir=root / "runs", agent=NudgingAgent(),
        machines=[MachineConfig(name=f"m{i}") for i in range(machines)],
    )  # fmt: skip
    workspace = runner.setup_workspace(corpus)
    (workspace.path / "train.py").write_text(SLEEPING_TRAIN_PY.format(sleep_s=sleep_s))
    workspace.baseline_commit = gitops.commit_paths(workspace.path, "baseline (benchmark)", ["train.py"])
    started = time.perf_counter()
    marks: list[float] = []
    runner.hooks.append(lambda result: marks.append(time.perf_counter()))
    asyncio.run(runner.run_experiments(workspace))
    total_s = time.perf_counter() - started
    steady_s = marks[-1] - marks[0]
    return {
        "machines": machines,
        "experiments": experiments,
        "total_s": round(total_s, 2),
        "per_minute_after_baseline": round(60 * (experiments - 1) / steady_s, 2),
        "per_minute_overall": round(60 * experiments / total_s, 2),
    }


def measure_machines(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Experiments per minute of 1 and 2 local machines on the same run, and their ratio."""
    rows = []
    for machines in (1, 2):
        with tempfile.TemporaryDirectory(prefix=f"mat-bench-machines-{machines}-") as tmp:
            rows.append(timed_fleet_run(machines, args.machine_experiments, args.train_s, Path(tmp)))
        print(json.dumps(rows[-1]), flush=True)
    one, two = rows
    rows.append(
        {
            "ratio_after_baseline": round(
                two["per_minute_after_baseline"] / one["per_minute_after_baseline"], 2
            ),
            "ratio_overall": round(two["per_minute_overall"] / one["per_minute_overall"], 2),
            "target": MACHINES_TARGET,
        }
    )
    return rows


MEASUREMENTS: dict[str, Callable[[argparse.Namespace], list[dict[str, Any]]]] = {
    "per-experiment overhead": measure_targets,
    "machines": measure_machines,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--experiments", type=int, default=10)
    parser.add_argument("--targets", default="local,ssh,docker")
    parser.add_argument("--ssh-host")
    parser.add_argument("--ssh-key")
    parser.add_argument("--known-hosts")
    parser.add_argument("--python", help="Python on a given target (default python3)")
    parser.add_argument("--container")
    parser.add_argument("--docker-host")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--only", choices=list(MEASUREMENTS), help="run one measurement")
    parser.add_argument("--machine-experiments", type=int, default=21, help="experiments per machines run")
    parser.add_argument(
        "--train-s", type=float, default=5.0, help="training time of the machines run's train.py"
    )
    args = parser.parse_args()
    load_before = os.getloadavg()
    chosen = {name: measure for name, measure in MEASUREMENTS.items() if args.only in (None, name)}
    results = {name: measure(args) for name, measure in chosen.items()}
    load_after = os.getloadavg()
    before, after = (f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}" for load in (load_before, load_after))
    print(f"load average (1, 5, 15 min) before: {before}, after: {after}")
    for row in results.get("per-experiment overhead", []):
        ratio = f"  {row['vs_local']:.2f}x local" if "vs_local" in row else ""
        print(
            f"{row['target']:>7}: median {row['median_ms']:7.1f} ms  p90 {row['p90_ms']:7.1f} ms  "
            f"(sync {row['sync_median_ms']:.1f}, run {row['run_median_ms']:.1f}, "
            f"fetch {row['fetch_median_ms']:.1f}; prepare once {row['prepare_ms']:.1f}){ratio}"
        )
    if "machines" in results:
        one, two, ratios = results["machines"]
        print(
            f"machines: 1 machine {one['per_minute_after_baseline']:.1f}/min, 2 machines "
            f"{two['per_minute_after_baseline']:.1f}/min after the baseline: "
            f"{ratios['ratio_after_baseline']:.2f}x "
            f"(overall {ratios['ratio_overall']:.2f}x; target >= {MACHINES_TARGET}x)"
        )
    summary = {"results": results, "load_before": load_before, "load_after": load_after, "target_s": TARGET_S}
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
