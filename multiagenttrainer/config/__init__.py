"""Configuration: pydantic models for every section of multiagenttrainer.yaml, and its loader.

Every model forbids unknown keys, so a typo is an error rather than a silent default, and every
size, count and time has an upper bound (no infinities, no NaN). The loader reports every problem
at once as ``dotted.path: message (file:line)``. Environment variables prefixed with ``MAT_``
override file values (``MAT_TRAINING__MAX_EXPERIMENTS=3``). Secrets are never read from the file:
GitHub tokens come from the environment, AWS credentials from boto3's chain, SSH keys by path.

The file is untrusted: yaml_input.py reads it (size, encoding, aliases, depth, keys) and
problems.py words the problems, naming the MAT_* variable when one set the bad value.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, BinaryIO, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError
from pydantic_core.core_schema import ErrorType
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from multiagenttrainer.config.backends import (
    BACKEND_SECTIONS,
    load_plugins,
    register_backend_section,
    registered_backends,
    unknown_backend_message,
)
from multiagenttrainer.config.problems import (
    ENV_DELIMITER,
    ENV_PREFIX,
    environment_overrides,
    format_validation_errors,
)
from multiagenttrainer.config.yaml_input import parse_yaml_with_lines, read_config_stream, read_config_text
from multiagenttrainer.errors import ConfigError

DEFAULT_CONFIG_FILE = "multiagenttrainer.yaml"

# Upper bounds for every size, count and time: far above any real use, low enough that a typo
# (or 1e29) is an error here instead of an overflow or a week-long run later.
GIB = 1 << 30
WEEK_S = 7 * 24 * 3600
MAX_REPOS = 10_000
MAX_STEPS = 10_000_000
MAX_EPOCHS = 1000
MAX_BATCH = 4096
MAX_TOKENS = 1 << 20  # sequence length
MAX_LORA_R = 4096
MAX_PORT = 65_535
HOUR_S = 3600
MAX_CONNECT_ATTEMPTS = 100


class Model(BaseModel):
    """Base for every config section: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)


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
    max_repos: int = Field(100, ge=1, le=MAX_REPOS)
    visibility: Literal["all", "public", "private"] = "all"
    include: list[str] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)
    token_env: str = "GITHUB_TOKEN"


class GithubRepoListSource(SourceBase):
    type: Literal["github_repo_list"]
    repos: list[str] = Field(min_length=1, max_length=MAX_REPOS)
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


class RemoteExecution(Model):
    """What the ssh and docker targets share: the Python there and the training command's environment."""

    python: str = Field(
        "python3",
        description="Python on the target: runs mat's session helper, and the built-in train.py instead of "
        "the interpreter mat runs under",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables set for training")
    forward_env: list[str] = Field(
        default_factory=lambda: ["MAT_FIXED_STEPS"],
        description="Names of local environment variables passed on to training when they are set",
    )

    @field_validator("python")
    @classmethod
    def _one_word(cls, value: str) -> str:
        if not value.strip() or any(c.isspace() for c in value):
            raise ValueError("must be one command or path, for example python3 or /opt/venv/bin/python")
        return value


def split_ssh_host(value: str) -> tuple[str | None, str, int | None]:
    """`[user@]host[:port]` (IPv6 as `[::1]:22`) as (user or None, host, port or None)."""
    user, _, rest = value.rpartition("@")
    port: str | None = None
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        port = tail[1:] if tail.startswith(":") else None
        if tail and port is None:
            raise ValueError(f"{value!r} is not [user@]host[:port]; write an IPv6 address as [::1]:22")
    elif rest.count(":") == 1:
        host, port = rest.split(":")
    else:
        host = rest
    if not host or any(c.isspace() or c in "/'\"" for c in host) or "@" in user:
        raise ValueError(f"{value!r} is not [user@]host[:port], for example trainer@gpu-box.example.com:2222")
    if port is not None and not (port.isdigit() and 1 <= int(port) <= MAX_PORT):
        raise ValueError(f"the port must be a number from 1 to {MAX_PORT}: [user@]host[:port]")
    return user or None, host, int(port) if port else None


class SshExecution(RemoteExecution):
    type: Literal["ssh"]
    ssh_host: str = Field(description="[user@]host[:port]")
    ssh_port: int | None = Field(
        None, ge=1, le=MAX_PORT, description="Port, when ssh_host has none; 22 if unset"
    )
    ssh_key: str | None = Field(
        None, description="Private key path; the SSH agent and default keys otherwise"
    )
    remote_dir: str = Field("/tmp/mat-runs", description="Base directory on the host (absolute or ~/...)")
    known_hosts: str | None = Field(
        None, description="known_hosts file read besides ~/.ssh/known_hosts; accept_new writes here"
    )
    host_key_policy: Literal["strict", "accept_new"] = Field(
        "strict", description="strict: unknown hosts are refused; accept_new: their key is recorded"
    )
    connect_timeout: float = Field(10, gt=0, le=HOUR_S, description="Seconds to wait for the connection")
    connect_attempts: int = Field(
        3, ge=1, le=MAX_CONNECT_ATTEMPTS, description="Tries to connect, with backoff, before giving up"
    )
    alive_timeout: float = Field(
        30,
        gt=0,
        le=HOUR_S,
        description="Seconds without a sign of life from the host before the connection is lost",
    )

    @field_validator("ssh_host")
    @classmethod
    def _host_shape(cls, value: str) -> str:
        split_ssh_host(value)
        return value

    @model_validator(mode="after")
    def _one_port(self) -> SshExecution:
        _, _, port = split_ssh_host(self.ssh_host)
        if port is not None and self.ssh_port is not None and port != self.ssh_port:
            raise ValueError(f"ssh_host says port {port} and ssh_port says {self.ssh_port}; keep one")
        return self

    def address(self) -> tuple[str | None, str, int]:
        """(user or None, host, port) of the target."""
        user, host, port = split_ssh_host(self.ssh_host)
        return user, host, port or self.ssh_port or 22


class DockerExecution(RemoteExecution):
    type: Literal["docker"]
    container: str = Field(description="Name or id of a running container")
    container_dir: str = Field("/tmp/mat-runs", description="Base directory inside the container (absolute)")
    docker_host: str | None = Field(
        None, description="Docker daemon URL; DOCKER_HOST or the default otherwise"
    )

    @field_validator("container_dir")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must be an absolute path inside the container, for example /tmp/mat-runs")
        return value


ExecutionConfig = Annotated[LocalExecution | SshExecution | DockerExecution, Field(discriminator="type")]


class MachineConfig(Model):
    name: str
    execution: ExecutionConfig = Field(default_factory=LocalExecution)
    agent_command: str | None = None
    gpus: int = Field(0, ge=0, le=1024, description="GPUs; its work pool runs that many flows at once")


# --------------------------------------------------------------------------- autoresearch and training


class AutoresearchConfig(Model):
    repo: str | None = Field(
        None, description="URL or path of an autoresearch checkout; built-in template if unset"
    )
    branch: str = "master"
    train_time: int = Field(300, ge=1, le=WEEK_S, description="Training time budget per experiment, seconds")
    program_md: str | None = Field(None, description="Path to a program.md that replaces the default")
    fixed_steps: int | None = Field(
        None,
        ge=1,
        le=MAX_STEPS,
        description="Built-in template only: train exactly this many steps instead of train_time seconds, so "
        "results do not depend on the machine's speed or load (train_time then only bounds a run's length)",
    )
    verify: bool = Field(
        False,
        description="Real autoresearch only: re-score train.py's checkpoint apart from training (train.py "
        "must define build_model() and save checkpoint.pt; see the README's protections)",
    )

    @model_validator(mode="after")
    def _fixed_steps_need_the_template(self) -> AutoresearchConfig:
        if self.fixed_steps is not None and self.repo:
            raise ValueError(
                "fixed_steps works with the built-in template only (real autoresearch trains for its "
                "TIME_BUDGET); remove fixed_steps or autoresearch.repo"
            )
        return self


class TrainingConfig(Model):
    agent_command: str | None = Field(
        None, description="Command with {prompt} / {prompt_file}; built-in agent if unset"
    )
    max_experiments: int = Field(10, ge=1, le=100_000)
    output_dir: str = "./runs"
    mode: Literal["harness", "agent"] = "harness"
    agent_timeout: int = Field(900, ge=1, le=WEEK_S, description="Seconds an agent may take for one change")
    execution: ExecutionConfig = Field(default_factory=LocalExecution)
    max_machine_failures: int = Field(
        3, ge=1, le=1000, description="Consecutive infrastructure failures before a machine leaves a run"
    )


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
    lora_r: int = Field(16, ge=1, le=MAX_LORA_R, json_schema_extra=set_by_targets("lora_r"))
    lora_alpha: int = Field(32, ge=1, le=16 * MAX_LORA_R, json_schema_extra=set_by_targets("lora_alpha"))
    lora_dropout: float = Field(0.05, ge=0, lt=1)
    num_epochs: float = Field(
        3, gt=0, le=MAX_EPOCHS, json_schema_extra=set_by_targets("num_epochs", "epochs")
    )
    batch_size: int = Field(4, ge=1, le=MAX_BATCH, json_schema_extra=set_by_targets("batch_size"))
    use_4bit: bool = Field(False, json_schema_extra=set_by_targets("use_4bit"))
    learning_rate: float = Field(2e-4, gt=0, le=1, json_schema_extra=set_by_targets("learning_rate"))
    max_length: int = Field(2048, ge=8, le=MAX_TOKENS, json_schema_extra=set_by_targets("max_length"))
    target_modules: list[str] | Literal["all-linear"] = "all-linear"
    gradient_accumulation_steps: int = Field(1, ge=1, le=MAX_BATCH)
    save_steps: int = Field(200, ge=1, le=MAX_STEPS)
    eval_steps: int = Field(200, ge=1, le=MAX_STEPS)
    max_steps: int = Field(
        -1, ge=-1, le=MAX_STEPS, description="Stop after this many optimizer steps; -1 runs all epochs"
    )

    @field_validator("max_steps")
    @classmethod
    def _steps_or_all_epochs(cls, value: int) -> int:
        if value == 0:
            raise ValueError("must be -1 (train for num_epochs) or at least 1")
        return value


class BedrockConfig(Model):
    base_model_id: str = Field("amazon.titan-text-lite-v1", json_schema_extra=set_by_targets("model_id"))
    region: str | None = None
    role_arn: str | None = None
    output_s3_uri: str | None = None
    training_data_s3_uri: str | None = None
    customization_type: Literal["CONTINUED_PRE_TRAINING", "FINE_TUNING"] = Field(
        "CONTINUED_PRE_TRAINING", json_schema_extra=set_by_targets("customization_type")
    )
    epochs: int = Field(1, ge=1, le=MAX_EPOCHS, json_schema_extra=set_by_targets("epochs", "num_epochs"))
    batch_size: int = Field(1, ge=1, le=MAX_BATCH, json_schema_extra=set_by_targets("batch_size"))
    learning_rate: float = Field(1e-5, gt=0, le=1, json_schema_extra=set_by_targets("learning_rate"))


register_backend_section("opensource", OpenSourceConfig)
register_backend_section("bedrock", BedrockConfig)
BUILTIN_SECTIONS = frozenset(BACKEND_SECTIONS)
STANDARD_ERROR_TYPES = frozenset(get_args(ErrorType))


def registered_backend(value: str | None) -> str | None:
    """A backend name that is registered (built in, or by a plugin); ValueError listing them otherwise."""
    if value is not None and value not in BACKEND_SECTIONS:
        raise ValueError(unknown_backend_message(value))
    return value


class FineTuneTarget(Model):
    name: str
    model_id: str | None = None
    machine: str | None = Field(
        None, description="Name of a machines entry; an ssh or docker machine trains the target there"
    )
    backend: str | None = Field(None, description="A registered backend; finetuner.backend if unset")
    num_epochs: float | None = Field(None, gt=0, le=MAX_EPOCHS)
    batch_size: int | None = Field(None, ge=1, le=MAX_BATCH)
    lora_r: int | None = Field(None, ge=1, le=MAX_LORA_R)
    lora_alpha: int | None = Field(None, ge=1, le=16 * MAX_LORA_R)
    learning_rate: float | None = Field(None, gt=0, le=1)
    max_length: int | None = Field(None, ge=8, le=MAX_TOKENS)
    use_4bit: bool | None = None
    customization_type: Literal["CONTINUED_PRE_TRAINING", "FINE_TUNING"] | None = None
    epochs: int | None = Field(None, ge=1, le=MAX_EPOCHS)

    _registered_backend = field_validator("backend")(registered_backend)


class FinetunerConfig(Model):
    """`finetuner:`: the backend, the jobs directory, a section per backend, and the targets.

    The sections of the built-in backends are fields; a plugin backend's `finetuner.<name>:` section is
    validated with the model it registered (config/backends.py) and read with `section(name)`.
    """

    model_config = ConfigDict(extra="allow", validate_default=True, allow_inf_nan=False)

    backend: str = Field("opensource", description="A registered backend: opensource, bedrock or a plugin's")
    jobs_dir: str = "./finetune-jobs"
    opensource: OpenSourceConfig = Field(default_factory=OpenSourceConfig)
    bedrock: BedrockConfig = Field(default_factory=BedrockConfig)
    targets: list[FineTuneTarget] = Field(default_factory=list)

    _registered_backend = field_validator("backend")(registered_backend)

    @model_validator(mode="wrap")
    @classmethod
    def _plugin_sections(
        cls, data: Any, handler: ModelWrapValidatorHandler[FinetunerConfig]
    ) -> FinetunerConfig:
        """Validate the fields, then each plugin backend's section with its model; every problem at once."""
        if not isinstance(data, dict):
            return handler(data)
        extra = {key: value for key, value in data.items() if key not in cls.model_fields}
        problems: list[InitErrorDetails] = []
        try:
            validated: FinetunerConfig | None = handler({k: v for k, v in data.items() if k not in extra})
        except ValidationError as exc:
            validated, problems = None, [_details(e) for e in exc.errors()]
        sections, section_problems = plugin_sections(extra, backends_in_use(data))
        if problems or section_problems:
            raise ValidationError.from_exception_data(cls.__name__, [*problems, *section_problems])
        assert validated is not None
        validated.__pydantic_extra__ = sections
        return validated

    @model_validator(mode="after")
    def _unique_target_names(self) -> FinetunerConfig:
        _reject_duplicates([t.name for t in self.targets], "target")
        return self

    def section(self, backend: str) -> BaseModel:
        """The `finetuner.<backend>:` settings (the model's defaults when the file has no such section)."""
        if backend not in BACKEND_SECTIONS:
            raise ConfigError(f"finetuner.backend: {unknown_backend_message(backend)}")
        value = getattr(self, backend, None) if backend in type(self).model_fields else None
        value = value if value is not None else (self.model_extra or {}).get(backend)
        if isinstance(value, BaseModel):
            return value
        try:
            return BACKEND_SECTIONS[backend].model_validate({})
        except ValidationError as exc:
            raise ConfigError([f"finetuner.{backend}: {e['msg']}" for e in exc.errors()]) from None


def backends_in_use(data: dict[str, Any]) -> set[str]:
    """The backends a finetuner section names: its `backend` and every target's."""
    targets = data.get("targets")
    named = [t.get("backend") for t in targets if isinstance(t, dict)] if isinstance(targets, list) else []
    return {name for name in [data.get("backend"), *named] if isinstance(name, str)}


def plugin_sections(
    extra: dict[str, Any], in_use: set[str]
) -> tuple[dict[str, BaseModel], list[InitErrorDetails]]:
    """Each plugin backend's section validated with its model (defaults for a backend in use without one)."""
    sections: dict[str, BaseModel] = {}
    problems: list[InitErrorDetails] = []
    plugins_in_use = {name for name in in_use if name in BACKEND_SECTIONS and name not in BUILTIN_SECTIONS}
    wanted: dict[str, Any] = {**dict.fromkeys(plugins_in_use, {}), **extra}
    for name, value in wanted.items():
        if name not in BACKEND_SECTIONS:
            problems.append(_unknown_section(name, value))
            continue
        try:
            sections[name] = BACKEND_SECTIONS[name].model_validate(value)
        except ValidationError as exc:
            problems += [_details(e, prefix=(name,)) for e in exc.errors()]
    return {name: sections[name] for name in extra if name in sections}, problems


def _unknown_section(name: str, value: Any) -> InitErrorDetails:
    message = (
        f"neither a finetuner field nor a registered backend's section; fields: backend, jobs_dir, "
        f"targets; backends: {', '.join(registered_backends())}"
    )
    return {"type": PydanticCustomError("unknown_section", message), "loc": (name,), "input": value}


def _details(error: Any, prefix: tuple[str | int, ...] = ()) -> InitErrorDetails:
    """A pydantic error as the details ValidationError.from_exception_data rebuilds it from."""
    loc = (*prefix, *error["loc"])
    if error["type"] not in STANDARD_ERROR_TYPES:  # a plugin model's own error: keep its message
        custom = PydanticCustomError(error["type"], "{message}", {"message": error["msg"]})
        return {"type": custom, "loc": loc, "input": error["input"]}
    details: InitErrorDetails = {"type": error["type"], "loc": loc, "input": error["input"]}
    if "ctx" in error:
        details["ctx"] = error["ctx"]
    return details


# --------------------------------------------------------------------------- corpus and github


class CorpusConfig(Model):
    dir: str = Field("./corpus", description="Where corpus.txt, corpus.jsonl and stats.json are written")
    staging_dir: str = Field("./.mat/staging", description="Where sources are cloned and fetched")
    max_file_bytes: int = Field(
        1_048_576, ge=1, le=GIB, description="Files larger than this are skipped (at most 1 GiB)"
    )
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


# --------------------------------------------------------------------------- serving


class ServeConfig(Model):
    """`mat serve`: where it listens, who may call it, and how much one request may ask for."""

    host: str = Field("127.0.0.1", min_length=1, description="Address to listen on (--host overrides it)")
    port: int = Field(8000, ge=0, le=65535, description="Port to listen on; 0 picks a free one")
    api_key_env: str | None = Field(
        None, description="Environment variable holding the bearer key every client must send; unset: no key"
    )
    max_tokens: int = Field(1024, ge=1, le=131_072, description="Most tokens one request may generate")
    max_body_bytes: int = Field(1_048_576, ge=1024, le=67_108_864, description="Largest request body")
    max_concurrent_requests: int = Field(
        32, ge=1, le=1024, description="Generation requests in flight at once; more are answered 429"
    )
    engine: Literal["auto", "transformers", "vllm"] = Field(
        "auto", description="auto: vLLM on a CUDA machine where it is installed, else transformers"
    )

    @field_validator("api_key_env")
    @classmethod
    def _variable_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
            raise ValueError("must name an environment variable, such as MAT_SERVE_KEY (not hold the key)")
        return value


# --------------------------------------------------------------------------- models and requests

MAX_PARAMS = 10**13  # parameters of one model: far above any that exists
MAX_MEMORY_GB = 100_000.0


class ModelCandidate(Model):
    """One entry of the `models:` catalog: a base model `mat request` may choose and fine-tune."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=100)
    model_id: str = Field(min_length=1, description="A local model folder or a Hugging Face hub id")
    params: int = Field(ge=1, le=MAX_PARAMS, description="Parameter count, for the memory estimate")
    use_4bit: bool = Field(False, description="Fine-tune with QLoRA (needs CUDA); ~0.5 GB per billion")


LearningRate = Annotated[float, Field(gt=0, le=1)]
LoraRank = Annotated[int, Field(ge=1, le=MAX_LORA_R)]


class TrialsConfig(Model):
    """The Model agent's short trials: a grid over learning rate and LoRA rank on the chosen candidates."""

    learning_rates: list[LearningRate] = Field(
        default_factory=lambda: [1e-4, 3e-4], min_length=1, max_length=16
    )
    lora_ranks: list[LoraRank] = Field(default_factory=lambda: [8, 16], min_length=1, max_length=16)
    steps: int = Field(20, ge=1, le=MAX_STEPS, description="Optimizer steps of one trial")
    max_candidates: int = Field(2, ge=1, le=100, description="Candidates tried: the smallest that fit")
    parallel: int = Field(1, ge=1, le=64, description="Trials trained at once, each in its own process")


class RequestConfig(Model):
    """`mat request`: where requests go, the planner LLM and its policy, trials and the final training."""

    output_dir: str = Field(".", description="Requests are written to <output_dir>/requests/<id>/")
    planner_command: str | None = Field(
        None, description="Command with {prompt} / {prompt_file} (or preset:claude) answering in YAML"
    )
    planner_timeout: int = Field(300, ge=1, le=WEEK_S, description="Seconds the planner may take")
    policy: list[str] = Field(
        default_factory=list, max_length=1000, description="Refusal rules the planner LLM checks"
    )
    trials: TrialsConfig = Field(default_factory=TrialsConfig)
    full_steps: int = Field(
        -1, ge=-1, le=MAX_STEPS, description="Steps of the final training; -1 trains full_epochs"
    )
    full_epochs: float = Field(1, gt=0, le=MAX_EPOCHS)
    machine_memory_gb: float | None = Field(
        None, gt=0, le=MAX_MEMORY_GB, description="Memory of the training machine; detected if unset"
    )
    latency_probe_runs: int = Field(5, ge=1, le=1000, description="Generations timed by the planner")
    measure_requests: int = Field(10, ge=1, le=10_000, description="Requests the Server agent times")

    @field_validator("full_steps")
    @classmethod
    def _steps_or_epochs(cls, value: int) -> int:
        if value == 0:
            raise ValueError("must be -1 (train full_epochs) or at least 1")
        return value

    @model_validator(mode="after")
    def _policy_needs_planner(self) -> RequestConfig:
        if self.policy and not (self.planner_command or "").strip():
            raise ValueError(
                "policy rules are checked by the planner LLM; set request.planner_command "
                "(a command with {prompt}, or preset:claude) or remove request.policy"
            )
        return self


# --------------------------------------------------------------------------- the whole file


class Config(BaseSettings):
    """The whole of multiagenttrainer.yaml; every section is optional."""

    model_config = SettingsConfigDict(
        extra="forbid",
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_DELIMITER,
        validate_default=True,
        allow_inf_nan=False,
    )

    autoresearch: AutoresearchConfig = Field(default_factory=AutoresearchConfig)
    sources: list[SourceConfig] = Field(default_factory=list)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    machines: list[MachineConfig] = Field(default_factory=list)
    notifications: NotificationsConfig = Field(default_factory=NotificationsConfig)
    finetuner: FinetunerConfig = Field(default_factory=FinetunerConfig)
    corpus: CorpusConfig = Field(default_factory=CorpusConfig)
    github: GithubConfig = Field(default_factory=GithubConfig)
    serve: ServeConfig = Field(default_factory=ServeConfig)
    models: list[ModelCandidate] = Field(default_factory=list, max_length=1000)
    request: RequestConfig = Field(default_factory=RequestConfig)

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
        _reject_duplicates([m.name for m in self.machines], "machine", "machines")
        if self.training.mode == "agent" and len(self.machines) > 1:
            raise ValueError(
                "training.mode: agent runs on one machine (the agent writes results.tsv itself); "
                "use mode: harness with several machines, or keep one entry in machines"
            )
        _reject_duplicates([m.name for m in self.models], "model", "models")
        return self


def _reject_duplicates(names: list[str], what: str, section: str | None = None) -> None:
    """ValueError at the second use of a name; `section` (a top-level list) puts its path in the message."""
    seen: set[str] = set()
    for index, name in enumerate(names):
        if name in seen:
            where = f"{section}.{index}.name: " if section else ""
            raise ValueError(f"{where}two {what}s are named {name!r}; {what} names must be unique")
        seen.add(name)


# --------------------------------------------------------------------------- loading


def load_config(path: str | Path | None = None, *, required: bool = False) -> Config:
    """Load and validate a config file; without one, the defaults (no sources).

    With ``path`` None, ``multiagenttrainer.yaml`` in the working directory is used when present.
    Raises ConfigError listing every problem as ``path: message (file:line)``; a problem caused
    by a ``MAT_*`` variable names the variable instead of a line.
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
    data, lines = parse_yaml_with_lines(read_config_text(file), str(file))
    return _validate(data, lines, str(file))


def parse_config_text(text: str, filename: str = "<stdin>") -> Config:
    """Validate YAML text as a config."""
    data, lines = parse_yaml_with_lines(text, filename)
    return _validate(data, lines, filename)


def load_config_stream(stream: BinaryIO, filename: str = "<stdin>") -> Config:
    """Validate a config read from a byte stream (`mat config validate -` reads standard input)."""
    return parse_config_text(read_config_stream(stream, filename), filename)


def _validate(data: dict[str, Any], lines: dict[tuple[Any, ...], int], filename: str) -> Config:
    load_plugins()  # a plugin's backend and its `finetuner.<name>:` section are known before validation
    overrides = environment_overrides(Config)  # a malformed MAT_* variable stops here, named
    try:
        return Config(**data)
    except ValidationError as exc:
        raise ConfigError(format_validation_errors(exc, data, lines, filename, overrides)) from None


def expand_path(value: str) -> Path:
    """A config path with ~ and $VARS expanded; relative paths stay relative to the working directory."""
    return Path(os.path.expandvars(os.path.expanduser(value)))
