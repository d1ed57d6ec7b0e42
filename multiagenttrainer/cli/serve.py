"""`mat serve`: a fine-tuned model (a job, or a model folder and adapter) over OpenAI's HTTP API."""

from __future__ import annotations

import signal
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from pydantic import ValidationError

from multiagenttrainer.cli.common import ConfigOption, err, fail, out
from multiagenttrainer.config import Config, ServeConfig, load_config
from multiagenttrainer.errors import ConfigError, MatError
from multiagenttrainer.serve.engine import ENGINE_CHOICES, EngineOptions, ModelSpec


class Terminated(Exception):
    """SIGTERM arrived: stop serving and exit 0."""


def raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


def resolve_spec(
    cfg: Config, job: str | None, model: str | None, adapter: Path | None, name: str | None, merge: bool
) -> ModelSpec:
    """The ModelSpec for --job, or for --model/--adapter (exactly one of --job and --model)."""
    from multiagenttrainer.serve.models import spec_from_job, spec_from_paths

    if (job is None) == (model is None):
        raise ConfigError("give either --job JOB_ID or --model PATH (see `mat serve --help`)")
    if job is not None:
        if adapter is not None:
            raise ConfigError("--adapter goes with --model; a job brings its own adapter")
        from multiagenttrainer.finetune.runner import jobs_store

        return spec_from_job(jobs_store(cfg).get(job), name, merge)
    assert model is not None
    return spec_from_paths(model, adapter, name, merge)


def serve_settings(cfg: Config, host: str | None, port: int | None, engine: str | None) -> ServeConfig:
    """The `serve:` section with the command line's --host, --port and --engine applied (and checked)."""
    updates = {"host": host, "port": port, "engine": engine}
    data = {**cfg.serve.model_dump(), **{k: v for k, v in updates.items() if v is not None}}
    if data["engine"] not in ENGINE_CHOICES:
        raise ConfigError(f"--engine: {data['engine']!r} is not one of {', '.join(ENGINE_CHOICES)}")
    try:
        return ServeConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError([f"--{e['loc'][0]}: {e['msg']}" for e in exc.errors()]) from exc


def report(line: str) -> None:
    """Print a start-up line as it is (paths may hold brackets)."""
    out.print(line, markup=False, highlight=False)


def serve_command(
    job: Annotated[
        str | None, typer.Option("--job", "-j", help="A completed open-source fine-tune job to serve.")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model", "-m", help="A model folder (or an adapter export) to serve instead of a job."
        ),
    ] = None,
    adapter: Annotated[
        Path | None, typer.Option("--adapter", help="A LoRA adapter folder to apply to --model.")
    ] = None,
    host: Annotated[str | None, typer.Option("--host", help="Address to listen on (serve.host).")] = None,
    port: Annotated[
        int | None,
        typer.Option("--port", "-p", min=0, max=65535, help="Port (serve.port); 0 picks a free one."),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", "-n", help="Model name clients send (default: job id or folder).")
    ] = None,
    config: ConfigOption = None,
    merge: Annotated[
        bool, typer.Option("--merge", help="Merge the adapter into the weights once at start.")
    ] = False,
    engine: Annotated[
        str | None, typer.Option("--engine", help="auto, transformers or vllm (serve.engine).")
    ] = None,
    threads: Annotated[
        int | None, typer.Option("--threads", min=1, help="CPU threads for the model (default: all).")
    ] = None,
    access_log: Annotated[
        bool, typer.Option("--access-log/--no-access-log", help="Print one line per request.")
    ] = True,
) -> None:
    """Serve a fine-tuned model over an OpenAI-compatible API until Ctrl-C or SIGTERM."""
    from multiagenttrainer.serve.server import ServeOptions, api_key_from_env, serve_model

    try:
        cfg = load_config(config)
        settings = serve_settings(cfg, host, port, engine)
        api_key = api_key_from_env(settings)
        spec = resolve_spec(cfg, job, model, adapter, name, merge)
    except MatError as exc:
        fail(exc)
    options = ServeOptions(settings.engine, EngineOptions(threads=threads), access_log)
    signal.signal(signal.SIGTERM, raise_terminated)
    try:
        serve_model(spec, settings, options, report, api_key)
    except Terminated:
        err.print("stopped (SIGTERM)")
        raise typer.Exit(0) from None
    except KeyboardInterrupt:
        err.print("stopped")
        raise typer.Exit(130) from None
    except MatError as exc:
        fail(exc)
