"""Both API-backed sources through the Ingester: parallel fetches, one failing source reported by name."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import yaml

from multiagenttrainer.config import BedrockKnowledgeBaseSource, GithubConfig, GithubOrgSource
from multiagenttrainer.ingest import Ingester
from multiagenttrainer.sources.base import SourceContext
from tests.support.api_fixtures import MARKER, clones_in
from tests.support.fake_bedrock import passage, s3
from tests.support.fake_github import FakeRepo

KB = "KBINGEST01"


def test_ingester_fetches_org_and_knowledge_base(
    aws_env, fake_github, fake_bedrock, git_org, git_host, tmp_path
):
    fake_bedrock.knowledge_bases[KB] = [passage("kb text", s3("s3://bucket/a.md"))]
    web_url = git_host.url
    sources = [
        GithubOrgSource(type="github_org", url=f"{web_url}/acme"),
        BedrockKnowledgeBaseSource(type="bedrock_knowledge_base", knowledge_base_id=KB, region="us-east-1"),
        GithubOrgSource(type="github_org", url=f"{web_url}/ghosts", name="ghosts"),
    ]
    ctx = SourceContext(github=GithubConfig(web_url=web_url, api_url=fake_github.url), env={}, timeout_s=5)
    result = Ingester(sources, tmp_path / "staging", context=ctx).fetch_all()
    assert [s.source for s in result.snapshots] == ["acme", f"kb-{KB}"]
    assert [t.repo for t in result.snapshots[0].trees] == ["acme/alpha", "acme/gamma"]  # public only
    assert result.snapshots[1].trees[0].path == str(tmp_path / "staging" / f"kb-{KB}" / "docs.jsonl")
    (failure,) = result.failures
    assert failure.source == "ghosts"
    assert f"organisation 'ghosts' not found at {web_url}" in str(failure)


@pytest.mark.integration
def test_mat_ingest_refuses_a_hostile_clone_url_and_exits_1(
    prefect_api, fake_github, git_org, git_host, private_repo, tmp_path
):
    """A local private repository named by the API (file://) never reaches the corpus; a repository
    that cannot be cloned is listed too; the others are in the corpus; exit code 1."""
    fake_github.orgs["acme"] += [
        FakeRepo("secret", f"file://{private_repo}"),
        FakeRepo("ghost", f"{git_host.url}/acme/ghost.git"),
    ]
    corpus = tmp_path / "corpus"
    config = tmp_path / "mat.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "sources": [{"type": "github_org", "url": f"{git_host.url}/acme", "name": "acme"}],
                "github": {"web_url": git_host.url, "api_url": fake_github.url},
                "corpus": {"dir": str(corpus), "staging_dir": str(tmp_path / "staging")},
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_TOKEN"} | {"COLUMNS": "400", "NO_COLOR": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "multiagenttrainer.cli", "ingest", "--config", str(config)],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip

    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("incomplete: acme: ")]
    assert line.startswith("incomplete: acme: 2 repositories not fetched (2 were): ")
    assert f"acme/secret: refused the clone URL 'file://{private_repo}' from the GitHub API" in line
    assert "acme/ghost: " in line
    text = (corpus / "corpus.txt").read_text()
    assert "NAME = 'alpha'" in text and "NAME = 'gamma'" in text  # the public repositories
    assert MARKER not in text and MARKER not in (corpus / "corpus.jsonl").read_text()
    assert clones_in(tmp_path / "staging" / "acme") == ["acme__alpha.git", "acme__gamma.git"]


def closed_port_url() -> str:
    """An http URL on 127.0.0.1 where nothing listens (connections are refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@pytest.mark.integration
@pytest.mark.parametrize(
    ("behaviour", "message"),
    [
        ("bad_gateway", "kept failing with server errors (502 for organisation 'acme'); try again later"),
        ("refused", "cannot reach the GitHub API at "),
        ("rate_limited", "GitHub rate limit reached for acme; resets at "),
        ("secondary_rate_limited", "GitHub rate limit reached for acme; resets at "),
    ],
)
def test_a_failing_org_prints_only_mats_own_line(
    prefect_api, fake_github, git_host, tmp_path, behaviour, message
):
    """5xx, connection refused, rate limits: through the real `mat ingest`, stderr holds mat's one line
    about the source and nothing from urllib3, PyGithub, Prefect or mat's own log records."""
    fake_github.orgs["acme"] = []
    fake_github.behaviours["acme"] = behaviour
    api_url = closed_port_url() if behaviour == "refused" else fake_github.url
    config = tmp_path / "mat.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "sources": [{"type": "github_org", "url": f"{git_host.url}/acme", "name": "acme"}],
                "github": {"web_url": git_host.url, "api_url": api_url},
                "corpus": {"dir": str(tmp_path / "corpus"), "staging_dir": str(tmp_path / "staging")},
            }
        )
    )
    env = {**os.environ, "GITHUB_TOKEN": fake_github.token, "COLUMNS": "400", "NO_COLOR": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "multiagenttrainer.cli", "ingest", "--config", str(config)],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip

    assert result.returncode == 1, result.stdout + result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("failed: acme: ") and message in line, result.stderr
    assert fake_github.token not in result.stdout + result.stderr
    assert result.stdout == "No corpus was written: every source failed.\n"
