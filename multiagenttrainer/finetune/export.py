"""Exporting a finished open-source fine-tune job (`mat finetune export`), and finding its adapter.

Two forms, both loadable with `AutoModelForCausalLM.from_pretrained(DIR)`:

- adapter: `adapter_model.safetensors`, `adapter_config.json` (its base model made absolute when it
  is a local folder) and the tokenizer; transformers loads the base and applies the adapter (PEFT).
- merged (`--merge`): the base weights with the adapter merged in (`merge_and_unload`), saved as
  safetensors with the tokenizer: a plain model, no PEFT needed to load it.

The export is written to a hidden folder beside the output and renamed into place at the end, so a
failed or interrupted export never leaves a half-written model where a loader would find it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multiagenttrainer.errors import ConfigError, ServeError
from multiagenttrainer.finetune.base import JobRecord

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


@dataclass(frozen=True)
class ExportResult:
    """Where the export went, whether it is merged, and the files written."""

    path: Path
    merged: bool
    files: list[str]


# --------------------------------------------------------------------------- a job's adapter


def job_adapter_dir(record: JobRecord) -> Path:
    """The adapter folder of a completed open-source job; ServeError saying why a job has none."""
    if record.backend != "opensource":
        raise ServeError(
            f"job {record.id} ran on {record.backend}; only open-source jobs have local weights "
            "(a Bedrock model is used through AWS)"
        )
    if record.status != "completed":
        raise ServeError(
            f"job {record.id} is {record.status}, not completed; `mat finetune status {record.id}` shows why"
        )
    folder = Path(record.output_path or "")
    if not record.output_path or not (folder / ADAPTER_CONFIG).is_file():
        raise ServeError(f"job {record.id}: no adapter in {folder} ({ADAPTER_CONFIG} is missing)")
    return folder


def read_adapter_config(adapter: Path) -> dict[str, Any]:
    """adapter_config.json as a dict; ServeError when it is missing or not a JSON object."""
    try:
        data = json.loads((adapter / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ServeError(f"cannot read {adapter / ADAPTER_CONFIG}: {exc}") from exc
    if not isinstance(data, dict):
        raise ServeError(f"{adapter / ADAPTER_CONFIG} is not a JSON object")
    return data


def adapter_base(adapter: Path, fallback: str | None = None) -> str:
    """The base model an adapter was trained on (its config's base_model_name_or_path, else fallback)."""
    base = read_adapter_config(adapter).get("base_model_name_or_path") or fallback
    if not isinstance(base, str) or not base:
        raise ServeError(
            f"{adapter / ADAPTER_CONFIG} names no base model; pass --model BASE --adapter {adapter}"
        )
    return base


def absolute_if_local(model: str) -> str:
    """A model reference made absolute when it is a local folder (hub ids are left alone)."""
    path = Path(model).expanduser()
    return str(path.resolve()) if path.is_dir() else model


# --------------------------------------------------------------------------- export


def export_job(record: JobRecord, output: Path, merge: bool) -> ExportResult:
    """Write the job's adapter (or the merged model) with its tokenizer to `output`."""
    adapter = job_adapter_dir(record)
    base = absolute_if_local(adapter_base(adapter, record.model))
    check_output(output)
    with staging_folder(output) as staging:
        if merge:
            merge_adapter(base, adapter, staging)
        else:
            copy_adapter(adapter, base, staging)
    return ExportResult(output, merge, sorted(p.name for p in output.iterdir()))


def check_output(output: Path) -> None:
    """ConfigError unless `output` is new or an empty folder."""
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ConfigError(
            f"--output: {output} already exists and is not an empty folder; choose a new folder"
        )


@contextmanager
def staging_folder(output: Path) -> Iterator[Path]:
    """A hidden folder beside `output`, renamed to it when the block succeeds and removed otherwise."""
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = output.parent / f".{output.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        yield staging
        os.replace(staging, output)  # also over an empty folder
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def copy_adapter(adapter: Path, base: str, target: Path) -> None:
    """The adapter weights as they are, its config pointing at `base`, and the tokenizer."""
    weights = adapter / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise ServeError(f"{adapter} has no {ADAPTER_WEIGHTS}; train the job again with this version of mat")
    shutil.copyfile(weights, target / ADAPTER_WEIGHTS)
    config = {**read_adapter_config(adapter), "base_model_name_or_path": base}
    (target / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    save_tokenizer(adapter, base, target)


def merge_adapter(base: str, adapter: Path, target: Path) -> None:
    """The base with the adapter merged into its weights, saved as safetensors, and the tokenizer."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(base, dtype="auto")
        merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ServeError(f"cannot merge adapter {adapter} into {base}: {first_line(exc)}") from exc
    merged.save_pretrained(str(target))  # safetensors: the only format transformers 5 writes
    save_tokenizer(adapter, base, target)


def save_tokenizer(adapter: Path, base: str, target: Path) -> None:
    """The job's tokenizer (saved beside its adapter), else the base model's, into `target`."""
    from transformers import AutoTokenizer

    source = str(adapter) if (adapter / "tokenizer_config.json").is_file() else base
    try:
        AutoTokenizer.from_pretrained(source).save_pretrained(str(target))
    except (OSError, ValueError) as exc:
        raise ServeError(f"cannot copy the tokenizer from {source}: {first_line(exc)}") from exc


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
