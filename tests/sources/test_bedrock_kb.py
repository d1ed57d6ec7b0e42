"""bedrock_knowledge_base against a local endpoint speaking the Retrieve REST-JSON API.

boto3 finds the endpoint through AWS_ENDPOINT_URL_BEDROCK_AGENT_RUNTIME and the fake credentials
through the usual environment variables: the adapter's client is configured only the standard way.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from multiagenttrainer.config import BedrockKnowledgeBaseSource
from multiagenttrainer.errors import SourceError, TransientSourceError
from multiagenttrainer.sources import registry
from multiagenttrainer.sources.base import SourceContext
from multiagenttrainer.sources.bedrock_kb import BedrockKnowledgeBase
from tests.support.api_fixtures import ACCESS_KEY, SECRET_KEY
from tests.support.fake_bedrock import passage, s3, web

KB = "KB12345678"
FAST_FAIL_S = 10


def make_kb(kb_id: str = KB, region: str | None = "us-east-1", **fields) -> BedrockKnowledgeBase:
    cfg = BedrockKnowledgeBaseSource(
        type="bedrock_knowledge_base", knowledge_base_id=kb_id, region=region, **fields
    )
    return BedrockKnowledgeBase(cfg, "kb", SourceContext(env={}, timeout_s=5))


def read_docs(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


def numbered(count: int) -> list[dict]:
    return [passage(f"passage {i}", s3(f"s3://docs/file-{i}.md"), score=1 - i / 1000) for i in range(count)]


# --------------------------------------------------------------------------- retrieval and paging


def test_pages_until_max_results(aws_env, fake_bedrock, tmp_path):
    fake_bedrock.knowledge_bases[KB] = numbered(250)
    snapshot = make_kb(max_results=230, query="how do widgets spin?").fetch(tmp_path)
    assert [r.number_of_results for r in fake_bedrock.requests] == [100, 100, 30]
    assert [r.body.get("nextToken") for r in fake_bedrock.requests] == [None, "offset-100", "offset-200"]
    assert {r.body["retrievalQuery"]["text"] for r in fake_bedrock.requests} == {"how do widgets spin?"}
    docs = read_docs(snapshot.trees[0].path)
    assert [d["path"] for d in docs] == [f"s3://docs/file-{i}.md" for i in range(230)]
    assert docs[0] == {"path": "s3://docs/file-0.md", "text": "passage 0", "score": 1.0, "metadata": {}}


def test_stops_at_the_last_page(aws_env, fake_bedrock, tmp_path):
    fake_bedrock.knowledge_bases[KB] = numbered(42)
    snapshot = make_kb(max_results=500).fetch(tmp_path)
    assert [r.number_of_results for r in fake_bedrock.requests] == [100]
    assert len(read_docs(snapshot.trees[0].path)) == 42


def test_snapshot_describes_the_docs_file(aws_env, fake_bedrock, tmp_path):
    fake_bedrock.knowledge_bases[KB] = numbered(3)
    snapshot = make_kb().fetch(tmp_path)
    (tree,) = snapshot.trees
    assert (tree.repo, tree.kind, tree.path, tree.commit) == (
        f"kb:{KB}",
        "docs",
        str(tmp_path / "docs.jsonl"),
        None,
    )
    assert (snapshot.source, snapshot.type, snapshot.warnings) == ("kb", "bedrock_knowledge_base", [])
    assert snapshot.version == hashlib.sha256((tmp_path / "docs.jsonl").read_bytes()).hexdigest()
    assert [p.name for p in tmp_path.iterdir()] == ["docs.jsonl"]  # no temporary file left behind


def test_version_follows_the_content(aws_env, fake_bedrock, tmp_path):
    fake_bedrock.knowledge_bases[KB] = numbered(3)
    source = make_kb()
    first = source.fetch(tmp_path).version
    assert source.fetch(tmp_path).version == first
    fake_bedrock.knowledge_bases[KB][1] = passage("passage 1, edited", s3("s3://docs/file-1.md"))
    assert source.fetch(tmp_path).version != first


def test_resolve_is_unknowable_and_free(aws_env, fake_bedrock):
    assert make_kb().resolve() is None
    assert fake_bedrock.requests == []


def test_requests_are_signed_with_the_environment_credentials(aws_env, fake_bedrock, tmp_path):
    fake_bedrock.knowledge_bases[KB] = numbered(1)
    make_kb(region="eu-west-1").fetch(tmp_path)
    (request,) = fake_bedrock.requests
    assert request.authorization.startswith(f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/")
    assert "/eu-west-1/bedrock/aws4_request" in request.authorization
    assert SECRET_KEY not in request.authorization


def test_knowledge_base_arn_is_accepted(aws_env, fake_bedrock, tmp_path):
    arn = f"arn:aws:bedrock:us-east-1:123456789012:knowledge-base/{KB}"
    fake_bedrock.knowledge_bases[arn] = numbered(2)
    snapshot = make_kb(arn).fetch(tmp_path)
    assert snapshot.trees[0].repo == f"kb:{KB}"
    assert fake_bedrock.requests[0].knowledge_base_id == arn


# --------------------------------------------------------------------------- provenance


def test_provenance_of_each_location_kind(aws_env, fake_bedrock, tmp_path):
    fake_bedrock.knowledge_bases[KB] = [
        passage(
            "from s3", s3("s3://bucket/guide.md"), 0.9, {"x-amz-bedrock-kb-chunk-id": "c1", "team": "docs"}
        ),
        passage("from the web", web("https://example.com/page"), 0.8),
        passage(
            "from confluence", {"type": "CONFLUENCE", "confluenceLocation": {"url": "https://wiki.example/x"}}
        ),
        passage("custom", {"type": "CUSTOM", "customDocumentLocation": {"id": "doc-7"}}),
        passage(
            "from kendra", {"type": "KENDRA", "kendraDocumentLocation": {"uri": "https://kendra.example/d"}}
        ),
        passage("no location at all"),
        passage("only metadata", None, 0.1, {"x-amz-bedrock-kb-source-uri": "s3://bucket/meta.md"}),
    ]
    docs = read_docs(make_kb().fetch(tmp_path).trees[0].path)
    assert [d["path"] for d in docs] == [
        "s3://bucket/guide.md",
        "https://example.com/page",
        "https://wiki.example/x",
        "custom:doc-7",
        "https://kendra.example/d",
        f"{KB}#6",
        "s3://bucket/meta.md",
    ]
    assert docs[0]["score"] == 0.9
    assert docs[0]["metadata"] == {"x-amz-bedrock-kb-chunk-id": "c1", "team": "docs"}
    assert docs[5]["text"] == "no location at all"


def test_chunks_from_one_location_get_distinct_paths(aws_env, fake_bedrock, tmp_path):
    fake_bedrock.knowledge_bases[KB] = [
        passage("chunk a", s3("s3://bucket/big.md")),
        passage("other", s3("s3://bucket/small.md")),
        passage("chunk b", s3("s3://bucket/big.md")),
        passage("chunk c", s3("s3://bucket/big.md")),
    ]
    docs = read_docs(make_kb().fetch(tmp_path).trees[0].path)
    assert [(d["path"], d["text"]) for d in docs] == [
        ("s3://bucket/big.md", "chunk a"),
        ("s3://bucket/small.md", "other"),
        ("s3://bucket/big.md#chunk-2", "chunk b"),
        ("s3://bucket/big.md#chunk-3", "chunk c"),
    ]


def test_rows_become_text_and_images_are_skipped(aws_env, fake_bedrock, tmp_path):
    row = [
        {"columnName": "name", "columnValue": "spinner", "type": "STRING"},
        {"columnName": "rpm", "columnValue": "9"},
    ]
    fake_bedrock.knowledge_bases[KB] = [
        {
            "content": {"type": "ROW", "row": row},
            "location": {"type": "SQL", "sqlLocation": {"query": "SELECT 1"}},
        },
        {"content": {"type": "IMAGE", "byteContent": "aGVsbG8="}, "location": s3("s3://bucket/logo.png")},
    ]
    snapshot = make_kb().fetch(tmp_path)
    docs = read_docs(snapshot.trees[0].path)
    assert [(d["path"], d["text"]) for d in docs] == [("sql:SELECT 1", "name: spinner\nrpm: 9")]
    assert snapshot.warnings == ["1 of 2 passages had no text (images or empty) and were skipped"]


def test_no_passages_is_a_warning_not_an_error(aws_env, fake_bedrock, tmp_path):
    fake_bedrock.knowledge_bases[KB] = []
    snapshot = make_kb(query="nothing matches").fetch(tmp_path)
    assert read_docs(snapshot.trees[0].path) == []
    assert snapshot.warnings == [f"knowledge base {KB} returned no passages for query 'nothing matches'"]


# --------------------------------------------------------------------------- errors


def assert_no_secret(error: Exception) -> None:
    assert SECRET_KEY not in str(error)


def test_unknown_knowledge_base(aws_env, fake_bedrock, tmp_path):
    with pytest.raises(SourceError) as caught:
        make_kb("NOSUCHKB00", region="eu-central-1").fetch(tmp_path)
    assert not isinstance(caught.value, TransientSourceError)
    assert str(caught.value) == (
        "source 'kb': knowledge base NOSUCHKB00 not found in eu-central-1; check knowledge_base_id and region"
    )
    assert not (tmp_path / "docs.jsonl").exists()


def test_throttling_is_transient(aws_env, fake_bedrock, tmp_path):
    aws_env.setenv("AWS_MAX_ATTEMPTS", "1")  # boto3's own retries would only slow the test down
    fake_bedrock.behaviours[KB] = "throttled"
    with pytest.raises(TransientSourceError, match=f"Bedrock throttled retrieve calls for {KB}") as caught:
        make_kb().fetch(tmp_path)
    assert_no_secret(caught.value)


def test_access_denied(aws_env, fake_bedrock, tmp_path):
    fake_bedrock.behaviours[KB] = "denied"
    with pytest.raises(SourceError, match="the AWS identity needs bedrock:Retrieve") as caught:
        make_kb().fetch(tmp_path)
    assert not isinstance(caught.value, TransientSourceError)
    assert_no_secret(caught.value)


def test_validation_error_carries_the_service_message(aws_env, fake_bedrock, tmp_path):
    fake_bedrock.behaviours[KB] = "invalid"
    with pytest.raises(SourceError, match=r"Bedrock rejected the request for KB12345678: 1 validation error"):
        make_kb().fetch(tmp_path)


def test_missing_credentials_fail_fast_with_a_clear_message(aws_env, fake_bedrock, tmp_path):
    aws_env.delenv("AWS_ACCESS_KEY_ID")
    aws_env.delenv("AWS_SECRET_ACCESS_KEY")
    started = time.monotonic()
    with pytest.raises(SourceError, match="no AWS credentials: configure them the way boto3 looks for them"):
        make_kb().fetch(tmp_path)
    assert time.monotonic() - started < FAST_FAIL_S
    assert fake_bedrock.requests == []


def test_missing_region_says_how_to_set_one(aws_env, fake_bedrock, tmp_path):
    with pytest.raises(
        SourceError, match="no AWS region: set `region:` on this source or AWS_DEFAULT_REGION"
    ):
        make_kb(region=None).fetch(tmp_path)


def test_default_region_comes_from_the_environment(aws_env, fake_bedrock, tmp_path):
    aws_env.setenv("AWS_DEFAULT_REGION", "ap-southeast-2")
    with pytest.raises(SourceError, match="not found in ap-southeast-2"):
        make_kb("NOSUCHKB00", region=None).fetch(tmp_path)


def test_unreachable_endpoint_is_transient(aws_env, fake_bedrock, tmp_path):
    aws_env.setenv("AWS_MAX_ATTEMPTS", "1")
    fake_bedrock.stop()
    started = time.monotonic()
    with pytest.raises(TransientSourceError, match="cannot reach Bedrock in us-east-1") as caught:
        make_kb().fetch(tmp_path)
    assert time.monotonic() - started < FAST_FAIL_S
    assert_no_secret(caught.value)


# --------------------------------------------------------------------------- describe and registry


def test_describe_needs_no_network(aws_env, fake_bedrock):
    assert make_kb(region="eu-west-1").describe().location == f"bedrock:{KB} (eu-west-1)"
    info = make_kb(region=None).describe()
    assert (info.name, info.type, info.location, info.branch) == (
        "kb",
        "bedrock_knowledge_base",
        f"bedrock:{KB} (default region)",
        None,
    )
    assert fake_bedrock.requests == []


def test_registry_builds_the_adapter():
    cfg = BedrockKnowledgeBaseSource(type="bedrock_knowledge_base", knowledge_base_id=KB)
    (source,) = registry.make_sources([cfg])
    assert isinstance(source, BedrockKnowledgeBase)
    assert source.name == "kb-KB12345678"
