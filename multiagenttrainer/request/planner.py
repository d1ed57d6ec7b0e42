"""The Task agent: the request turned into a plan, or refused with reasons.

Planning (before any data is fetched) decides the task's training form, the data, the policy, and the
candidates: each model of the `models:` catalog is judged by its size and its memory estimate (made
before anything loads) against `size:` and the machine; the smallest one that fits is loaded once
to measure this machine's latency against `speed:`. Reviewing (once the Data agent has built the
training set) checks that there is data to train and hold out, the licenses of every fetched tree
against `allowed_licenses`, and the budget against one epoch's estimated time.

Every check that fails adds a refusal; every choice adds a decision with its reason. The stage
(stage.py) stops a refused request with exit code 3 after writing plan.md.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from multiagenttrainer.config import Config, ModelCandidate
from multiagenttrainer.errors import ConfigError
from multiagenttrainer.request import estimates
from multiagenttrainer.request.data import DataReport, request_sources
from multiagenttrainer.request.plan import Candidate, Plan
from multiagenttrainer.request.planner_llm import check_policy
from multiagenttrainer.request.schema import RequestSpec
from multiagenttrainer.sources.licenses import same_license
from multiagenttrainer.sources.registry import unique_names

log = logging.getLogger(__name__)

TRAINING_FORMS = {
    "causal-lm": "each corpus file as text; the loss covers every token (continued pretraining)",
    "code-completion": (
        "pairs from the Python files: decorators, signature and docstring -> the rest of the body; "
        "each pair is trained as one text, so the loss covers prompt and completion"
    ),
    "docs-qa": (
        "pairs from the Markdown files: heading (with the headings above it) -> its section; "
        "each pair is trained as one text, so the loss covers prompt and completion"
    ),
}


@dataclass(frozen=True)
class PlanInputs:
    """What the Task agent plans from."""

    config: Config
    spec: RequestSpec
    request_id: str
    folder: Path
    repos: tuple[str, ...] = ()
    started: float = 0.0  # time.time() when the request started, for the wall-time budget


# --------------------------------------------------------------------------- planning


def plan_request(inputs: PlanInputs) -> Plan:
    """Decide task, data, policy and candidates, and measure this machine; refusals are recorded."""
    plan = Plan(inputs.request_id, inputs.spec)
    plan.decide("task", inputs.spec.task, TRAINING_FORMS[inputs.spec.task])
    plan_data(plan, inputs)
    plan_policy(plan, inputs)
    plan_candidates(plan, inputs.config, inputs.spec)
    if plan.trial_candidates:
        plan_speed(plan, inputs.config, inputs.spec)
    plan_costs(plan, inputs.spec)
    return plan


def plan_data(plan: Plan, inputs: PlanInputs) -> None:
    sources = request_sources(inputs.config, inputs.spec, inputs.repos)
    if not sources:
        plan.refuse(
            "no data: the request names no repositories and the config has no sources; add `data.repos` "
            "to the request, pass --repo, or add `sources:` to the config"
        )
        return
    names = ", ".join(unique_names(sources))
    plan.decide(
        "data", names, f"{len(sources)} source(s): the request's `data` (all configured sources if unset)"
    )


def plan_policy(plan: Plan, inputs: PlanInputs) -> None:
    spec, cfg = inputs.spec, inputs.config.request
    if spec.allowed_licenses is None:
        plan.decide("licenses", "any", "allowed_licenses is not set; the licenses found are still recorded")
    else:
        allowed = ", ".join(spec.allowed_licenses) or "none"
        plan.decide("licenses", allowed, "every fetched repository's license is checked once it is fetched")
    if not cfg.policy:
        plan.decide("policy", "no rules", "request.policy is empty")
        return
    assert cfg.planner_command is not None  # the config refuses policy rules without a planner
    allowed_by_llm, reasons = check_policy(
        cfg.planner_command, spec, cfg.policy, inputs.folder, cfg.planner_timeout
    )
    for reason in reasons if not allowed_by_llm else []:
        plan.refuse(f"policy: {reason}")
    if allowed_by_llm:
        plan.decide("policy", "allowed", f"the planner LLM found no rule broken ({len(cfg.policy)} rules)")


def judge_candidate(
    model: ModelCandidate, cfg: Config, spec: RequestSpec, limit: tuple[float, str]
) -> Candidate:
    """A catalog model with its memory estimate, and whether it fits the request and the machine."""
    opensource = cfg.finetuner.opensource
    memory = estimates.estimate_memory(model, opensource.batch_size, opensource.max_length)
    problems = []
    max_params = spec.requirements.size.max_params
    if max_params is not None and model.params > max_params:
        problems.append(f"has {model.params:,} parameters, more than size.max_params {max_params:,}")
    if memory.gb > limit[0]:
        problems.append(f"needs ~{memory.gb:.3g} GB ({memory.basis}), more than {limit[1]} {limit[0]:.3g} GB")
    if model.use_4bit and not cuda_available():
        problems.append("is QLoRA (use_4bit), which needs a CUDA GPU and none is visible")
    reason = "; ".join(problems) or f"needs ~{memory.gb:.3g} GB of {limit[0]:.3g} GB"
    return Candidate(
        model.name,
        model.model_id,
        model.params,
        model.use_4bit,
        memory.gb,
        memory.basis,
        not problems,
        reason,
    )


def memory_limit(cfg: Config, spec: RequestSpec) -> tuple[float, str]:
    """(GB, what sets it): the smaller of size.max_gpu_memory_gb and the machine's memory."""
    machine, where = estimates.machine_memory_gb(cfg.request.machine_memory_gb)
    required = spec.requirements.size.max_gpu_memory_gb
    if required is not None and required <= machine:
        return required, "size.max_gpu_memory_gb"
    return machine, where


def plan_candidates(plan: Plan, cfg: Config, spec: RequestSpec) -> None:
    if not cfg.models:
        raise ConfigError(
            "models: the catalog is empty; list the base models mat may choose from, "
            "for example `models: [{name: small, model_id: ./models/small, params: 125000000}]`"
        )
    limit = memory_limit(cfg, spec)
    plan.measurements["memory_limit_gb"] = round(limit[0], 3)
    plan.candidates = [judge_candidate(model, cfg, spec, limit) for model in cfg.models]
    fitting = sorted((c for c in plan.candidates if c.fits), key=lambda c: (c.params, c.name))
    if not fitting:
        reasons = "; ".join(f"{c.name} {c.reason}" for c in plan.candidates)
        plan.refuse(f"no model of the catalog fits: {reasons}")
        return
    plan.trial_candidates = [c.name for c in fitting[: cfg.request.trials.max_candidates]]
    plan.decide(
        "candidates",
        ", ".join(plan.trial_candidates),
        f"the {len(plan.trial_candidates)} smallest of {len(fitting)} fitting model(s) "
        f"(request.trials.max_candidates: {cfg.request.trials.max_candidates})",
    )


def plan_speed(plan: Plan, cfg: Config, spec: RequestSpec) -> None:
    speed = spec.requirements.speed
    if speed.p95_latency_ms is None and speed.min_tokens_per_s is None:
        plan.decide("speed", "not measured before training", "the request sets no speed requirement")
        return
    smallest = plan.candidate(plan.trial_candidates[0])
    try:
        timings = estimates.measure_latency_ms(
            smallest.model_id, speed.latency_tokens, cfg.request.latency_probe_runs
        )
    except (OSError, ValueError, RuntimeError) as exc:
        plan.decide("speed", "not measured", f"{smallest.name} could not be loaded here: {first_line(exc)}")
        return
    p95 = estimates.percentile(timings, 95)
    best_rate = speed.latency_tokens / (min(timings) / 1000)
    plan.measurements["probe_model"] = smallest.name
    plan.measurements[f"probe_p95_latency_ms_{speed.latency_tokens}_tokens"] = round(p95, 1)
    plan.measurements["probe_best_tokens_per_s"] = round(best_rate, 1)
    check_speed(plan, smallest.name, speed.latency_tokens, p95, best_rate)


def check_speed(plan: Plan, model: str, tokens: int, p95: float, best_rate: float) -> None:
    """Refuse speed requirements beyond what the smallest candidate reached here, before any training."""
    speed = plan.spec.requirements.speed
    if speed.p95_latency_ms is not None and speed.p95_latency_ms < p95:
        plan.refuse(
            f"speed: a p95 latency of {speed.p95_latency_ms:g} ms for {tokens} tokens is below what this "
            f"machine measured for the smallest candidate, {model}: {p95:.0f} ms"
        )
    if speed.min_tokens_per_s is not None and speed.min_tokens_per_s > best_rate:
        plan.refuse(
            f"speed: {speed.min_tokens_per_s:g} tokens/s is more than this machine reached with the "
            f"smallest candidate, {model}: {best_rate:.1f} tokens/s at best"
        )
    if not plan.refused:
        plan.decide("speed", "feasible", f"{model} generated {tokens} tokens in {p95:.0f} ms (p95) here")


def plan_costs(plan: Plan, spec: RequestSpec) -> None:
    budget = spec.requirements.budget
    plan.measurements["gflops"] = round(estimates.measure_gflops(), 2)
    on_gpu = cuda_available()
    plan.measurements["gpu"] = on_gpu
    if budget.max_bedrock_usd is not None:
        plan.decide(
            "bedrock", "0 USD", "no Bedrock call is planned: candidates are fine-tuned on this machine"
        )
    if budget.max_gpu_hours is not None and not on_gpu:
        plan.decide("gpu hours", "0", "no GPU is visible: training runs on the CPU")


# --------------------------------------------------------------------------- reviewing the data


def review_data(plan: Plan, data: DataReport, cfg: Config, started: float) -> Plan:
    """Refuse when there is nothing to train or hold out, a license is not allowed, or the budget is short."""
    if data.examples == 0:
        plan.refuse(
            f"no data: no {plan.spec.task} examples in the corpus ({data.files} files, {data.files_read} of "
            f"them of the right kind); point the request at repositories that have them"
        )
    elif data.val == 0:
        plan.refuse(f"too little data: {data.examples} example; at least 2 are needed (one is held out)")
    else:
        plan.decide("split", f"{data.train} train / {data.val} val", "examples split by a hash of their key")
    review_licenses(plan, data)
    if not plan.refused:
        review_budget(plan, data, cfg, started)
    return plan


def review_licenses(plan: Plan, data: DataReport) -> None:
    allowed = plan.spec.allowed_licenses
    if allowed is None:
        return
    shown = ", ".join(allowed) or "(none)"
    for finding in data.licenses:
        where = f"{finding['source']} ({finding['repo']})"
        spdx = finding["spdx"]
        if spdx is None:
            plan.refuse(
                f"license: {where} has no license mat could find ({finding['evidence']}); allowed: {shown}"
            )
        elif not any(same_license(spdx, a) for a in allowed):
            plan.refuse(
                f"license: {where} is {spdx} ({finding['evidence']}), not in allowed_licenses: {shown}"
            )
    if not plan.refused:
        plan.decide(
            "licenses found", "allowed", f"{len(data.licenses)} fetched tree(s), each under one of: {shown}"
        )


def review_budget(plan: Plan, data: DataReport, cfg: Config, started: float) -> None:
    smallest = plan.candidate(plan.trial_candidates[0])
    epoch_s = estimates.epoch_seconds(smallest.params, data.train_chars, float(plan.measurements["gflops"]))
    plan.measurements["epoch_estimate_s"] = round(epoch_s, 1)
    budget = plan.spec.requirements.budget
    if budget.max_wall_time_s is not None:
        left = budget.max_wall_time_s - (time.time() - started)
        if left < epoch_s:
            plan.refuse(
                f"budget: one epoch of {smallest.name} over the training set takes about {epoch_s:.0f} s "
                f"here, more than the {max(left, 0):.0f} s left of budget.max_wall_time_s "
                f"({budget.max_wall_time_s:g} s)"
            )
    if (
        budget.max_gpu_hours is not None
        and plan.measurements.get("gpu")
        and epoch_s / 3600 > budget.max_gpu_hours
    ):
        plan.refuse(
            f"budget: one epoch of {smallest.name} takes about {epoch_s / 3600:.2f} GPU hours, more than "
            f"budget.max_gpu_hours {budget.max_gpu_hours:g}"
        )
    if not plan.refused:
        plan.decide(
            "budget", "feasible", f"one epoch of {smallest.name} is estimated at {epoch_s:.1f} s here"
        )


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
