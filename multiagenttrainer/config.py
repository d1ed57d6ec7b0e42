"""Configuration: pydantic models for every section of multiagenttrainer.yaml, and its loader.

Every model forbids unknown keys, so a typo is an error rather than a silent default. The loader
reports every problem at once as ``dotted.path: message (file:line)``. Environment variables
prefixed with ``MAT_`` override file values (``MAT_TRAINING__MAX_EXPERIMENTS=3``). Secrets are
never read from the file: GitHub tokens come from the environment, AWS credentials from boto3's
chain, SSH keys by path.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from multiagenttrainer.errors import ConfigError

DEFAULT_CONFIG_FILE = "multiagenttrainer.yaml"


class Model(BaseModel):
    """Base for every config section: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


# --------------------------------------------------------------------------- sources


class SourceBase(Model):
    name: str | None = Field(None, description="Label used in logs, stats and the corpus; derived if unset")


class LocalRepoSource(SourceBase):
    type: Literal["local_repo"]
    path: str
    include: list[str] = Field(default_factory=list, description="gitignore-style globs to keep")
    exclude: list[str] = Field(default_factory=list, description="gitignore-style globs to drop")


class RemoteRepoSource(SourceBase):
    type: Literal["remote_repo"]
    url: str
    branch: str | None = Field(None, description="Branch to ingest; the remote's default branch if unset")
    include: list[str] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)
    token_env: str | None = Field(None, description="Environment variable holding an HTTP token")


class GithubRepoSource(SourceBase):
    type: Literal["github_repo"]
    url: str
    branch: str | None = None
    include: list[str] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)
    token_env: str = "GITHUB_TOKEN"


class GithubOrgSource(SourceBase):
    type: Literal["github_org"]
    url: str
    max_repos: int = Field(100, ge=1)
    visibility: Literal["all", "public", "private"] = "all"
    include: list[str] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)
    token_env: str = "GITHUB_TOKEN"


class GithubRepoListSource(SourceBase):
    type: Literal["github_repo_list"]
    repos: list[str] = Field(min_length=1)
    branch: str | None = None
    include: list[str] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)
    token_env: str = "GITHUB_TOKEN"


class BedrockKnowledgeBaseSource(SourceBase):
    type: Literal["bedrock_knowledge_base"]
    knowledge_base_id: str
    region: str | None = Field(None, description="AWS region; boto3's default region if unset")
    query: str = "training data for code generation"
    max_results: int = Field(100, ge=1, le=10_000)

    @field_validator("knowledge_base_id")
    @classmethod
    def _kb_id_shape(cls, value: str) -> str:
        if not re.fullmatch(
            r"[0-9A-Za-z]{10}|arn:aws[\w-]*:bedrock:.+:knowledge-base/[0-9A-Za-z]{10}", value
        ):
            raise ValueError("must be 10 letters or digits (for example ABCDEF1234) or a knowledge-base ARN")
        return value


SourceConfig = Annotated[
    LocalRepoSource
    | RemoteRepoSource
    | GithubRepoSource
    | GithubOrgSource
    | GithubRepoListSource
    | BedrockKnowledgeBaseSource,
    Field(discriminator="type"),
]


# --------------------------------------------------------------------------- execution and machines


class LocalExecution(Model):
    type: Literal["local"] = "local"


class SshExecution(Model):
    type: Literal["ssh"]
    ssh_host: str = Field(description="[user@]host[:port]")
    ssh_key: str | None = Field(None, description="Private key path; SSH defaults otherwise")
    remote_dir: str = "/tmp/mat-runs"


class DockerExecution(Model):
    type: Literal["docker"]
    container: str = Field(description="Name or id of a running container")
    container_dir: str = "/tmp/mat-runs"


ExecutionConfig = Annotated[LocalExecution | SshExecution | DockerExecution, Field(discriminator="type")]


class MachineConfig(Model):
    name: str
    execution: ExecutionConfig = Field(default_factory=LocalExecution)
    agent_command: str | None = None


# --------------------------------------------------------------------------- autoresearch and training


class AutoresearchConfig(Model):
    repo: str | None = Field(
        None, description="URL or path of an autoresearch checkout; built-in template if unset"
    )
    branch: str = "master"
    train_time: int = Field(300, ge=1, description="Training time budget per experiment, seconds")
    program_md: str | None = Field(None, description="Path to a program.md that replaces the default")
    verify: bool = Field(
        False,
        description="Real autoresearch only: re-score train.py's checkpoint apart from training (train.py "
        "must define build_model() and save checkpoint.pt; see the README's protections)",
    )


class TrainingConfig(Model):
    agent_command: str | None = Field(
        None, description="Command with {prompt} / {prompt_file}; built-in agent if unset"
    )
    max_experiments: int = Field(10, ge=1)
    output_dir: str = "./runs"
    mode: Literal["harness", "agent"] = "harness"
    agent_timeout: int = Field(900, ge=1, description="Seconds an agent may take for one change")
    execution: ExecutionConfig = Field(default_factory=LocalExecution)


# --------------------------------------------------------------------------- notifications


class SesConfig(Model):
    from_email: str
    to_emails: list[str] = Field(min_length=1)
    region: str | None = None
    subject_prefix: str = "[MultiAgentTrainer]"


class NotificationsConfig(Model):
    ses: SesConfig | None = None


# --------------------------------------------------------------------------- fine-tuning


def set_by_targets(*target_fields: str) -> dict[str, Any]:
    """Field metadata: the `finetuner.targets[]` fields that override this backend field."""
    return {"target_fields": list(target_fields)}


def target_field_map(backend_model: type[BaseModel]) -> dict[str, str]:
    """target field -> backend field, as the backend's config model declares it (`set_by_targets`)."""
    mapping: dict[str, str] = {}
    for name, info in backend_model.model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        declared = extra.get("target_fields")
        for target_field in declared if isinstance(declared, list) else []:
            mapping[str(target_field)] = name
    return mapping


class OpenSourceConfig(Model):
    model_id: str = Field("meta-llama/Llama-3.2-1B", json_schema_extra=set_by_targets("model_id"))
    output_dir: str = "./finetuned-models"
    lora_r: int = Field(16, ge=1, json_schema_extra=set_by_targets("lora_r"))
    lora_alpha: int = Field(32, ge=1, json_schema_extra=set_by_targets("lora_alpha"))
    lora_dropout: float = Field(0.05, ge=0, lt=1)
    num_epochs: float = Field(3, gt=0, json_schema_extra=set_by_targets("num_epochs", "epochs"))
    batch_size: int = Field(4, ge=1, json_schema_extra=set_by_targets("batch_size"))
    use_4bit: bool = Field(False, json_schema_extra=set_by_targets("use_4bit"))
    learning_rate: float = Field(2e-4, gt=0, json_schema_extra=set_by_targets("learning_rate"))
    max_length: int = Field(2048, ge=8, json_schema_extra=set_by_targets("max_length"))
    target_modules: list[str] | Literal["all-linear"] = "all-linear"
    gradient_accumulation_steps: int = Field(1, ge=1)
    save_steps: int = Field(200, ge=1)
    eval_steps: int = Field(200, ge=1)
    max_steps: int = Field(-1, description="Stop after this many optimizer steps; -1 runs all epochs")


class BedrockConfig(Model):
    base_model_id: str = Field("amazon.titan-text-lite-v1", json_schema_extra=set_by_targets("model_id"))
    region: str | None = None
    role_arn: str | None = None
    output_s3_uri: str | None = None
    training_data_s3_uri: str | None = None
    customization_type: Literal["CONTINUED_PRE_TRAINING", "FINE_TUNING"] = Field(
        "CONTINUED_PRE_TRAINING", json_schema_extra=set_by_targets("customization_type")
    )
    epochs: int = Field(1, ge=1, json_schema_extra=set_by_targets("epochs", "num_epochs"))
    batch_size: int = Field(1, ge=1, json_schema_extra=set_by_targets("batch_size"))
    learning_rate: float = Field(1e-5, gt=0, json_schema_extra=set_by_targets("learning_rate"))


class FineTuneTarget(Model):
    name: str
    model_id: str | None = None
    machine: str | None = Field(None, description="Name of a machines entry (informational)")
    backend: Literal["opensource", "bedrock"] | None = None
    num_epochs: float | None = Field(None, gt=0)
    batch_size: int | None = Field(None, ge=1)
    lora_r: int | None = Field(None, ge=1)
    lora_alpha: int | None = Field(None, ge=1)
    learning_rate: float | None = Field(None, gt=0)
    max_length: int | None = Field(None, ge=8)
    use_4bit: bool | None = None
    customization_type: Literal["CONTINUED_PRE_TRAINING", "FINE_TUNING"] | None = None
    epochs: int | None = Field(None, ge=1)


class FinetunerConfig(Model):
    backend: Literal["opensource", "bedrock"] = "opensource"
    jobs_dir: str = "./finetune-jobs"
    opensource: OpenSourceConfig = Field(default_factory=OpenSourceConfig)
    bedrock: BedrockConfig = Field(default_factory=BedrockConfig)
    targets: list[FineTuneTarget] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_target_names(self) -> FinetunerConfig:
        _reject_duplicates([t.name for t in self.targets], "target")
        return self


# --------------------------------------------------------------------------- corpus and github


class CorpusConfig(Model):
    dir: str = Field("./corpus", description="Where corpus.txt, corpus.jsonl and stats.json are written")
    staging_dir: str = Field("./.mat/staging", description="Where sources are cloned and fetched")
    max_file_bytes: int = Field(1_048_576, ge=1, description="Files larger than this are skipped")
    dedupe: bool = True
    redact_secrets: bool = True
    val_fraction: float = Field(0.1, ge=0, lt=1, description="Share of files put in the validation split")
    include: list[str] = Field(default_factory=list, description="Globs applied to every source")
    exclude: list[str] = Field(default_factory=list, description="Globs applied to every source")
    skip_vendored: bool = True
    skip_generated: bool = True


class GithubConfig(Model):
    web_url: str = "https://github.com"
    api_url: str = "https://api.github.com"

    @field_validator("web_url", "api_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not re.match(r"https?://[^/]+", value):
            raise ValueError("must be an http(s) URL, for example https://github.example.com")
        return value.rstrip("/")


# --------------------------------------------------------------------------- the whole file


class Config(BaseSettings):
    """The whole of multiagenttrainer.yaml; every section is optional."""

    model_config = SettingsConfigDict(
        extra="forbid", env_prefix="MAT_", env_nested_delimiter="__", validate_default=True
    )

    autoresearch: AutoresearchConfig = Field(default_factory=AutoresearchConfig)
    sources: list[SourceConfig] = Field(default_factory=list)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    machines: list[MachineConfig] = Field(default_factory=list)
    notifications: NotificationsConfig = Field(default_factory=NotificationsConfig)
    finetuner: FinetunerConfig = Field(default_factory=FinetunerConfig)
    corpus: CorpusConfig = Field(default_factory=CorpusConfig)
    github: GithubConfig = Field(default_factory=GithubConfig)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (env_settings, init_settings)  # MAT_ variables win over the file

    @model_validator(mode="after")
    def _unique_machine_names(self) -> Config:
        _reject_duplicates([m.name for m in self.machines], "machine")
        return self


def _reject_duplicates(names: list[str], what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"two {what}s are named {name!r}; {what} names must be unique")
        seen.add(name)


# --------------------------------------------------------------------------- loading


def load_config(path: str | Path | None = None, *, required: bool = False) -> Config:
    """Load and validate a config file; without one, the defaults (no sources).

    With ``path`` None, ``multiagenttrainer.yaml`` in the working directory is used when present.
    Raises ConfigError listing every problem as ``path: message (file:line)``.
    """
    explicit = path is not None
    file = Path(path) if path is not None else Path(DEFAULT_CONFIG_FILE)
    if not file.is_file():
        if explicit or required:
            raise ConfigError(
                f"{file}: config file not found; copy configs/config.example.yaml to "
                f"{DEFAULT_CONFIG_FILE} or pass --config PATH"
            )
        return _validate({}, {}, "<defaults>")
    text = file.read_text(encoding="utf-8")
    data, lines = parse_yaml_with_lines(text, str(file))
    return _validate(data, lines, str(file))


def parse_config_text(text: str, filename: str = "<stdin>") -> Config:
    """Validate YAML text as a config (`mat config validate -` reads it from standard input)."""
    data, lines = parse_yaml_with_lines(text, filename)
    return _validate(data, lines, filename)


def _validate(data: dict[str, Any], lines: dict[tuple[Any, ...], int], filename: str) -> Config:
    try:
        return Config(**data)
    except ValidationError as exc:
        raise ConfigError(format_validation_errors(exc, data, lines, filename)) from None


def parse_yaml_with_lines(text: str, filename: str) -> tuple[dict[str, Any], dict[tuple[Any, ...], int]]:
    """Parse YAML and record the 1-based line of every mapping key and sequence item."""
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else {}
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{filename}:{mark.line + 1}" if mark else filename
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"<yaml>: {problem}; fix the YAML syntax ({where})") from None
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise ConfigError(f"<root>: expected a mapping of sections such as `sources:` ({filename}:1)")
    lines: dict[tuple[Any, ...], int] = {}
    if node is not None:
        _record_lines(node, (), lines)
    return data, lines


def _record_lines(node: yaml.Node, path: tuple[Any, ...], lines: dict[tuple[Any, ...], int]) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key_path = (*path, key_node.value)
            lines[key_path] = key_node.start_mark.line + 1
            _record_lines(value_node, key_path, lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _record_lines(item, (*path, index), lines)


def format_validation_errors(
    exc: ValidationError, data: dict[str, Any], lines: dict[tuple[Any, ...], int], filename: str
) -> list[str]:
    """Turn pydantic errors into ``dotted.path: message (file:line)`` lines, one per problem."""
    problems = []
    for error in exc.errors():
        loc = _data_path(error["loc"], data)
        line = _closest_line(loc, lines)
        where = f"{filename}:{line}" if line else (f"{filename}" if lines else "environment or defaults")
        problems.append(f"{_dotted(loc)}: {_message(error, loc, data)} ({where})")
    return sorted(set(problems), key=problems.index)


def _data_path(loc: tuple[Any, ...], data: Any) -> tuple[Any, ...]:
    """Drop the union tags pydantic inserts in a location (sources.2.local_repo.path)."""
    path: list[Any] = []
    current = data
    for part in loc:
        is_union_tag = isinstance(current, dict) and isinstance(part, str) and part not in current
        if is_union_tag and (current.get("type") == part or part in {"function-after", "function-before"}):
            continue
        path.append(part)
        if isinstance(current, dict):
            current = current.get(part)
        elif isinstance(current, list) and isinstance(part, int) and part < len(current):
            current = current[part]
        else:
            current = None
    return tuple(path)


def _closest_line(loc: tuple[Any, ...], lines: dict[tuple[Any, ...], int]) -> int | None:
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None


def _dotted(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "<root>"


def _message(error: Any, loc: tuple[Any, ...], data: Any) -> str:
    kind = error["type"]
    if kind == "missing":
        return "field required"
    if kind == "extra_forbidden":
        return "unknown field; check the spelling against configs/config.example.yaml"
    if kind == "union_tag_invalid":
        return f"unknown type {error['input'].get('type')!r}; valid types: {', '.join(_tags(error))}"
    if kind == "union_tag_not_found":
        return f"`type:` is required; valid types: {', '.join(_tags(error))}"
    message = str(error["msg"])
    message = message.removeprefix("Value error, ")
    return message[0].lower() + message[1:] if message else kind


def _tags(error: Any) -> list[str]:
    expected = str(error.get("ctx", {}).get("expected_tags", ""))
    return [t.strip().strip("'") for t in expected.split(",") if t.strip()]


def expand_path(value: str) -> Path:
    """A config path with ~ and $VARS expanded; relative paths stay relative to the working directory."""
    return Path(os.path.expandvars(os.path.expanduser(value)))
