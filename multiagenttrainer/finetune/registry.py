"""The fine-tuning registry: backend name -> FineTuner class, and `finetuner.targets` resolution.

Backends are imported on first use so that `mat finetune list` does not pay for torch or boto3.
A target starts from its backend's section (`finetuner.opensource` or `finetuner.bedrock`) and
overrides only the fields it declares.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from multiagenttrainer.config import (
    BedrockConfig,
    FinetunerConfig,
    FineTuneTarget,
    OpenSourceConfig,
    target_field_map,
)
from multiagenttrainer.errors import ConfigError
from multiagenttrainer.finetune.base import DEFAULT_TARGET, FineTuner, JobStore


def _opensource() -> type[FineTuner]:
    from multiagenttrainer.finetune.opensource import OpenSourceFineTuner

    return OpenSourceFineTuner


def _bedrock() -> type[FineTuner]:
    from multiagenttrainer.finetune.bedrock import BedrockFineTuner

    return BedrockFineTuner


BACKENDS: dict[str, Callable[[], type[FineTuner]]] = {"opensource": _opensource, "bedrock": _bedrock}

TARGET_METADATA_FIELDS = frozenset({"name", "machine", "backend"})


@dataclass(frozen=True)
class ResolvedTarget:
    """One target with its backend and the backend settings it runs with."""

    name: str
    backend: str
    config: OpenSourceConfig | BedrockConfig
    machine: str | None = None


def backend_class(backend: str) -> Any:
    """The FineTuner class registered for a backend name."""
    try:
        load = BACKENDS[backend]
    except KeyError:
        valid = ", ".join(BACKENDS)
        raise ConfigError(
            f"finetuner.backend: unknown backend {backend!r}; valid backends: {valid}"
        ) from None
    return load()


def backend_defaults(cfg: FinetunerConfig, backend: str) -> OpenSourceConfig | BedrockConfig:
    """The backend's own config section, which every target of that backend starts from."""
    sections: dict[str, OpenSourceConfig | BedrockConfig] = {
        "opensource": cfg.opensource,
        "bedrock": cfg.bedrock,
    }
    if backend not in sections:
        raise ConfigError(
            f"finetuner.backend: unknown backend {backend!r}; valid backends: {', '.join(BACKENDS)}"
        )
    return sections[backend]


def declared_overrides(target: FineTuneTarget) -> dict[str, Any]:
    """The settings a target declares itself (fields left unset are inherited)."""
    values = target.model_dump(exclude_none=True)
    return {key: value for key, value in values.items() if key not in TARGET_METADATA_FIELDS}


def apply_overrides(
    base: OpenSourceConfig | BedrockConfig, backend: str, target: FineTuneTarget, index: int
) -> OpenSourceConfig | BedrockConfig:
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
