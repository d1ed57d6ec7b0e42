"""What a user asks `mat request` for: the task, the data and the requirements, as a validated model.

    spec = load_request(Path("request.yaml"))          # ConfigError: `path: message (file:line)`, exit 2
    spec = parse_request_text(answer, "<planner answer>")

The YAML is read with the config loader's reader (size, encoding, aliases, depth and duplicate keys are
refused the same way) and every problem is reported at once in the config's format. Every number has an
upper bound and unknown keys are errors, as in the config.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from multiagenttrainer.config import MAX_MEMORY_GB, MAX_PARAMS, MAX_REPOS, MAX_TOKENS, WEEK_S
from multiagenttrainer.config.problems import format_validation_errors
from multiagenttrainer.config.yaml_input import parse_yaml_with_lines, read_config_text
from multiagenttrainer.errors import ConfigError

TaskKind = Literal["causal-lm", "code-completion", "docs-qa"]
TASKS: tuple[str, ...] = ("causal-lm", "code-completion", "docs-qa")
MAX_GPU_HOURS = 100_000.0
MAX_USD = 10_000_000.0
SPDX_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+-]*")
CONFIG_EXAMPLE = "configs/config.example.yaml"  # where the config's messages send the reader
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class Section(BaseModel):
    """Base of every part of a request: unknown keys are errors, no infinities or NaN."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class DataSpec(Section):
    sources: list[str] | None = Field(
        None, max_length=MAX_REPOS, description="Names of configured sources; all of them when unset"
    )
    repos: list[str] = Field(
        default_factory=list, max_length=MAX_REPOS, description="Extra repositories: owner/repo or git URLs"
    )


class QualitySpec(Section):
    max_eval_loss: float | None = Field(None, gt=0, le=1000, description="Held-out loss at most this")
    max_perplexity: float | None = Field(None, gt=1, le=1e12, description="Held-out perplexity at most this")
    min_improvement_pct: float | None = Field(
        None, gt=0, lt=100, description="Held-out loss at least this % below the base model's"
    )


class SizeSpec(Section):
    max_params: int | None = Field(None, ge=1, le=MAX_PARAMS, description="Parameters of the base model")
    max_gpu_memory_gb: float | None = Field(
        None, gt=0, le=MAX_MEMORY_GB, description="Memory fine-tuning may take (the estimate)"
    )


class SpeedSpec(Section):
    latency_tokens: int = Field(32, ge=1, le=MAX_TOKENS, description="N: tokens generated per timed request")
    p95_latency_ms: float | None = Field(
        None, gt=0, le=3_600_000, description="95th percentile latency of one N-token request"
    )
    min_tokens_per_s: float | None = Field(None, gt=0, le=1e9, description="Generated tokens per second")


class BudgetSpec(Section):
    max_wall_time_s: float | None = Field(None, gt=0, le=WEEK_S * 52, description="Whole request, seconds")
    max_gpu_hours: float | None = Field(None, ge=0, le=MAX_GPU_HOURS)
    max_bedrock_usd: float | None = Field(None, ge=0, le=MAX_USD)


class Requirements(Section):
    quality: QualitySpec = Field(default_factory=QualitySpec)
    size: SizeSpec = Field(default_factory=SizeSpec)
    speed: SpeedSpec = Field(default_factory=SpeedSpec)
    budget: BudgetSpec = Field(default_factory=BudgetSpec)


SpdxId = Annotated[str, Field(min_length=1, max_length=64)]


class RequestSpec(Section):
    """One request: `task`, `data`, `requirements`, `allowed_licenses` (SPDX ids; unset: any license)."""

    name: str | None = Field(
        None, max_length=64, description="Label of the request; the file's name if unset"
    )
    task: TaskKind
    description: str = Field("", max_length=10_000, description="What the model is for, in words")
    data: DataSpec = Field(default_factory=DataSpec)
    requirements: Requirements = Field(default_factory=Requirements)
    allowed_licenses: list[SpdxId] | None = Field(None, max_length=200)

    @field_validator("name")
    @classmethod
    def _name_shape(cls, value: str | None) -> str | None:
        if value is not None and not NAME.fullmatch(value):
            raise ValueError("must start with a letter or digit and hold only letters, digits, _ . -")
        return value

    @field_validator("allowed_licenses")
    @classmethod
    def _spdx_ids(cls, value: list[str] | None) -> list[str] | None:
        for spdx in value or []:
            if not SPDX_ID.fullmatch(spdx):
                raise ValueError(f"{spdx!r} is not an SPDX id such as MIT, Apache-2.0 or BSD-3-Clause")
        return value

    def to_yaml_dict(self) -> dict[str, Any]:
        """The request as JSON-able data, without the fields left unset."""
        return self.model_dump(mode="json", exclude_none=True)


# --------------------------------------------------------------------------- reading


def parse_request_text(text: str, filename: str) -> RequestSpec:
    """Validate YAML text as a request; ConfigError listing every problem as `path: message (file:line)`."""
    data, lines = parse_yaml_with_lines(text, filename)
    if not data:
        raise ConfigError(
            f"<root>: the request is empty; it needs at least `task:` ({', '.join(TASKS)}) ({filename}:1)"
        )
    try:
        return RequestSpec.model_validate(data)
    except ValidationError as exc:
        problems = format_validation_errors(exc, data, lines, filename)
        example = "the example request in README.md"
        raise ConfigError([p.replace(CONFIG_EXAMPLE, example) for p in problems]) from None


def load_request(path: Path) -> RequestSpec:
    """The request in a YAML file; ConfigError when it is missing, unreadable or invalid."""
    if not path.is_file():
        raise ConfigError(
            f"{path}: request file not found; write one (see README, `From a request to a model`) "
            'or describe the model with --text "..."'
        )
    return parse_request_text(read_config_text(path), str(path))
