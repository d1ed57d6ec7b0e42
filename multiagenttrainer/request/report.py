"""report.md and MODEL_CARD.md: each requirement met or not with its figure, and what the model is.

`judge` compares every requirement the request set with what was measured: the held-out loss,
perplexity and improvement over the base model (Model agent), the base model's size and memory
estimate (Task agent), latency and tokens/s through the endpoint (Server agent), the wall time and
GPU hours spent, and the licenses of the data (Data agent). A requirement the request did not set is
not listed. The request is met when every listed requirement is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from multiagenttrainer.atomic import write_bytes_atomically
from multiagenttrainer.request.data import DataReport
from multiagenttrainer.request.model import ModelReport
from multiagenttrainer.request.plan import Plan, cell
from multiagenttrainer.request.schema import RequestSpec
from multiagenttrainer.request.serving import SpeedReport

REPORT_MD = "report.md"
MODEL_CARD_MD = "MODEL_CARD.md"


@dataclass(frozen=True)
class Verdict:
    """One requirement: what was asked, what was measured, and whether it is met."""

    requirement: str
    target: str
    figure: str
    met: bool

    def line(self) -> str:
        return (
            f"{self.requirement}: {'met' if self.met else 'NOT met'} ({self.figure}; required {self.target})"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Outcome:
    """Everything the report is written from."""

    plan: Plan
    data: DataReport
    model: ModelReport
    speed: SpeedReport
    wall_s: float

    @property
    def spec(self) -> RequestSpec:
        return self.plan.spec


# --------------------------------------------------------------------------- judging


def judge(outcome: Outcome) -> list[Verdict]:
    """A verdict for each requirement the request set, in the order of the request's sections."""
    return [
        *quality_verdicts(outcome),
        *size_verdicts(outcome),
        *speed_verdicts(outcome),
        *budget_verdicts(outcome),
        *license_verdicts(outcome),
    ]


def quality_verdicts(outcome: Outcome) -> list[Verdict]:
    quality, model = outcome.spec.requirements.quality, outcome.model
    verdicts = []
    if quality.max_eval_loss is not None:
        verdicts.append(
            Verdict(
                "quality.max_eval_loss",
                f"<= {quality.max_eval_loss:g}",
                f"held-out loss {model.eval_loss:.4f}",
                model.eval_loss <= quality.max_eval_loss,
            )
        )
    if quality.max_perplexity is not None:
        verdicts.append(
            Verdict(
                "quality.max_perplexity",
                f"<= {quality.max_perplexity:g}",
                f"perplexity {model.perplexity:.2f}",
                model.perplexity <= quality.max_perplexity,
            )
        )
    if quality.min_improvement_pct is not None:
        gain = model.improvement_pct
        figure = (
            "no base model loss"
            if gain is None
            else (f"{gain:.2f} % below the base model's {model.base_eval_loss:.4f}")
        )
        verdicts.append(
            Verdict(
                "quality.min_improvement_pct",
                f">= {quality.min_improvement_pct:g} %",
                figure,
                gain is not None and gain >= quality.min_improvement_pct,
            )
        )
    return verdicts


def size_verdicts(outcome: Outcome) -> list[Verdict]:
    size, model = outcome.spec.requirements.size, outcome.model
    verdicts = []
    if size.max_params is not None:
        verdicts.append(
            Verdict(
                "size.max_params",
                f"<= {size.max_params:,}",
                f"{model.params:,} parameters",
                model.params <= size.max_params,
            )
        )
    if size.max_gpu_memory_gb is not None:
        verdicts.append(
            Verdict(
                "size.max_gpu_memory_gb",
                f"<= {size.max_gpu_memory_gb:g} GB",
                f"~{model.memory_gb:.3g} GB to fine-tune (estimate)",
                model.memory_gb <= size.max_gpu_memory_gb,
            )
        )
    return verdicts


def speed_verdicts(outcome: Outcome) -> list[Verdict]:
    speed, measured = outcome.spec.requirements.speed, outcome.speed
    verdicts = []
    if speed.p95_latency_ms is not None:
        verdicts.append(
            Verdict(
                "speed.p95_latency_ms",
                f"<= {speed.p95_latency_ms:g} ms",
                f"p95 {measured.p95_ms:g} ms for {measured.latency_tokens} tokens",
                measured.p95_ms <= speed.p95_latency_ms,
            )
        )
    if speed.min_tokens_per_s is not None:
        verdicts.append(
            Verdict(
                "speed.min_tokens_per_s",
                f">= {speed.min_tokens_per_s:g}",
                f"{measured.tokens_per_s:g} tokens/s",
                measured.tokens_per_s >= speed.min_tokens_per_s,
            )
        )
    return verdicts


def budget_verdicts(outcome: Outcome) -> list[Verdict]:
    budget = outcome.spec.requirements.budget
    verdicts = []
    if budget.max_wall_time_s is not None:
        verdicts.append(
            Verdict(
                "budget.max_wall_time_s",
                f"<= {budget.max_wall_time_s:g} s",
                f"{outcome.wall_s:.0f} s",
                outcome.wall_s <= budget.max_wall_time_s,
            )
        )
    if budget.max_gpu_hours is not None:
        hours = outcome.model.gpu_hours
        verdicts.append(
            Verdict(
                "budget.max_gpu_hours",
                f"<= {budget.max_gpu_hours:g}",
                f"{hours:g} GPU hours",
                hours <= budget.max_gpu_hours,
            )
        )
    if budget.max_bedrock_usd is not None:
        verdicts.append(
            Verdict(
                "budget.max_bedrock_usd",
                f"<= {budget.max_bedrock_usd:g} USD",
                "0 USD (no Bedrock call was made)",
                True,
            )
        )
    return verdicts


def license_verdicts(outcome: Outcome) -> list[Verdict]:
    allowed = outcome.spec.allowed_licenses
    if allowed is None:
        return []
    found = sorted({str(f["spdx"]) for f in outcome.data.licenses})
    return [Verdict("allowed_licenses", ", ".join(allowed) or "(none)", ", ".join(found) or "no data", True)]


# --------------------------------------------------------------------------- writing


def write_reports(folder: Path, outcome: Outcome, verdicts: list[Verdict]) -> None:
    """report.md and MODEL_CARD.md in the request folder."""
    write_bytes_atomically(folder / REPORT_MD, render_report(outcome, verdicts).encode("utf-8"))
    write_bytes_atomically(folder / MODEL_CARD_MD, render_model_card(outcome, verdicts).encode("utf-8"))


def verdict_table(verdicts: list[Verdict]) -> list[str]:
    if not verdicts:
        return ["The request set no requirements."]
    rows = ["| requirement | required | measured | met |", "|---|---|---|---|"]
    rows += [
        f"| {v.requirement} | {cell(v.target)} | {cell(v.figure)} | {'yes' if v.met else '**no**'} |"
        for v in verdicts
    ]
    return rows


def render_report(outcome: Outcome, verdicts: list[Verdict]) -> str:
    """report.md: the outcome, each requirement, the trials, the data and the endpoint."""
    model, speed, data = outcome.model, outcome.speed, outcome.data
    met = all(v.met for v in verdicts)
    lines = [
        f"# Request {outcome.plan.request_id}: {'met' if met else 'not met'}",
        "",
        f"Task `{outcome.spec.task}`; model {model.model} (`{model.model_id}`) with a LoRA adapter "
        f"(rank {model.rank}, learning rate {model.lr:g}), fine-tune job `{model.job_id}`.",
        "",
        "## Requirements",
        "",
        *verdict_table(verdicts),
        "",
        "## Trials",
        "",
        "| trial | model | lr | rank | held-out loss | status | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in model.trials:
        loss = f"{t.eval_loss:.4f}" if t.eval_loss is not None else "-"
        status = t.status if t.job_id else "not run"
        lines.append(
            f"| {t.trial} | {t.model} | {t.lr:g} | {t.rank} | {loss} | {status} | {cell(t.description)} |"
        )
    lines += [
        "",
        "## Figures",
        "",
        f"- held-out loss {model.eval_loss:.4f}, perplexity {model.perplexity:.2f}"
        + (f"; base model {model.base_eval_loss:.4f}" if model.base_eval_loss is not None else ""),
        f"- data: {data.train} train / {data.val} held-out examples from {data.files} corpus files",
        f"- speed: p50 {speed.p50_ms:g} ms, p95 {speed.p95_ms:g} ms for {speed.latency_tokens} tokens; "
        f"{speed.tokens_per_s:g} tokens/s over {speed.requests} requests",
        f"- time: {outcome.wall_s:.0f} s in all, {model.training_s:.0f} s of it training; "
        f"{model.gpu_hours:g} GPU hours",
        f"- endpoint: {speed.url} (model `{speed.model}`)"
        + ("" if speed.serving else ", stopped at the end of the request"),
    ]
    lines += [f"- note: {note}" for note in [*data.notes, *model.notes]]
    return "\n".join(lines) + "\n"


def render_model_card(outcome: Outcome, verdicts: list[Verdict]) -> str:
    """MODEL_CARD.md: the model, its intended use, data and licenses, metrics against the request, limits."""
    model, data, spec, speed = outcome.model, outcome.data, outcome.spec, outcome.speed
    lines = [
        f"# Model card: {outcome.plan.request_id}",
        "",
        "## Model",
        "",
        f"- base: `{model.model_id}` ({model.params:,} parameters), catalog entry `{model.model}`",
        f"- fine-tuning: LoRA rank {model.rank}, learning rate {model.lr:g}, chosen among "
        f"{len([t for t in model.trials if t.job_id])} trials by held-out loss",
        f"- adapter: `{model.adapter}` (job `{model.job_id}`); "
        f"serve it with `mat serve --job {model.job_id}`",
        "",
        "## Intended use",
        "",
        f"Task `{spec.task}`. {spec.description}".rstrip(),
        "",
        "## Data and licenses",
        "",
        f"{data.files} corpus files ({data.files_read} read for this task, {data.files_skipped} skipped "
        f"as unparsable) gave {data.examples} examples: {data.train} for training, {data.val} held out.",
        "",
        "| source | repository | license | from |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {f['source']} | {f['repo']} | {f['spdx'] or 'none found'} | {cell(str(f['evidence']))} |"
        for f in data.licenses
    ]
    lines += [
        "",
        "## Metrics against the request",
        "",
        *verdict_table(verdicts),
        "",
        "## Limits",
        "",
        f"- The held-out set is {data.val} example(s) from the same repositories as the training data, "
        "not an independent benchmark; the loss says how well the model fits this code base.",
        *(
            ["- Pairs are trained as one text each: the loss covers the prompt as well as the completion."]
            if spec.task != "causal-lm"
            else []
        ),
        "- The memory figure is an estimate made before training (LoRA ~2 GB per billion parameters "
        "plus activations), not a measured peak.",
        f"- Latency and tokens/s were measured one request at a time on this machine through `mat serve` "
        f"({speed.requests} requests of {speed.latency_tokens} tokens); other machines and concurrent "
        "load give other figures.",
        "- Licenses were read from LICENSE/COPYING files (or GitHub's API); files under other licenses "
        "inside a repository are not detected. The base model's own license and terms also apply.",
    ]
    return "\n".join(lines) + "\n"
