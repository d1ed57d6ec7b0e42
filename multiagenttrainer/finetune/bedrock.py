"""The Bedrock backend: corpus -> JSONL in S3 -> a model customization job that runs in AWS.

Record size: Titan Text Lite/Express accept about 4,096 tokens per record at batch size 1 and
about 2,048 at larger batch sizes; AWS sizes records at about 6 characters per token. We keep
a margin and cap records at 24,000 characters (batch size 1) or 12,000 characters (larger
batches), splitting long files on line boundaries (a single overlong line is cut).

FINE_TUNING records: each chunk becomes `{"prompt": header + first quarter of the chunk's lines,
"completion": the rest}`, where the header names the file (`# File: repo/path`). A one-line
chunk is split at half its length. The model thus learns to continue a file from its start.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
)

from multiagenttrainer.config import BedrockConfig
from multiagenttrainer.corpus.records import iter_training_records
from multiagenttrainer.errors import BackendError, ConfigError, CorpusError
from multiagenttrainer.finetune.base import (
    DEFAULT_TARGET,
    FineTuner,
    JobRecord,
    JobStatus,
    JobStore,
    PreparedDataset,
    safe_name,
)

CHARS_PER_TOKEN = 6
SINGLE_BATCH_CHAR_LIMIT = 24_000  # ~4,096 tokens x 6 chars, with a margin
MULTI_BATCH_CHAR_LIMIT = 12_000  # ~2,048 tokens x 6 chars, with a margin
PROMPT_SHARE = 0.25
MAX_JOB_NAME = 63

BEDROCK_STATUS: dict[str, JobStatus] = {
    "InProgress": "running",
    "Completed": "completed",
    "Failed": "failed",
    "Stopping": "cancelled",
    "Stopped": "cancelled",
}

# AWS error code -> what the user should do about it.
ERROR_HINTS: dict[str, str] = {
    "AccessDenied": "grant the caller (and finetuner.bedrock.role_arn) access to the S3 bucket and Bedrock",
    "AccessDeniedException": "grant the caller bedrock:*ModelCustomizationJob and iam:PassRole on the role",
    "ValidationException": "check finetuner.bedrock settings (base_model_id, customization_type, "
    "hyperparameters) against the model's limits",
    "ResourceNotFoundException": "check the job id with `mat finetune list` and finetuner.bedrock.region",
    "NoSuchBucket": "create the bucket or fix finetuner.bedrock.training_data_s3_uri",
    "ResourceInUseException": "pick another job name (--name)",
    "ServiceQuotaExceededException": "stop other customization jobs or ask AWS for a higher quota",
    "ThrottlingException": "wait a minute and retry",
    "UnrecognizedClientException": "invalid AWS credentials; refresh them (aws configure, aws sso login)",
    "InvalidAccessKeyId": "invalid AWS credentials; refresh them (aws configure, aws sso login)",
}


@dataclass(frozen=True)
class S3Location:
    """A bucket and a key prefix parsed from an s3:// URI."""

    bucket: str
    prefix: str

    def uri(self, *parts: str) -> str:
        return "s3://" + "/".join(p for p in (self.bucket, self.prefix, *parts) if p)

    def key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)


def parse_s3_uri(uri: str, field: str) -> S3Location:
    """Bucket and prefix of an s3:// URI; ConfigError naming the config field otherwise."""
    if not uri.startswith("s3://") or not uri[5:].split("/", 1)[0]:
        raise ConfigError(f"finetuner.bedrock.{field}: {uri!r} is not an S3 URI; use s3://bucket/prefix")
    bucket, _, prefix = uri[5:].partition("/")
    return S3Location(bucket, prefix.strip("/"))


@contextmanager
def aws_errors(action: str) -> Iterator[None]:
    """Translate boto errors raised while doing `action` into BackendError/ConfigError with a fix."""
    try:
        yield
    except (NoCredentialsError, PartialCredentialsError):
        raise BackendError(
            f"{action}: no AWS credentials found; set AWS_PROFILE or "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or run `aws configure`"
        ) from None
    except NoRegionError:
        raise ConfigError(
            f"{action}: no AWS region; set finetuner.bedrock.region (for example us-east-1) or AWS_REGION"
        ) from None
    except EndpointConnectionError as exc:
        raise BackendError(f"{action}: cannot reach AWS ({exc}); check the network and the region") from None
    except ClientError as exc:
        raise client_error(action, exc) from None
    except BotoCoreError as exc:
        raise BackendError(f"{action}: {exc}") from None


def client_error(action: str, exc: ClientError) -> BackendError:
    """A BackendError for an AWS error response, with the hint for its code."""
    error = exc.response.get("Error", {})
    code = str(error.get("Code", "Unknown"))
    message = str(error.get("Message", "")) or code
    hint = ERROR_HINTS.get(code, "see the AWS message above")
    return BackendError(f"{action}: AWS said {code}: {message}; {hint}")


def char_limit(batch_size: int) -> int:
    """The most characters one record may hold at this batch size."""
    return SINGLE_BATCH_CHAR_LIMIT if batch_size <= 1 else MULTI_BATCH_CHAR_LIMIT


def chunk_text(text: str, limit: int) -> list[str]:
    """Text split on line boundaries into chunks of at most `limit` characters (blank chunks dropped)."""
    chunks: list[str] = []
    current = ""
    for line in text.splitlines(keepends=True):
        for piece in (line[i : i + limit] for i in range(0, len(line), limit)):
            if len(current) + len(piece) > limit:
                chunks.append(current)
                current = ""
            current += piece
    chunks.append(current)
    return [chunk for chunk in chunks if chunk.strip()]


def prompt_completion(header: str, chunk: str) -> dict[str, str] | None:
    """A FINE_TUNING record: the header and the chunk's first lines as prompt, the rest as completion."""
    lines = chunk.splitlines(keepends=True)
    if len(lines) > 1:
        cut = max(1, int(len(lines) * PROMPT_SHARE))
        head, rest = "".join(lines[:cut]), "".join(lines[cut:])
    else:
        middle = len(chunk) // 2
        head, rest = chunk[:middle], chunk[middle:]
    if not rest.strip():
        return None
    return {"prompt": header + head, "completion": rest}


def file_header(record: dict[str, Any]) -> str:
    """`# File: repo/path` for a corpus record."""
    name = "/".join(str(part) for part in (record.get("repo"), record.get("path")) if part)
    return f"# File: {name}\n" if name else ""


def cpt_records(record: dict[str, Any], limit: int) -> list[dict[str, str]]:
    """CONTINUED_PRE_TRAINING records for one corpus record."""
    return [{"input": chunk} for chunk in chunk_text(str(record.get("text", "")), limit)]


def ft_records(record: dict[str, Any], limit: int) -> list[dict[str, str]]:
    """FINE_TUNING records for one corpus record (prompt + completion stay within the limit)."""
    header = file_header(record)
    pairs = (
        prompt_completion(header, chunk)
        for chunk in chunk_text(str(record.get("text", "")), max(limit - len(header), limit // 2))
    )
    return [pair for pair in pairs if pair is not None]


RECORD_BUILDERS: dict[str, Callable[[dict[str, Any], int], list[dict[str, str]]]] = {
    "CONTINUED_PRE_TRAINING": cpt_records,
    "FINE_TUNING": ft_records,
}


def to_jsonl(records: list[dict[str, str]]) -> bytes:
    """Records as JSON Lines bytes."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")


def bedrock_job_name(job_name: str) -> str:
    """A unique Bedrock job name (letters, digits, dashes; at most 63 characters)."""
    stamp = datetime.now(UTC).strftime("%Y%m%d%H%M%S")
    base = "".join(c if c.isalnum() else "-" for c in job_name).strip("-") or "mat"
    suffix = f"-{stamp}-{secrets.token_hex(2)}"
    return base[: MAX_JOB_NAME - len(suffix)].rstrip("-") + suffix


def iso(value: Any) -> str | None:
    """A boto timestamp (datetime or string) as an ISO string."""
    if value is None:
        return None
    return value.isoformat() if isinstance(value, datetime) else str(value)


class BedrockFineTuner(FineTuner):
    """Model customization on AWS Bedrock: data in S3, training in AWS, status polled."""

    backend = "bedrock"

    def __init__(self, cfg: BedrockConfig, store: JobStore, target: str = DEFAULT_TARGET) -> None:
        super().__init__(store, target)
        self.cfg = cfg
        self._clients: dict[str, Any] = {}

    def client(self, service: str) -> Any:
        """A plain boto3 client for `service` in the configured region, created once."""
        if service not in self._clients:
            with aws_errors(f"creating the {service} client"):
                self._clients[service] = boto3.client(service, region_name=self.cfg.region)
        return self._clients[service]

    def required(self, field: str) -> str:
        """A setting the backend cannot work without; ConfigError naming it when unset."""
        value = getattr(self.cfg, field)
        if not value:
            raise ConfigError(f"finetuner.bedrock.{field} is not set; the Bedrock backend needs it")
        return str(value)

    def describe(self) -> str:
        cfg = self.cfg
        return (
            f"bedrock {cfg.base_model_id} {cfg.customization_type} epochs={cfg.epochs} "
            f"batch_size={cfg.batch_size} lr={cfg.learning_rate} region={cfg.region or 'default'}"
        )

    def build_records(self, corpus: Path) -> dict[str, list[dict[str, str]]]:
        """Training and validation records for the configured customization type."""
        builder = RECORD_BUILDERS[self.cfg.customization_type]
        limit = char_limit(self.cfg.batch_size)
        splits: dict[str, list[dict[str, str]]] = {"train": [], "val": []}
        for record in iter_training_records(corpus):
            split = "val" if record.get("split") == "val" else "train"
            splits[split].extend(builder(record, limit))
        return splits

    def prepare_dataset(self, corpus_path: Path) -> PreparedDataset:
        """Corpus -> JSONL records -> S3 under training_data_s3_uri/<dataset id>/."""
        location = parse_s3_uri(self.required("training_data_s3_uri"), "training_data_s3_uri")
        splits = self.build_records(corpus_path)
        if not splits["train"]:
            raise CorpusError(f"the corpus at {corpus_path} has no training text; ingest some sources first")
        dataset_id = (
            f"{safe_name(self.target)}-{datetime.now(UTC).strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(3)}"
        )
        details: dict[str, Any] = {
            "dataset_id": dataset_id,
            "customization_type": self.cfg.customization_type,
            "record_char_limit": char_limit(self.cfg.batch_size),
            "train_s3_uri": self.upload(location, dataset_id, "train.jsonl", splits["train"]),
        }
        if splits["val"]:
            details["validation_s3_uri"] = self.upload(
                location, dataset_id, "validation.jsonl", splits["val"]
            )
        return PreparedDataset(details["train_s3_uri"], len(splits["train"]), len(splits["val"]), details)

    def upload(self, location: S3Location, dataset_id: str, name: str, records: list[dict[str, str]]) -> str:
        """Put records as one JSONL object; its s3:// URI."""
        key = location.key(dataset_id, name)
        with aws_errors(f"uploading training data to {location.uri(dataset_id, name)}"):
            self.client("s3").put_object(Bucket=location.bucket, Key=key, Body=to_jsonl(records))
        return location.uri(dataset_id, name)

    def job_request(self, dataset: PreparedDataset, job_id: str) -> dict[str, Any]:
        """The create_model_customization_job arguments (hyperparameters are strings)."""
        cfg = self.cfg
        request: dict[str, Any] = {
            "jobName": job_id,
            "customModelName": f"{job_id}-model"[:MAX_JOB_NAME],
            "roleArn": self.required("role_arn"),
            "baseModelIdentifier": cfg.base_model_id,
            "customizationType": cfg.customization_type,
            "trainingDataConfig": {"s3Uri": dataset.details.get("train_s3_uri", dataset.location)},
            "outputDataConfig": {
                "s3Uri": parse_s3_uri(self.required("output_s3_uri"), "output_s3_uri").uri()
            },
            "hyperParameters": {
                "epochCount": str(cfg.epochs),
                "batchSize": str(cfg.batch_size),
                "learningRate": str(cfg.learning_rate),
            },
        }
        if dataset.details.get("validation_s3_uri"):
            request["validationDataConfig"] = {
                "validators": [{"s3Uri": dataset.details["validation_s3_uri"]}]
            }
        return request

    def start_job(self, dataset: PreparedDataset, job_name: str) -> JobRecord:
        """Create the customization job and return its record at once (training runs in AWS)."""
        job_id = bedrock_job_name(job_name or self.target)
        request = self.job_request(dataset, job_id)
        with aws_errors(f"starting Bedrock job {job_id!r}"):
            response = self.client("bedrock").create_model_customization_job(**request)
        record = JobRecord(
            id=job_id,
            backend=self.backend,
            target=self.target,
            model=self.cfg.base_model_id,
            status="pending",
            name=job_name or job_id,
            external_id=str(response["jobArn"]),
            dataset={
                "location": dataset.location,
                "train_records": dataset.train_records,
                "val_records": dataset.val_records,
                **dataset.details,
                "output_s3_uri": request["outputDataConfig"]["s3Uri"],
                "hyperparameters": request["hyperParameters"],
            },
        )
        self.store.save(record)
        return self.refresh(record)

    def refresh(self, record: JobRecord) -> JobRecord:
        """Update the record from get_model_customization_job and save it."""
        with aws_errors(f"reading Bedrock job {record.id!r}"):
            job = self.client("bedrock").get_model_customization_job(jobIdentifier=record.id)
        record.status = BEDROCK_STATUS.get(str(job.get("status")), record.status)
        record.started_at = record.started_at or iso(job.get("creationTime"))
        if job.get("outputModelArn"):
            record.output_path = str(job["outputModelArn"])
        if job.get("trainingMetrics"):
            record.metrics["training"] = job["trainingMetrics"]
        if job.get("validationMetrics"):
            record.metrics["validation"] = job["validationMetrics"]
        if record.status == "failed":
            record.error = str(job.get("failureMessage") or "the Bedrock job failed without a message")
        if record.finished:
            record.finished_at = iso(job.get("endTime")) or record.finished_at
        return self.store.save(record)

    def get_status(self, job_id: str) -> JobRecord:
        """The job's record refreshed from Bedrock (job id or ARN)."""
        return self.refresh(self.store.get(job_id))

    def cancel_job(self, job_id: str) -> JobRecord:
        """Stop the Bedrock job; a job already finished is returned unchanged."""
        record = self.refresh(self.store.get(job_id))
        if record.finished:
            return record
        with aws_errors(f"stopping Bedrock job {record.id!r}"):
            self.client("bedrock").stop_model_customization_job(jobIdentifier=record.id)
        record = self.refresh(record)
        record.status = "cancelled"
        return self.store.save(record)
