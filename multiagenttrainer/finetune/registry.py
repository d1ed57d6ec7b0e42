"""The fine-tuning registry: backend name -> FineTuner class, and `finetuner.targets` resolution.

The built-in backends are imported on first use so that `mat finetune list` does not pay for torch or
boto3. A plugin adds a backend with one call, with no edit to mat's own code (README, "Adding a backend"):

    register_backend("mycloud", MyCloudFineTuner, MyCloudConfig)   # in a module named by MAT_PLUGINS,
                                                                   # or loaded by an entry point
A target starts from its backend's section (`finetuner.opensource`, `finetuner.bedrock`,
`finetuner.<plugin>`) and overrides only the fields that section's model lets targets set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from multiagenttrainer.config import FinetunerConfig, FineTuneTarget, target_field_map
from multiagenttrainer.config.backends import load_plugins, register_backend_section, unknown_backend_message
from multiagenttrainer.errors import ConfigError
from multiagenttrainer.finetune.base import DEFAULT_TARGET, FineTuner, JobStore


def _opensource() -> type[FineTuner]:
    from multiagenttrainer.finetune.opensource import OpenSourceFineTuner

    return OpenSourceFineTuner


def _bedrock() -> type[FineTuner]:
    from multiagenttrainer.finetune.bedrock import BedrockFineTuner

    return BedrockFineTuner


BACKENDS: dict[str, Callable[[], type[FineTuner]]] = {"opensource": _opensource, "bedrock": _bedrock}


def register_backend(name: str, finetuner: type[FineTuner], config_model: type[BaseModel]) -> None:
    """Make a backend available: `finetuner.backend: <name>`, its `finetuner.<name>:` section, targets.

    `finetuner` is constructed as `finetuner(section, store, target_name)`, with the section validated
    by `config_model` (whose fields that targets may set say so with `set_by_targets(...)`).
    """
    if not (isinstance(finetuner, type) and issubclass(finetuner, FineTuner)):
        raise TypeError(f"backend {name!r}: {finetuner!r} is not a subclass of FineTuner")
    register_backend_section(name, config_model)
    BACKENDS[name] = lambda: finetuner


TARGET_METADATA_FIELDS = frozenset({"name", "machine", "backend"})


@dataclass(frozen=True)
class ResolvedTarget:
    """One target with its backend and the backend settings it runs with."""

    name: str
    backend: str
    config: BaseModel  # the backend's section model: OpenSourceConfig, BedrockConfig or a plugin's
    machine: str | None = None


def backend_class(backend: str) -> Any:
    """The FineTuner class registered for a backend name."""
    load_plugins()
    try:
        load = BACKENDS[backend]
    except KeyError:
        raise ConfigError(f"finetuner.backend: {unknown_backend_message(backend)}") from None
    return load()


def backend_defaults(cfg: FinetunerConfig, backend: str) -> BaseModel:
    """The backend's own config section, which every target of that backend starts from."""
    return cfg.section(backend)


def model_name(config: BaseModel) -> str:
    """The model a backend section fine-tunes: the field that a target's `model_id` sets."""
    field = target_field_map(type(config)).get("model_id")
    return str(getattr(config, field, "") or "") if field else ""


def declared_overrides(target: FineTuneTarget) -> dict[str, Any]:
    """The settings a target declares itself (fields left unset are inherited)."""
    values = target.model_dump(exclude_none=True)
    return {key: value for key, value in values.items() if key not in TARGET_METADATA_FIELDS}


def apply_overrides(base: BaseModel, backend: str, target: FineTuneTarget, index: int) -> BaseModel:
    """The backend config with the target's declared fields mapped onto it and validated."""
    field_map = target_field_map(type(base))  # declared by the backend's config model
    where = f"finetuner.targets[{index}] ({target.name!r})"
    updates: dict[str, Any] = {}
    for key, value in declared_overrides(target).items():
        if key not in field_map:
            valid = ", ".join(sorted(field_map))
            raise ConfigError(
                f"{where}: {key!r} does not apply to the {backend} backend; its fields are: {valid}"
            )
        updates[field_map[key]] = value
    if backend == "bedrock" and "epochs" in updates:
        updates["epochs"] = whole_epochs(updates["epochs"], where)
    try:
        return type(base).model_validate({**base.model_dump(), **updates})
    except ValidationError as exc:
        problems = [f"{where}.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(problems) from None


def whole_epochs(value: float, where: str) -> int:
    """Bedrock counts epochs in whole numbers; a fractional value is a config error."""
    if float(value) != int(value):
        raise ConfigError(f"{where}: Bedrock needs a whole number of epochs, got {value}; use 1, 2, 3...")
    return int(value)


def resolve_targets(cfg: FinetunerConfig) -> list[ResolvedTarget]:
    """Every configured target with its settings; no targets means one `default` target."""
    if not cfg.targets:
        return [ResolvedTarget(DEFAULT_TARGET, cfg.backend, backend_defaults(cfg, cfg.backend))]
    resolved = []
    for index, target in enumerate(cfg.targets):
        backend = target.backend or cfg.backend
        config = apply_overrides(backend_defaults(cfg, backend), backend, target, index)
        resolved.append(ResolvedTarget(target.name, backend, config, target.machine))
    return resolved


def select_target(targets: list[ResolvedTarget], name: str | None) -> ResolvedTarget:
    """The target called `name`, or the only/first one when no name is given."""
    if name is None:
        return targets[0]
    for target in targets:
        if target.name == name:
            return target
    valid = ", ".join(t.name for t in targets)
    raise ConfigError(f"--target {name!r}: no such fine-tuning target; configured targets: {valid}")


def make_finetuner(target: ResolvedTarget, store: JobStore) -> FineTuner:
    """The backend instance for one resolved target."""
    finetuner: FineTuner = backend_class(target.backend)(target.config, store, target.name)
    return finetuner
