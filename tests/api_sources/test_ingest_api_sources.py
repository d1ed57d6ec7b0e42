"""Both API-backed sources through the Ingester: parallel fetches, one failing source reported by name."""

from __future__ import annotations

from multiagenttrainer.config import BedrockKnowledgeBaseSource, GithubConfig, GithubOrgSource
from multiagenttrainer.ingest import Ingester
from multiagenttrainer.sources.base import SourceContext
from tests.api_sources.conftest import WEB_URL
from tests.api_sources.fake_bedrock import passage, s3

KB = "KBINGEST01"


def test_ingester_fetches_org_and_knowledge_base(aws_env, fake_github, fake_bedrock, git_org, tmp_path):
    fake_bedrock.knowledge_bases[KB] = [passage("kb text", s3("s3://bucket/a.md"))]
    sources = [
        GithubOrgSource(type="github_org", url=f"{WEB_URL}/acme"),
        BedrockKnowledgeBaseSource(type="bedrock_knowledge_base", knowledge_base_id=KB, region="us-east-1"),
        GithubOrgSource(type="github_org", url=f"{WEB_URL}/ghosts", name="ghosts"),
    ]
    ctx = SourceContext(github=GithubConfig(web_url=WEB_URL, api_url=fake_github.url), env={}, timeout_s=5)
    result = Ingester(sources, tmp_path / "staging", context=ctx).fetch_all()
    assert [s.source for s in result.snapshots] == ["acme", f"kb-{KB}"]
    assert [t.repo for t in result.snapshots[0].trees] == ["acme/alpha", "acme/gamma"]  # public only
    assert result.snapshots[1].trees[0].path == str(tmp_path / "staging" / f"kb-{KB}" / "docs.jsonl")
    (failure,) = result.failures
    assert failure.source == "ghosts"
    assert f"organisation 'ghosts' not found at {WEB_URL}" in str(failure)
