"""The Model agent: short trials on the chosen candidates, then the best trained fully and evaluated.

Trials are a grid over `request.trials.learning_rates` x `lora_ranks` on each candidate the plan chose,
`trials.steps` optimizer steps each, `trials.parallel` at a time. Each trial is a fine-tune target run
by the fine-tune stage (finetune/runner.py: a child process per target, the open-source backend's
LoRA training and held-out loss), with jobs under `<request>/jobs` and adapters under `<request>/models`.

trials.tsv keeps them in the spirit of autoresearch's results.tsv, in trial order: `keep` when the
held-out loss beats every earlier trial, `discard` otherwise, `crash` (loss 0.000000) when it failed.
The best trial's settings are then trained fully (`request.full_steps`, or `full_epochs`) and measured:
held-out loss and perplexity after training, and the base model's loss on the same held-out set
(the backend measures it before the first step, when the LoRA update is still zero).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from multiagenttrainer.atomic import write_bytes_atomically, write_json_atomically
from multiagenttrainer.config import Config, FineTuneTarget
from multiagenttrainer.errors import BackendError
from multiagenttrainer.finetune.base import JobRecord
from multiagenttrainer.finetune.runner import start_targets, visible_gpus
from multiagenttrainer.request.data import DataReport
from multiagenttrainer.request.plan import Plan

TRIALS_TSV = "trials.tsv"
MODEL_JSON = "model.json"
TRIALS_HEADER = ("trial", "model", "lr", "rank", "eval_loss", "status", "description")

StartTargets = Callable[..., list[JobRecord]]


@dataclass
class Trial:
    """One point of the grid and what became of it."""

    trial: int
    model: str
    model_id: str
    lr: float
    rank: int
    eval_loss: float | None = None
    status: str = "pending"  # keep | discard | crash
    description: str = ""
    job_id: str | None = None

    @property
    def target(self) -> str:
        return f"trial-{self.trial}"


@dataclass
class ModelReport:
    """The trials, the best settings, and the fully trained model's figures."""

    trials: list[Trial]
    best_trial: int
    model: str
    model_id: str
    params: int
    memory_gb: float
    job_id: str
    adapter: str
    lr: float
    rank: int
    eval_loss: float
    perplexity: float
    base_eval_loss: float | None
    improvement_pct: float | None
    training_s: float
    gpu_hours: float
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------- the grid and trials.tsv


def trial_grid(plan: Plan, cfg: Config) -> list[Trial]:
    """Every candidate x learning rate x rank, numbered from 1 in that order."""
    trials = cfg.request.trials
    grid = [
        (plan.candidate(name), lr, rank)
        for name in plan.trial_candidates
        for lr in trials.learning_rates
        for rank in trials.lora_ranks
    ]
    return [Trial(i, c.name, c.model_id, lr, rank) for i, (c, lr, rank) in enumerate(grid, start=1)]


def judge_trials(trials: list[Trial]) -> None:
    """keep / discard / crash in trial order: keep only a held-out loss below every earlier one."""
    best: float | None = None
    for trial in trials:
        if trial.eval_loss is None:
            trial.status = "crash"
            continue
        if best is None or trial.eval_loss < best:
            previous = "first trial" if best is None else f"{trial.eval_loss:.4f} < {best:.4f}"
            trial.status, trial.description = "keep", join(previous, trial.description)
            best = trial.eval_loss
        else:
            trial.status = "discard"
            trial.description = join(f"{trial.eval_loss:.4f} >= {best:.4f}", trial.description)


def join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def trials_tsv(trials: list[Trial]) -> str:
    """trials.tsv: a header and one row per trial run; crashes record 0.000000."""
    rows = ["\t".join(TRIALS_HEADER)]
    for t in trials:
        loss = f"{t.eval_loss:.6f}" if t.eval_loss is not None else "0.000000"
        description = " ".join(t.description.replace("\t", " ").split())
        rows.append("\t".join([str(t.trial), t.model, f"{t.lr:g}", str(t.rank), loss, t.status, description]))
    return "\n".join(rows) + "\n"


# --------------------------------------------------------------------------- fine-tuning through the stage


def finetune_config(
    cfg: Config, folder: Path, targets: list[FineTuneTarget], steps: int, epochs: float
) -> Config:
    """The config the fine-tune stage runs these targets with: the request's jobs and models folders."""
    opensource = cfg.finetuner.opensource.model_copy(
        update={"output_dir": str(folder / "models"), "max_steps": steps, "num_epochs": epochs}
    )
    finetuner = cfg.finetuner.model_copy(
        update={
            "backend": "opensource",
            "jobs_dir": str(folder / "jobs"),
            "opensource": opensource,
            "targets": targets,
        }
    )
    return cfg.model_copy(update={"finetuner": finetuner})


def target_for(name: str, model_id: str, lr: float, rank: int, cfg: Config, use_4bit: bool) -> FineTuneTarget:
    """A fine-tune target with these settings; LoRA alpha keeps the config's alpha/rank ratio."""
    opensource = cfg.finetuner.opensource
    alpha = max(1, round(rank * opensource.lora_alpha / opensource.lora_r))
    return FineTuneTarget(
        name=name,
        backend="opensource",
        model_id=model_id,
        learning_rate=lr,
        lora_r=rank,
        lora_alpha=alpha,
        use_4bit=use_4bit,
    )


def run_trials(
    trials: list[Trial],
    plan: Plan,
    cfg: Config,
    folder: Path,
    dataset: str,
    deadline: float | None,
    start: StartTargets,
) -> list[str]:
    """Train the trials, `parallel` at a time, until done or the wall-time budget is spent; notes."""
    batch_size = cfg.request.trials.parallel
    for first in range(0, len(trials), batch_size):
        if deadline is not None and time.time() >= deadline:
            return [f"{len(trials) - first} trial(s) not run: the wall-time budget was spent"]
        batch = trials[first : first + batch_size]
        targets = [
            target_for(t.target, t.model_id, t.lr, t.rank, cfg, plan.candidate(t.model).use_4bit)
            for t in batch
        ]
        records = start(
            finetune_config(cfg, folder, targets, cfg.request.trials.steps, 1),
            dataset,
            plan.request_id,
        )
        for trial, record in zip(batch, records, strict=True):
            trial.job_id = record.id
            trial.eval_loss = record.metrics.get("eval_loss_after") if record.status == "completed" else None
            trial.description = (record.error or "no held-out loss") if trial.eval_loss is None else ""
    return []


def run_model_agent(
    folder: Path,
    plan: Plan,
    data: DataReport,
    cfg: Config,
    started: float,
    start: StartTargets = start_targets,
) -> ModelReport:
    """Trials, trials.tsv, the best trained fully and evaluated; model.json. BackendError if all fail."""
    budget = plan.spec.requirements.budget.max_wall_time_s
    deadline = started + budget if budget is not None else None
    trials = trial_grid(plan, cfg)
    training_started = time.monotonic()
    notes = run_trials(trials, plan, cfg, folder, data.dataset, deadline, start)
    ran = [t for t in trials if t.job_id is not None]
    judge_trials(ran)
    write_bytes_atomically(folder / TRIALS_TSV, trials_tsv(ran).encode("utf-8"))
    scored = [t for t in ran if t.eval_loss is not None]
    if not scored:
        failures = "; ".join(f"{t.target} ({t.model}): {t.description}" for t in ran) or "no trial ran"
        raise BackendError(f"every trial failed, so no model was trained: {failures}")
    best = min(scored, key=lambda t: (t.eval_loss, t.trial))
    record = train_best(best, plan, cfg, folder, data.dataset, start)
    report = model_report(trials, best, plan, record, time.monotonic() - training_started, notes)
    write_json_atomically(folder / MODEL_JSON, report.to_dict())
    return report


def train_best(
    best: Trial, plan: Plan, cfg: Config, folder: Path, dataset: str, start: StartTargets
) -> JobRecord:
    """The best trial's settings trained for request.full_steps (or full_epochs); BackendError if it fails."""
    target = target_for("final", best.model_id, best.lr, best.rank, cfg, plan.candidate(best.model).use_4bit)
    tuned = finetune_config(cfg, folder, [target], cfg.request.full_steps, cfg.request.full_epochs)
    (record,) = start(tuned, dataset, plan.request_id)
    if record.status != "completed" or "eval_loss_after" not in record.metrics:
        raise BackendError(f"the final training of {best.model} (job {record.id}) failed: {record.error}")
    return record


def model_report(
    trials: list[Trial], best: Trial, plan: Plan, record: JobRecord, training_s: float, notes: list[str]
) -> ModelReport:
    """The Model agent's figures for the report and the model card."""
    metrics = record.metrics
    loss, base = float(metrics["eval_loss_after"]), metrics.get("eval_loss_before")
    improvement = (base - loss) / base * 100 if isinstance(base, float) and base > 0 else None
    candidate = plan.candidate(best.model)
    gpus = len(visible_gpus()) if plan.measurements.get("gpu") else 0
    return ModelReport(
        trials=trials,
        best_trial=best.trial,
        model=best.model,
        model_id=best.model_id,
        params=candidate.params,
        memory_gb=candidate.memory_gb,
        job_id=record.id,
        adapter=str(record.output_path),
        lr=best.lr,
        rank=best.rank,
        eval_loss=loss,
        perplexity=float(metrics["perplexity_after"]),
        base_eval_loss=base if isinstance(base, float) else None,
        improvement_pct=improvement,
        training_s=round(training_s, 1),
        gpu_hours=round(training_s / 3600 * gpus, 4),
        notes=notes,
    )
