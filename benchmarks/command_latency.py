"""Benchmark: how long the everyday commands take once mat's local Prefect server runs.

    python benchmarks/command_latency.py [--reps 5] [--workdir DIR] [--json FILE]

In a MAT_HOME of its own (no PREFECT_API_URL: mat's server is started on first use, as for a new user), on
this repository's quick-start sources with the corpus written under the work directory:

    first ingest       the first `mat ingest`: starts the server (announced), fetches, builds the corpus
    no-change ingest   `mat ingest` again and again: nothing changed, so it is served from the cache
    status             `mat status` (reads run.json files; must not import Prefect at all)
    baselines          `python -c pass` and `mat --version`, measured in the same run

It prints the median and p90 of each, the median CPU seconds (user + system) of the command's processes,
the ratios to `mat --version`, whether `mat status` imported prefect, and the load average before and after
(other jobs on the machine slow the wall time down; the CPU time is what a quiet machine would still pay).
The goal is a no-change ingest and a status under 3 s on a quiet 2-core machine. The server is stopped at the
end, and nothing started here outlives the benchmark. The last line of stdout is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
MAT = [sys.executable, "-m", "multiagenttrainer.cli"]
TARGET_S = 3.0


def environment(workdir: Path) -> dict[str, str]:
    """A new user's settings: mat's state in the work directory, no Prefect server configured."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MAT_"))}
    env.update(MAT_HOME=str(workdir / "mat-home"), OMP_NUM_THREADS="1", NO_COLOR="1")
    return env


def write_config(workdir: Path) -> Path:
    """configs/quickstart.yaml with its sources made absolute and its outputs in the work directory."""
    config = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text(encoding="utf-8"))
    for source in config["sources"]:
        source["path"] = str(ROOT)
    config["corpus"] = {"dir": str(workdir / "corpus"), "staging_dir": str(workdir / "staging")}
    config["training"]["output_dir"] = str(workdir / "runs")
    path = workdir / "quickstart.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def children_cpu_s() -> float:
    """User + system CPU seconds of the waited-for child processes so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Wall seconds of one command, which must succeed."""
    wall, _, done = timed_with_cpu(command, env)
    return wall, done


def timed_with_cpu(
    command: list[str], env: dict[str, str]
) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """Wall seconds, CPU seconds and the result of one command, which must succeed."""
    cpu_before, started = children_cpu_s(), time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    elapsed, cpu = time.perf_counter() - started, children_cpu_s() - cpu_before
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return elapsed, cpu, done


def series(command: list[str], env: dict[str, str], reps: int) -> dict[str, float]:
    """Median, p90 and min wall seconds, and median CPU seconds, of `reps` runs of a command."""
    runs = [timed_with_cpu(command, env)[:2] for _ in range(reps)]
    seconds = sorted(wall for wall, _ in runs)
    p90 = seconds[min(len(seconds) - 1, round(0.9 * (len(seconds) - 1)))]
    cpu = statistics.median(cpu for _, cpu in runs)
    return {"median_s": statistics.median(seconds), "p90_s": p90, "min_s": seconds[0], "cpu_median_s": cpu}


def status_imports_prefect(config: Path, env: dict[str, str]) -> bool:
    """Whether `mat status` loads any prefect module (it must not)."""
    command = [
        sys.executable,
        "-X",
        "importtime",
        "-m",
        "multiagenttrainer.cli",
        "status",
        "--config",
        str(config),
    ]
    _, done = timed(command, env)
    return any(line.split("|")[-1].strip().startswith("prefect") for line in done.stderr.splitlines())


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def run(workdir: Path, reps: int) -> dict[str, Any]:
    env = environment(workdir)
    config = write_config(workdir)
    result: dict[str, Any] = {"reps": reps, "load_before": load_average(), "cpus": os.cpu_count()}
    try:
        result["python_c_pass"] = series([sys.executable, "-c", "pass"], env, reps)
        result["mat_version"] = series([*MAT, "--version"], env, reps)
        first_s, first = timed([*MAT, "ingest", "--config", str(config)], env)
        result["first_ingest_s"] = first_s
        result["first_ingest_announced_server"] = "Started a local Prefect server" in first.stderr
        result["no_change_ingest"] = series([*MAT, "ingest", "--config", str(config)], env, reps)
        result["status"] = series([*MAT, "status", "--config", str(config)], env, reps)
        result["status_imports_prefect"] = status_imports_prefect(config, env)
    finally:
        subprocess.run([*MAT, "server", "stop"], cwd=ROOT, env=env, capture_output=True, check=False)
    result["load_after"] = load_average()
    base = result["mat_version"]["median_s"]
    result["ratio_no_change_ingest_to_version"] = result["no_change_ingest"]["median_s"] / base
    result["ratio_status_to_version"] = result["status"]["median_s"] / base
    return result


def report(result: dict[str, Any]) -> None:
    print(
        f"load average {result['load_before']} before, {result['load_after']} after ({result['cpus']} CPUs)"
    )
    for key, label in (
        ("python_c_pass", "python -c pass"),
        ("mat_version", "mat --version"),
        ("no_change_ingest", "mat ingest (no change)"),
        ("status", "mat status"),
    ):
        row = result[key]
        print(
            f"{label:<24} median {row['median_s']:6.2f} s   p90 {row['p90_s']:6.2f} s"
            f"   min {row['min_s']:6.2f} s   cpu {row['cpu_median_s']:6.2f} s"
        )
    print(
        f"first mat ingest         {result['first_ingest_s']:6.2f} s (server started and announced: "
        f"{result['first_ingest_announced_server']})"
    )
    print(
        f"ratios to mat --version: no-change ingest {result['ratio_no_change_ingest_to_version']:.1f}x, "
        f"status {result['ratio_status_to_version']:.1f}x"
    )
    print(f"mat status imports prefect: {result['status_imports_prefect']}")
    for key in ("no_change_ingest", "status"):
        verdict = "meets" if result[key]["median_s"] < TARGET_S else "misses"
        print(f"{key}: {verdict} the {TARGET_S:.0f} s goal")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mat-latency-") as scratch:
        workdir = args.workdir or Path(scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        result = run(workdir.resolve(), args.reps)
    report(result)
    summary = json.dumps(result, sort_keys=True)
    if args.json:
        args.json.write_text(summary + "\n", encoding="utf-8")
    print(summary)


if __name__ == "__main__":
    main()
