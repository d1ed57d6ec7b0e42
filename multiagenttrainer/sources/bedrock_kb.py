"""The bedrock_knowledge_base source: passages retrieved from an Amazon Bedrock knowledge base.

One `retrieve` query, paged with nextToken until `max_results` passages are collected. Each
passage becomes one document whose path is its source location (an S3 URI, a web URL, ...), so
the corpus keeps provenance. The client is a plain boto3 client from a fresh session, so boto3's
credential chain and AWS_ENDPOINT_URL_BEDROCK_AGENT_RUNTIME apply as usual.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from multiagenttrainer.atomic import write_atomically
from multiagenttrainer.config import BedrockKnowledgeBaseSource
from multiagenttrainer.errors import SourceError, TransientSourceError
from multiagenttrainer.sources.base import Snapshot, SourceContext, SourceInfo, Tree

log = logging.getLogger(__name__)

PAGE_LIMIT = 100  # the service accepts numberOfResults from 1 to 100
DOCS_FILE = "docs.jsonl"

# location key in a retrieval result -> (field holding the address, prefix for non-URL addresses)
LOCATION_FIELDS: dict[str, tuple[str, str]] = {
    "s3Location": ("uri", ""),
    "webLocation": ("url", ""),
    "confluenceLocation": ("url", ""),
    "salesforceLocation": ("url", ""),
    "sharePointLocation": ("url", ""),
    "oneDriveLocation": ("url", ""),
    "googleDriveLocation": ("url", ""),
    "kendraDocumentLocation": ("uri", ""),
    "customDocumentLocation": ("id", "custom:"),
    "sqlLocation": ("query", "sql:"),
}
SOURCE_URI_METADATA = "x-amz-bedrock-kb-source-uri"


def row_text(content: Mapping[str, Any]) -> str:
    """A structured-data row as `column: value` lines."""
    return "\n".join(
        f"{cell.get('columnName', '')}: {cell.get('columnValue', '')}" for cell in content.get("row", [])
    )


# content type -> how to get text from it; other types (IMAGE) carry no text and are skipped
CONTENT_TEXT: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "TEXT": lambda content: str(content.get("text") or ""),
    "ROW": row_text,
    "AUDIO": lambda content: str(content.get("audio", {}).get("transcription") or ""),
    "VIDEO": lambda content: str(content.get("video", {}).get("summary") or ""),
}


def kb_short_id(knowledge_base_id: str) -> str:
    """The 10-character id, also when the config gives a knowledge-base ARN."""
    return knowledge_base_id.rsplit("/", 1)[-1]


def result_location(result: Mapping[str, Any]) -> str | None:
    """The address a retrieval result came from, or None when it names none."""
    location = result.get("location") or {}
    for key, (field, prefix) in LOCATION_FIELDS.items():
        value = (location.get(key) or {}).get(field)
        if value:
            return f"{prefix}{value}"
    uri = (result.get("metadata") or {}).get(SOURCE_URI_METADATA)
    return str(uri) if uri else None


def result_text(result: Mapping[str, Any]) -> str:
    """The passage's text; empty for content types without text."""
    content = result.get("content") or {}
    extract = CONTENT_TEXT.get(str(content.get("type") or "TEXT"))
    return extract(content) if extract else ""


def document_records(results: Sequence[Mapping[str, Any]], kb_id: str) -> Iterator[dict[str, Any]]:
    """One JSONL record per passage with text; repeated locations get `#chunk-N` paths."""
    seen: dict[str, int] = {}
    for number, result in enumerate(results, start=1):
        text = result_text(result)
        if not text.strip():
            continue
        location = result_location(result) or f"{kb_id}#{number}"
        seen[location] = seen.get(location, 0) + 1
        path = location if seen[location] == 1 else f"{location}#chunk-{seen[location]}"
        yield {
            "path": path,
            "text": text,
            "score": result.get("score"),
            "metadata": result.get("metadata") or {},
        }


def write_jsonl_atomically(records: Iterator[dict[str, Any]], target: Path) -> tuple[int, str]:
    """Write records to `target` via a temporary file; return (records written, sha256 of the file)."""
    digest, count = hashlib.sha256(), 0

    def write_records(out: IO[bytes]) -> None:
        nonlocal count
        for record in records:
            line = (json.dumps(record, sort_keys=True, ensure_ascii=False, default=str) + "\n").encode()
            out.write(line)
            digest.update(line)
            count += 1

    write_atomically(target, write_records)
    return count, digest.hexdigest()


# AWS error code -> (what to tell the user, whether a retry may help). {kb} {region} {detail} are filled in.
CLIENT_ERRORS: dict[str, tuple[str, bool]] = {
    "ResourceNotFoundException": (
        "knowledge base {kb} not found in {region}; check knowledge_base_id and region",
        False,
    ),
    "AccessDeniedException": (
        "access denied to knowledge base {kb} in {region}; the AWS identity needs bedrock:Retrieve on it",
        False,
    ),
    "ValidationException": (
        "Bedrock rejected the request for {kb}: {detail}; check knowledge_base_id and query",
        False,
    ),
    "ServiceQuotaExceededException": (
        "a Bedrock quota was exceeded for {kb}: {detail}; lower max_results",
        False,
    ),
    "DependencyFailedException": (
        "a service behind knowledge base {kb} failed: {detail}; check its vector store and KMS key",
        False,
    ),
    "ConflictException": ("Bedrock reported a conflict for {kb}: {detail}; try again when it is idle", True),
    "ThrottlingException": (
        "Bedrock throttled retrieve calls for {kb}; try again later or lower max_results",
        True,
    ),
    "InternalServerException": ("Bedrock had an internal error retrieving from {kb}; try again later", True),
    "BadGatewayException": ("Bedrock returned a bad-gateway error for {kb}; try again later", True),
    "UnrecognizedClientException": ("AWS did not recognise the access key; check the AWS credentials", False),
    "InvalidSignatureException": ("AWS rejected the request signature; check the AWS secret key", False),
    "ExpiredTokenException": ("the AWS session credentials have expired; refresh them", False),
}

NO_CREDENTIALS = (
    "no AWS credentials: configure them the way boto3 looks for them "
    "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws, an instance or task role)"
)

# botocore exceptions raised before or instead of a response -> (message, transient)
BOTOCORE_ERRORS: tuple[tuple[type[BotoCoreError], str, bool], ...] = (
    (NoCredentialsError, NO_CREDENTIALS, False),
    (PartialCredentialsError, "incomplete AWS credentials: {detail}", False),
    (NoRegionError, "no AWS region: set `region:` on this source or AWS_DEFAULT_REGION", False),
    (BotoConnectionError, "cannot reach Bedrock in {region}: {detail}; check the network and endpoint", True),
    (HTTPClientError, "connection to Bedrock in {region} failed: {detail}; try again later", True),
)


class BedrockKnowledgeBase:
    """Passages from one knowledge base, retrieved for the configured query."""

    def __init__(self, cfg: BedrockKnowledgeBaseSource, name: str, ctx: SourceContext) -> None:
        self.cfg = cfg
        self.name = name
        self.ctx = ctx
        self.kb_id = kb_short_id(cfg.knowledge_base_id)

    def describe(self) -> SourceInfo:
        """Name, type and `bedrock:<id> (<region>)`; knowledge bases have no branch."""
        location = f"bedrock:{self.cfg.knowledge_base_id} ({self.cfg.region or 'default region'})"
        return SourceInfo(self.name, "bedrock_knowledge_base", location, None)

    def resolve(self) -> None:
        """Unknowable without retrieving: the knowledge base has no cheap version to ask for."""
        return None

    def fetch(self, staging: Path) -> Snapshot:
        """Retrieve up to max_results passages and write them to `staging/docs.jsonl`."""
        results = self.retrieve_all()
        staging.mkdir(parents=True, exist_ok=True)
        target = staging / DOCS_FILE
        count, sha = write_jsonl_atomically(document_records(results, self.kb_id), target)
        warnings = self._warnings(len(results), count)
        return Snapshot(
            source=self.name,
            type="bedrock_knowledge_base",
            version=sha,
            trees=[Tree(repo=f"kb:{self.kb_id}", kind="docs", path=str(target))],
            warnings=warnings,
        )

    def retrieve_all(self) -> list[dict[str, Any]]:
        """Every retrieval result, page by page, until max_results or the last page."""
        region = self.cfg.region or "the default region"
        try:
            client = self._client()
            region = client.meta.region_name or region
            return self._pages(client)
        except ClientError as exc:
            raise self._client_error(exc, region) from exc
        except BotoCoreError as exc:
            raise self._botocore_error(exc, region) from exc

    def _client(self) -> Any:
        # A fresh session per fetch: boto3's default session caches credentials and is not thread-safe.
        session = boto3.session.Session()
        timeouts = BotoConfig(connect_timeout=self.ctx.timeout_s, read_timeout=self.ctx.timeout_s)
        return session.client("bedrock-agent-runtime", region_name=self.cfg.region, config=timeouts)

    def _pages(self, client: Any) -> list[dict[str, Any]]:
        results: list[dict[str, Any]] = []
        token: str | None = None
        while len(results) < self.cfg.max_results:
            page = client.retrieve(**self._request(self.cfg.max_results - len(results), token))
            batch = page.get("retrievalResults") or []
            results.extend(batch[: self.cfg.max_results - len(results)])
            token = page.get("nextToken")
            if not token or not batch:
                break
        log.info("source %r: retrieved %d passages from %s", self.name, len(results), self.kb_id)
        return results

    def _request(self, remaining: int, token: str | None) -> dict[str, Any]:
        request: dict[str, Any] = {
            "knowledgeBaseId": self.cfg.knowledge_base_id,
            "retrievalQuery": {"text": self.cfg.query},
            "retrievalConfiguration": {
                "vectorSearchConfiguration": {"numberOfResults": min(PAGE_LIMIT, remaining)}
            },
        }
        if token:
            request["nextToken"] = token
        return request

    def _warnings(self, retrieved: int, written: int) -> list[str]:
        if retrieved == 0:
            return [f"knowledge base {self.kb_id} returned no passages for query {self.cfg.query!r}"]
        skipped = retrieved - written
        return (
            [f"{skipped} of {retrieved} passages had no text (images or empty) and were skipped"]
            if skipped
            else []
        )

    def _client_error(self, exc: ClientError, region: str) -> SourceError:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        detail = str(error.get("Message", "")) or code
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        template, transient = CLIENT_ERRORS.get(
            code, (f"Bedrock error {code or status} for {{kb}}: {{detail}}", status >= 500 or status == 429)
        )
        return self._error(template.format(kb=self.kb_id, region=region, detail=detail), transient)

    def _botocore_error(self, exc: BotoCoreError, region: str) -> SourceError:
        for kind, template, transient in BOTOCORE_ERRORS:
            if isinstance(exc, kind):
                return self._error(template.format(region=region, detail=exc), transient)
        return self._error(f"boto3 error for knowledge base {self.kb_id}: {type(exc).__name__}: {exc}")

    def _error(self, message: str, transient: bool = False) -> SourceError:
        return TransientSourceError(self.name, message) if transient else SourceError(self.name, message)
