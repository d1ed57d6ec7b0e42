"""`mat finetune start|list|status|cancel|export`: fine-tuning jobs on the corpus, open-source or Bedrock."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from multiagenttrainer.cli.common import ConfigOption, JsonOption, err, fail, out, prepare_prefect, warn
from multiagenttrainer.config import load_config
from multiagenttrainer.errors import MatError

finetune_app = typer.Typer(
    help="Fine-tune models on the corpus (open-source LoRA or Amazon Bedrock).", no_args_is_help=True
)


@finetune_app.command("start")
def finetune_start(
    config: ConfigOption = None,
    corpus: Annotated[
        Path | None,
        typer.Option(
            "--corpus",
            help="corpus.jsonl, a corpus folder or any UTF-8 text file (default: <corpus.dir>/corpus.jsonl).",
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", "-n", help="Job name (default: the config file's name).")
    ] = None,
    target: Annotated[
        str | None, typer.Option("--target", "-t", help="Run only this target of finetuner.targets.")
    ] = None,
) -> None:
    """Start every fine-tuning target at once; waits for local ones, prints Bedrock job ARNs."""
    from multiagenttrainer.errors import TargetsFailed
    from multiagenttrainer.finetune.base import JobRecord
    from multiagenttrainer.finetune.display import FinetuneProgress
    from multiagenttrainer.finetune.runner import check_targets, chosen_targets, corpus_or_error

    try:
        cfg = load_config(config)  # config, QLoRA and corpus problems stop here, before anything starts
        check_targets(chosen_targets(cfg, target))
        corpus_path = corpus_or_error(cfg, corpus)
    except MatError as exc:
        fail(exc)
    prepare_prefect()
    from flows.finetune import run_finetune

    reporter = FinetuneProgress(err, enabled=err.is_terminal)
    try:
        with reporter:
            summary = run_finetune(
                cfg, config_path=config, corpus=corpus_path, name=name, target=target, on_progress=reporter
            )
    except TargetsFailed as exc:
        print_job_lines([JobRecord.from_dict(job) for job in exc.summary["jobs"]])
        fail(exc)
    except MatError as exc:
        fail(exc)
    print_job_lines([JobRecord.from_dict(job) for job in summary["jobs"]])


def print_job_lines(records: list[Any]) -> None:
    """One line per job: target, status, and the adapter folder or the Bedrock ARN."""
    for record in records:
        where = record.external_id or record.output_path or ""
        detail = f" ({record.error})" if record.error else ""
        out.print(f"{record.target}: job {record.id} {record.status} {where}{detail}".rstrip(), markup=False)


@finetune_app.command("list")
def finetune_list(config: ConfigOption = None, as_json: JsonOption = False) -> None:
    """Every fine-tuning job recorded under finetuner.jobs_dir."""
    from multiagenttrainer.finetune.display import render_jobs_table
    from multiagenttrainer.finetune.runner import list_jobs

    try:
        records, skipped = list_jobs(load_config(config))
    except MatError as exc:
        fail(exc)
    for bad in skipped:
        warn(bad.warning)
    if as_json:
        out.print_json(data=[r.to_dict() for r in records])
    elif not records:
        out.print("No fine-tuning jobs yet; start one with `mat finetune start`.")
    else:
        render_jobs_table(out, records)


@finetune_app.command("status")
def finetune_status(
    job_id: Annotated[str, typer.Argument(help="Job id (or Bedrock job ARN) from `mat finetune list`.")],
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """One job's state; Bedrock jobs are refreshed from AWS."""
    from multiagenttrainer.finetune.display import render_job
    from multiagenttrainer.finetune.runner import status as job_status

    try:
        record = job_status(load_config(config), job_id)
    except MatError as exc:
        fail(exc)
    if as_json:
        out.print_json(data=record.to_dict())
    else:
        render_job(out, record)


@finetune_app.command("cancel")
def finetune_cancel(
    job_id: Annotated[str, typer.Argument(help="Job id (or Bedrock job ARN) from `mat finetune list`.")],
    config: ConfigOption = None,
) -> None:
    """Cancel a job: a local one stops at its next step (keeping a checkpoint), a Bedrock one is stopped."""
    from multiagenttrainer.finetune.runner import cancel as cancel_job

    try:
        record = cancel_job(load_config(config), job_id)
    except MatError as exc:
        fail(exc)
    state = "cancelled" if record.status == "cancelled" else f"{record.status}; stopping at its next step"
    out.print(f"job {record.id}: {state}", markup=False)


@finetune_app.command("export")
def finetune_export(
    job_id: Annotated[str, typer.Argument(help="A completed open-source job (see `mat finetune list`).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="New folder to write the model to.")],
    merge: Annotated[
        bool, typer.Option("--merge", help="Merge the adapter into the base weights (a plain model).")
    ] = False,
    config: ConfigOption = None,
) -> None:
    """Export a job's LoRA adapter, or the base model with it merged, as safetensors plus tokenizer."""
    from multiagenttrainer.finetune.export import export_job
    from multiagenttrainer.finetune.runner import jobs_store

    try:
        record = jobs_store(load_config(config)).get(job_id)
        result = export_job(record, output, merge)
    except MatError as exc:
        fail(exc)
    what = "merged model" if result.merged else "adapter"
    files = ", ".join(result.files)
    out.print(f"exported the {what} of job {record.id} to {result.path}: {files}", markup=False)
    out.print(f"load it with AutoModelForCausalLM.from_pretrained({str(result.path)!r})", markup=False)
