"""The request's pieces without Prefect: estimates, the planner LLM's answers, reviews, trials, verdicts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multiagenttrainer.config import Config, ModelCandidate, parse_config_text
from multiagenttrainer.errors import ConfigError, PlannerError
from multiagenttrainer.processes import pid_alive
from multiagenttrainer.request.data import DataReport
from multiagenttrainer.request.estimates import estimate_memory, percentile
from multiagenttrainer.request.model import ModelReport, Trial, judge_trials, trials_tsv
from multiagenttrainer.request.plan import Candidate, Plan
from multiagenttrainer.request.planner import check_speed, review_data
from multiagenttrainer.request.planner_llm import check_policy, parse_policy_answer, planner_line
from multiagenttrainer.request.report import Outcome, judge
from multiagenttrainer.request.schema import RequestSpec, parse_request_text
from multiagenttrainer.request.serving import SpeedReport, stop_server
from multiagenttrainer.request.store import Endpoint, write_endpoint
from tests.request.conftest import planner_command

# --------------------------------------------------------------------------- estimates


def test_memory_is_estimated_from_the_catalog_before_anything_loads(
    tiny_models: dict[str, tuple[Path, int]],
) -> None:
    hub = ModelCandidate(name="big", model_id="meta-llama/Llama-3.1-70B", params=70_000_000_000)
    estimate = estimate_memory(hub, batch=4, seq=2048)
    assert (round(estimate.gb), estimate.basis) == (175, "LoRA 2 GB/B + activations assumed 25 %")
    qlora = estimate_memory(hub.model_copy(update={"use_4bit": True}), batch=4, seq=2048)
    assert round(qlora.gb, 1) == 43.8

    folder, params = tiny_models["tiny"]  # hidden 32, 2 layers, 4 heads
    local = estimate_memory(ModelCandidate(name="tiny", model_id=str(folder), params=params), batch=2, seq=32)
    activations = 32 * 2 * 32 * 2 * 34 + 5 * 4 * 32 * 32 * 2 * 2
    assert local.gb == pytest.approx(params / 1e9 * 2 + activations / 1e9)
    assert local.basis == "LoRA 2 GB/B + activations of batch 2x32"


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 11)]
    assert (percentile(values, 50), percentile(values, 95), percentile([7.0], 95)) == (5.0, 10.0, 7.0)


# --------------------------------------------------------------------------- the planner LLM


@pytest.mark.parametrize(
    ("answer", "verdict"),
    [
        ("decision: allow\nreasons: []\n", (True, [])),
        ("Sure.\n```yaml\ndecision: refuse\nreasons: [breaks rule 2]\n```\n", (False, ["breaks rule 2"])),
    ],
)
def test_a_policy_answer_in_the_exact_shape_is_read(answer: str, verdict: tuple[bool, list[str]]) -> None:
    assert parse_policy_answer(answer) == verdict


def alias_bomb(levels: int = 7) -> str:
    """YAML whose aliases expand to 10**levels values ("billion laughs")."""
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ("Looks fine to me!", "not a YAML mapping: <root>: expected a mapping"),
        ("reasons: []\n", "expected exactly the keys `decision` and `reasons`"),
        ("decision: allow\n", "expected exactly the keys"),
        ("decision: allow\nreasons: []\nnotes: fine\n", "expected exactly the keys"),
        ("decision: maybe\nreasons: []\n", "decision must be allow or refuse, not 'maybe'"),
        ("decision: yes\nreasons: []\n", "decision must be allow or refuse, not 'True'"),  # YAML's boolean
        ("decision: refuse\nreasons: []\n", "a refusal must give at least one reason"),
        ("decision: allow\nreasons: [1, 2]\n", "reasons must be a list of lines of text"),
        ("decision: [allow\n", "not a YAML mapping: <yaml>: "),
        (alias_bomb(), "not a YAML mapping: <yaml>: the aliases"),
    ],
)
def test_a_broken_policy_answer_is_an_error_never_an_approval(answer: str, problem: str) -> None:
    with pytest.raises(PlannerError, match="the request was not approved") as caught:
        parse_policy_answer(answer)
    assert problem in str(caught.value)


def spec(**fields: object) -> RequestSpec:
    return RequestSpec.model_validate({"task": "causal-lm", **fields})


def test_the_scripted_planner_checks_the_policy_as_a_real_command(tmp_path: Path) -> None:
    rules = ["Refuse models meant to write malware."]
    allowed = check_policy(planner_command(), spec(description="complete code"), rules, tmp_path, 60)
    refused = check_policy(planner_command(), spec(description="writes malware"), rules, tmp_path, 60)
    assert allowed == (True, []) and refused == (False, ["rule 1: the model is meant to write malware"])
    assert (tmp_path / "planner" / "policy.md").read_text().count(
        "Refuse models meant to write malware."
    ) == 1


def test_a_planner_that_answers_prose_does_not_approve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLANNER_BROKEN", "1")
    with pytest.raises(PlannerError, match=r"not valid \(not a YAML mapping: <root>: expected a mapping"):
        check_policy(planner_command(), spec(), ["no malware"], tmp_path, 60)


def test_a_failing_or_hanging_planner_is_an_error_and_leaves_nothing_running(tmp_path: Path) -> None:
    with pytest.raises(PlannerError, match="exited with code 3; its error output is in"):
        check_policy("echo oops >&2; exit 3", spec(), ["rule"], tmp_path, 60)
    assert (tmp_path / "planner" / "policy.stderr.log").read_text() == "oops\n"
    marker = f"mat-planner-test-{os.getpid()}"
    started = time.monotonic()
    with pytest.raises(PlannerError, match="ran past request.planner_timeout"):
        check_policy(f"sleep 60 # {marker}", spec(), ["rule"], tmp_path, 1)
    assert time.monotonic() - started < 30
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True, check=False).stdout
    assert left == ""


def test_planner_presets_expand_and_unknown_ones_are_config_errors() -> None:
    assert planner_line("preset:claude").startswith("claude -p {prompt}")
    with pytest.raises(ConfigError, match="unknown preset 'gpt'; use one of preset:claude, preset:codex"):
        planner_line("preset:gpt")


def test_policy_rules_without_a_planner_are_refused_by_the_config() -> None:
    with pytest.raises(
        ConfigError, match=r"request: policy rules are checked by the planner LLM; set request"
    ):
        parse_config_text("request:\n  policy: [no malware]\n")
    with pytest.raises(ConfigError, match="two models are named 'a'"):
        parse_config_text(
            "models:\n  - {name: a, model_id: x, params: 1}\n  - {name: a, model_id: y, params: 2}\n"
        )


def test_request_fields_are_checked_with_their_lines() -> None:
    text = "task: docs-qa\nallowed_licenses: [MIT License]\nrequirements:\n  speed: {p95_latency_ms: -1}\n"
    with pytest.raises(ConfigError) as caught:
        parse_request_text(text, "r.yaml")
    spdx = "'MIT License' is not an SPDX id such as MIT, Apache-2.0 or BSD-3-Clause"
    assert caught.value.problems == [
        "requirements.speed.p95_latency_ms: input should be greater than 0 (r.yaml:4)",
        f"allowed_licenses: {spdx} (r.yaml:2)",
    ]


# --------------------------------------------------------------------------- the review


def tiny_plan(request: RequestSpec) -> Plan:
    plan = Plan("req-1", request, trial_candidates=["tiny"], measurements={"gflops": 1.0, "gpu": False})
    plan.candidates = [Candidate("tiny", "/m", 1_000_000, False, 0.01, "LoRA", True, "fits")]
    return plan


def data_report(**counts: object) -> DataReport:
    values: dict[str, object] = {"task": "causal-lm", "corpus_dir": "/c", "dataset": "/d", "examples": 10,
                                 "train": 9, "val": 1, "train_chars": 40_000}  # fmt: skip
    return DataReport(**{**values, **counts})  # type: ignore[arg-type]


def test_the_review_refuses_missing_data_and_a_budget_below_one_epoch() -> None:
    empty = review_data(
        tiny_plan(spec()), data_report(examples=0, train=0, val=0, files=3), Config(), time.time()
    )
    assert empty.refusals[0].startswith("no data: no causal-lm examples in the corpus (3 files")
    short = spec(requirements={"budget": {"max_wall_time_s": 10}})
    plan = review_data(tiny_plan(short), data_report(), Config(), time.time())
    assert plan.refusals[0].startswith(
        "budget: one epoch of tiny over the training set takes about 200 s here"
    )
    assert review_data(tiny_plan(spec()), data_report(), Config(), time.time()).refusals == []


def test_licenses_outside_the_allowed_list_or_unknown_are_refused() -> None:
    licenses = [
        {"source": "a", "repo": "acme/a", "spdx": "MIT", "evidence": "LICENSE"},
        {"source": "b", "repo": "acme/b", "spdx": None, "evidence": "no LICENSE or COPYING file"},
    ]
    plan = review_data(tiny_plan(spec(allowed_licenses=["mit"])), data_report(licenses=licenses), Config(), 0)
    assert plan.refusals == [
        "license: b (acme/b) has no license mat could find (no LICENSE or COPYING file); allowed: mit"
    ]


def test_speed_beyond_what_the_smallest_candidate_reached_here_is_refused() -> None:
    fast = spec(requirements={"speed": {"latency_tokens": 32, "p95_latency_ms": 50, "min_tokens_per_s": 500}})
    plan = tiny_plan(fast)
    check_speed(plan, "tiny", 32, p95=180.0, best_rate=210.0)
    assert plan.refusals == [
        "speed: a p95 latency of 50 ms for 32 tokens is below what this machine measured for the smallest "
        "candidate, tiny: 180 ms",
        "speed: 500 tokens/s is more than this machine reached with the smallest candidate, tiny: "
        "210.0 tokens/s at best",
    ]
    slow_enough = tiny_plan(spec(requirements={"speed": {"p95_latency_ms": 500}}))
    check_speed(slow_enough, "tiny", 32, p95=180.0, best_rate=210.0)
    assert slow_enough.refusals == [] and slow_enough.decisions[-1].decision == "feasible"


# --------------------------------------------------------------------------- trials and verdicts


def test_trials_are_kept_only_when_they_beat_every_earlier_one() -> None:
    losses = [5.0, 5.5, None, 4.0, 4.0]
    trials = [Trial(i, "tiny", "/m", 1e-3, 8, loss) for i, loss in enumerate(losses, start=1)]
    trials[2].description = "training process exited with code 1"
    judge_trials(trials)
    assert [t.status for t in trials] == ["keep", "discard", "crash", "keep", "discard"]
    assert trials_tsv(trials).splitlines() == [
        "trial\tmodel\tlr\trank\teval_loss\tstatus\tdescription",
        "1\ttiny\t0.001\t8\t5.000000\tkeep\tfirst trial",
        "2\ttiny\t0.001\t8\t5.500000\tdiscard\t5.5000 >= 5.0000",
        "3\ttiny\t0.001\t8\t0.000000\tcrash\ttraining process exited with code 1",
        "4\ttiny\t0.001\t8\t4.000000\tkeep\t4.0000 < 5.0000",
        "5\ttiny\t0.001\t8\t4.000000\tdiscard\t4.0000 >= 4.0000",
    ]


def test_each_requirement_is_judged_against_its_figure() -> None:
    request = spec(requirements={
        "quality": {"max_eval_loss": 3.0, "min_improvement_pct": 10},
        "size": {"max_params": 2_000_000},
        "speed": {"latency_tokens": 16, "p95_latency_ms": 100, "min_tokens_per_s": 50},
        "budget": {"max_wall_time_s": 600, "max_bedrock_usd": 0},
    })  # fmt: skip
    gain = (2.9 - 2.7) / 2.9 * 100
    model = ModelReport(
        [],
        1,
        "tiny",
        "/m",
        1_000_000,
        0.01,
        "job",
        "/a",
        1e-3,
        8,
        eval_loss=2.7,
        perplexity=14.9,
        base_eval_loss=2.9,
        improvement_pct=gain,
        training_s=60,
        gpu_hours=0,
    )
    speed = SpeedReport("http://x/v1", "req-1", 10, 16, p50_ms=80, p95_ms=140, tokens_per_s=120, serving=True)
    verdicts = judge(Outcome(tiny_plan(request), data_report(), model, speed, wall_s=700))
    assert [v.line() for v in verdicts] == [
        "quality.max_eval_loss: met (held-out loss 2.7000; required <= 3)",
        "quality.min_improvement_pct: NOT met (6.90 % below the base model's 2.9000; required >= 10 %)",
        "size.max_params: met (1,000,000 parameters; required <= 2,000,000)",
        "speed.p95_latency_ms: NOT met (p95 140 ms for 16 tokens; required <= 100 ms)",
        "speed.min_tokens_per_s: met (120 tokens/s; required >= 50)",
        "budget.max_wall_time_s: NOT met (700 s; required <= 600 s)",
        "budget.max_bedrock_usd: met (0 USD (no Bedrock call was made); required <= 0 USD)",
    ]


# --------------------------------------------------------------------------- stopping a server


def test_stop_only_signals_a_process_that_is_still_a_mat_server(tmp_path: Path) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        write_endpoint(tmp_path, Endpoint("http://127.0.0.1:1/v1", "m", other.pid, "log", "now"))
        assert stop_server(tmp_path) is False  # the recorded pid now belongs to something else
        assert pid_alive(other.pid) and not (tmp_path / "endpoint.json").exists()
    finally:
        os.killpg(other.pid, signal.SIGKILL)
        other.wait(timeout=10)
