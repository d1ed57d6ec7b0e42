"""What `mat serve` serves: a fine-tune job, or a model folder with an optional adapter, as a ModelSpec.

`--job ID` takes a completed open-source job from the job store: its adapter folder and the base
model it was trained on. `--model PATH [--adapter PATH]` takes folders directly; a `--model` folder
that is itself an adapter (an adapter export) brings its base from its adapter_config.json. The
served name is `--name`, else the job id, else the folder's name.
"""

from __future__ import annotations

import re
from pathlib import Path

from multiagenttrainer.errors import ConfigError, ServeError
from multiagenttrainer.finetune.base import JobRecord
from multiagenttrainer.finetune.export import (
    ADAPTER_CONFIG,
    absolute_if_local,
    adapter_base,
    job_adapter_dir,
)
from multiagenttrainer.serve.engine import ModelSpec

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}")


def checked_name(name: str) -> str:
    """A served model name: letters, digits and `._:/@+-`, at most 200 characters."""
    if not NAME_PATTERN.fullmatch(name):
        raise ConfigError(
            f"--name: {name!r} is not a usable model name; use letters, digits and ._:/@+- (up to 200)"
        )
    return name


def spec_from_job(record: JobRecord, name: str | None = None, merge: bool = False) -> ModelSpec:
    """The spec for a completed open-source fine-tune job (its adapter on its base)."""
    adapter = job_adapter_dir(record)
    base = absolute_if_local(adapter_base(adapter, record.model))
    return ModelSpec(base=base, name=checked_name(name or record.id), adapter=adapter.resolve(), merge=merge)


def spec_from_paths(
    model: str, adapter: Path | None = None, name: str | None = None, merge: bool = False
) -> ModelSpec:
    """The spec for `--model PATH [--adapter PATH]`; a model folder holding an adapter brings its base."""
    folder = Path(model).expanduser()
    if adapter is None and (folder / ADAPTER_CONFIG).is_file():
        adapter, model = folder, adapter_base(folder)
    if adapter is not None and not (adapter / ADAPTER_CONFIG).is_file():
        raise ServeError(f"--adapter: no LoRA adapter in {adapter} ({ADAPTER_CONFIG} is missing)")
    check_model_reference(model)
    label = name or default_name(adapter or Path(model))
    return ModelSpec(
        base=absolute_if_local(model),
        name=checked_name(label),
        adapter=adapter.resolve() if adapter is not None else None,
        merge=merge and adapter is not None,
    )


def check_model_reference(model: str) -> None:
    """ServeError for a path-like model that is not a folder (a hub id such as org/name passes)."""
    path = Path(model).expanduser()
    looks_local = model.startswith((".", "/", "~")) or path.exists() or model.count("/") > 1
    if looks_local and not path.is_dir():
        raise ServeError(f"--model: no model folder at {model}; pass a folder saved with save_pretrained")


def default_name(path: Path) -> str:
    """The folder's name, reduced to the characters a model name may hold."""
    cleaned = re.sub(r"[^A-Za-z0-9._:@+-]", "-", path.expanduser().resolve().name).strip("-.")
    return cleaned or "model"
