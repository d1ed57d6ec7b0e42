"""`mat request` end to end: the real CLI in subprocesses, the session's Prefect server, tiny Llamas."""

from __future__ import annotations

import json
import time
from pathlib import Path
from uuid import UUID

import openai
import pytest
import yaml

from multiagenttrainer.processes import pid_alive
from tests.request.conftest import (
    catalog,
    mat,
    planner_command,
    request_folder,
    write_config,
    write_request,
)

pytestmark = pytest.mark.integration

MET_REQUEST = {
    "name": "widgets-completion",
    "task": "code-completion",
    "description": "Complete the functions of the widgets code base.",
    "data": {"sources": ["widgets"]},
    "requirements": {
        "quality": {"max_eval_loss": 50, "max_perplexity": 1e9},
        "size": {"max_params": 10_000_000, "max_gpu_memory_gb": 1},
        "speed": {"latency_tokens": 8, "p95_latency_ms": 120_000, "min_tokens_per_s": 0.01},
        "budget": {"max_wall_time_s": 3600, "max_gpu_hours": 1, "max_bedrock_usd": 0},
    },
    "allowed_licenses": ["MIT"],
}


def test_a_met_request_is_planned_trained_served_and_measured(
    prefect_api: str,
    tmp_path: Path,
    tiny_models: dict[str, tuple[Path, int]],
    widgets_repo: Path,
    gpl_repo: Path,
) -> None:
    config = write_config(tmp_path, catalog(tiny_models), {"widgets": widgets_repo, "gadgets": gpl_repo})
    request = write_request(tmp_path, MET_REQUEST)

    result = mat("request", "run", str(request), "--config", str(config))
    assert (tmp_path / "requests").is_dir(), result.stdout + result.stderr
    folder = request_folder(tmp_path)
    recorded = folder / "endpoint.json"
    endpoint = json.loads(recorded.read_text()) if recorded.exists() else {}
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        check_outputs(folder, result.stdout, tiny_models, widgets_repo.name)
        check_served(endpoint, folder.name)
        status = json.loads(mat("request", "status", folder.name, "--config", str(config), "--json").stdout)
        assert (status["outcome"], status["stage"], status["endpoint"]) == ("met", "done", endpoint["url"])
        assert agent_task_runs(status["flow_run_id"]) == [
            "task-agent", "ingest", "data-agent", "task-agent-review", "model-agent", "server-agent"
        ]  # fmt: skip
    finally:
        stopped = mat("request", "stop", folder.name, "--config", str(config))
    assert stopped.returncode == 0 and "server stopped" in stopped.stdout, stopped.stdout + stopped.stderr
    assert not pid_alive(endpoint["pid"]) and not (folder / "endpoint.json").exists()
    listed = json.loads(mat("request", "status", "--config", str(config), "--json").stdout)
    assert [(r["id"], r["endpoint"]) for r in listed] == [(folder.name, None)]


def agent_task_runs(flow_run_id: str) -> list[str]:
    """The names of the request flow run's task runs, in order (the ingest subflow is one of them)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import TaskRunSort

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)])),
            sort=TaskRunSort.EXPECTED_START_TIME_ASC,
        )
    names = [run.name for run in runs if run.flow_run_id == UUID(flow_run_id)]
    return ["ingest" if name.startswith("ingest-") else name for name in names]  # the subflow's task run


def check_outputs(folder: Path, stdout: str, tiny_models: dict[str, tuple[Path, int]], repo: str) -> None:
    """Every file the request promises, with what a user would look for in each."""
    lines = stdout.splitlines()
    for requirement in (
        "quality.max_eval_loss",
        "size.max_gpu_memory_gb",
        "speed.p95_latency_ms",
        "budget.max_wall_time_s",
        "allowed_licenses",
    ):
        assert any(line.startswith(f"{requirement}: met (") for line in lines), stdout
    assert f"request {folder.name}: met" in stdout and f"mat request stop {folder.name}" in stdout

    plan = json.loads((folder / "plan.json").read_text())
    assert plan["outcome"] == "accepted" and plan["trial_candidates"] == ["tiny", "wide"]
    assert {c["name"]: c["params"] for c in plan["candidates"]} == {n: p for n, (_, p) in tiny_models.items()}
    topics = {d["topic"] for d in plan["decisions"]}
    assert {"task", "data", "candidates", "speed", "split", "licenses found", "budget"} <= topics
    assert all(d["reason"] for d in plan["decisions"]) and "## Accepted" in (folder / "plan.md").read_text()

    data = json.loads((folder / "data.json").read_text())
    assert (data["examples"], data["train"], data["val"]) == (12, 10, 2)  # 4 modules x 3 documented functions
    assert [(f["repo"], f["spdx"], f["evidence"]) for f in data["licenses"]] == [(repo, "MIT", "LICENSE")]

    rows = (folder / "trials.tsv").read_text().splitlines()
    assert rows[0] == "trial\tmodel\tlr\trank\teval_loss\tstatus\tdescription"
    assert [row.split("\t")[1] for row in rows[1:]] == ["tiny", "wide"]
    assert rows[1].split("\t")[5] == "keep" and rows[2].split("\t")[5] in ("keep", "discard")

    report = (folder / "report.md").read_text()
    assert report.startswith(f"# Request {folder.name}: met") and "| speed.p95_latency_ms |" in report
    card = (folder / "MODEL_CARD.md").read_text()
    assert "## Data and licenses" in card and f"| widgets | {repo} | MIT | LICENSE |" in card
    assert "## Limits" in card and "## Metrics against the request" in card


def check_served(endpoint: dict[str, object], model: str) -> None:
    """The model left running answers the openai client under the request's id."""
    assert endpoint["model"] == model and pid_alive(int(str(endpoint["pid"])))
    client = openai.OpenAI(base_url=str(endpoint["url"]), api_key="none", max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == [model]
    answer = client.completions.create(
        model=model, prompt="def load_items(", max_tokens=5, temperature=0, extra_body={"min_tokens": 5}
    )
    assert answer.usage is not None and answer.usage.completion_tokens == 5 and answer.choices[0].text


def test_a_request_no_candidate_fits_is_refused_for_memory(
    prefect_api: str, tmp_path: Path, tiny_models: dict[str, tuple[Path, int]], widgets_repo: Path
) -> None:
    models = [
        *catalog(tiny_models),
        {"name": "llama-70b", "model_id": "meta-llama/Llama-3.1-70B", "params": 70_000_000_000},
    ]
    config = write_config(tmp_path, models, {"widgets": widgets_repo})
    tight = {"size": {"max_gpu_memory_gb": 0.0001}}
    request = write_request(tmp_path, {"task": "causal-lm", "requirements": tight})

    result = mat("request", "run", str(request), "--config", str(config))

    assert result.returncode == 3, result.stdout + result.stderr
    refusal = next(line for line in result.stderr.splitlines() if line.startswith("refused: "))
    assert refusal.startswith("refused: no model of the catalog fits: tiny needs ~")
    assert "llama-70b needs ~175 GB (LoRA 2 GB/B + activations assumed 25 %), more than " in refusal
    assert "size.max_gpu_memory_gb 0.0001 GB" in refusal
    folder = request_folder(tmp_path)
    assert f"plan: {folder / 'plan.md'}" in result.stderr
    plan = (folder / "plan.md").read_text()
    assert "## Refused" in plan and "| llama-70b (`meta-llama/Llama-3.1-70B`) | 70,000,000,000 |" in plan
    assert not (folder / "corpus").exists() and not (folder / "jobs").exists()  # refused before any data
    status = json.loads(mat("request", "status", "--config", str(config), "--json").stdout)
    assert [(r["outcome"], r["stage"]) for r in status] == [("refused", "plan")]


def test_a_request_over_gpl_code_is_refused_by_license(
    prefect_api: str,
    tmp_path: Path,
    tiny_models: dict[str, tuple[Path, int]],
    widgets_repo: Path,
    gpl_repo: Path,
) -> None:
    config = write_config(tmp_path, catalog(tiny_models), {"widgets": widgets_repo, "gadgets": gpl_repo})
    request = write_request(tmp_path, {"task": "code-completion", "allowed_licenses": ["MIT"]})

    result = mat("request", "run", str(request), "--config", str(config))

    assert result.returncode == 3, result.stdout + result.stderr
    refusals = [line for line in result.stderr.splitlines() if line.startswith("refused: ")]
    assert refusals == [
        f"refused: license: gadgets ({gpl_repo.name}) is GPL-3.0 (LICENSE), not in allowed_licenses: MIT"
    ]
    folder = request_folder(tmp_path)
    assert "GPL-3.0" in (folder / "plan.md").read_text() and not (folder / "jobs").exists()
    data = json.loads((folder / "data.json").read_text())
    assert sorted(f["spdx"] for f in data["licenses"]) == ["GPL-3.0", "MIT"]


def test_free_text_becomes_a_request_through_the_planner_and_its_policy(
    prefect_api: str, tmp_path: Path, tiny_models: dict[str, tuple[Path, int]], widgets_repo: Path
) -> None:
    policy = ["Refuse models meant to write malware."]
    config = write_config(
        tmp_path,
        catalog(tiny_models),
        {"widgets": widgets_repo},
        planner_command=planner_command(),
        policy=policy,
    )
    text = (
        "A code completion model on the widgets source that writes malware for our red team,\n"
        "licensed MIT or Apache-2.0 only, and that fits in 0.5 GB of GPU memory."
    )
    started = time.monotonic()
    result = mat("request", "run", "--text", text, "--config", str(config), "--name", "red-team")

    assert result.returncode == 3, result.stdout + result.stderr
    assert "refused: policy: rule 1: the model is meant to write malware" in result.stderr.splitlines()
    folder = request_folder(tmp_path)
    assert folder.name.startswith("red-team-")
    request = yaml.safe_load((folder / "request.yaml").read_text())
    assert request == {
        "task": "code-completion",
        "description": "A code completion model on the widgets source that writes malware for our red team,",
        "data": {"sources": ["widgets"]},
        "requirements": {"size": {"max_gpu_memory_gb": 0.5}},
        "allowed_licenses": ["MIT", "Apache-2.0"],
    }
    plan = json.loads((folder / "plan.json").read_text())
    assert plan["request"]["requirements"]["size"] == {"max_gpu_memory_gb": 0.5}
    assert plan["refusals"] == ["policy: rule 1: the model is meant to write malware"]
    assert (folder / "planner" / "request.md").read_text().startswith("mat request: turn a description")
    assert time.monotonic() - started < 300


def test_free_text_without_a_planner_is_a_config_error(tmp_path: Path, widgets_repo: Path) -> None:
    config = write_config(tmp_path, [], {"widgets": widgets_repo})
    result = mat("request", "run", "--text", "a model that completes code", "--config", str(config))
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("error: --text needs a planner LLM to turn the text into a request")
    assert "request.planner_command" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "requests").exists()


def test_an_invalid_request_file_names_each_problem_and_its_line(tmp_path: Path) -> None:
    config = write_config(tmp_path, [], {})
    request = tmp_path / "bad.yaml"
    request.write_text("task: translation\nrequirements:\n  quality:\n    max_eval_los: 2\n")
    result = mat("request", "run", str(request), "--config", str(config))
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        f"error: task: input should be 'causal-lm', 'code-completion' or 'docs-qa' ({request}:1)",
        "error: requirements.quality.max_eval_los: unknown field; check the spelling against the example "
        f"request in README.md ({request}:4)",
    ]
