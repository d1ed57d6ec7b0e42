"""Tokens from Prefect Secret blocks when the environment lacks them."""

from __future__ import annotations

import pytest

from blocks.secrets import environment_with_secrets, load_secret, save_secret, secret_block_name
from multiagenttrainer.errors import SourceError
from tasks.ingest import resolve_source
from tests.support.git_servers import GitHttpServer, RepoFactory

TOKEN = "ghp_OrchestrationSecret9d2c4e6f8a0b1c3d"


@pytest.mark.parametrize(
    ("env_name", "block"),
    [("GITHUB_TOKEN", "github-token"), ("MY__GIT_TOKEN", "my-git-token"), ("token2", "token2")],
)
def test_block_names_follow_the_variable(env_name: str, block: str) -> None:
    assert secret_block_name(env_name) == block


def test_a_variable_without_letters_cannot_name_a_block() -> None:
    with pytest.raises(ValueError, match="cannot name a Secret block"):
        secret_block_name("__")


@pytest.mark.integration
def test_saved_secrets_fill_only_missing_variables(prefect_api: str) -> None:
    assert load_secret("MAT_NEVER_SAVED_TOKEN") is None
    assert save_secret("MAT_FILL_TOKEN", "from-block") == "mat-fill-token"
    assert load_secret("MAT_FILL_TOKEN") == "from-block"
    env = environment_with_secrets(["MAT_FILL_TOKEN", "MAT_NEVER_SAVED_TOKEN", None], env={"OTHER": "1"})
    assert env == {"OTHER": "1", "MAT_FILL_TOKEN": "from-block"}
    kept = environment_with_secrets(["MAT_FILL_TOKEN"], env={"MAT_FILL_TOKEN": "from-env"})
    assert kept == {"MAT_FILL_TOKEN": "from-env"}


@pytest.mark.integration
def test_a_source_authenticates_with_a_secret_block(prefect_api: str, flow_repos: RepoFactory) -> None:
    repo = flow_repos.create()
    cfg = {"type": "remote_repo", "url": "", "token_env": "MAT_PRIVATE_GIT_TOKEN"}
    with GitHttpServer(flow_repos.root, token=TOKEN) as git_http:
        cfg["url"] = f"{git_http.url}{repo.path}"
        with pytest.raises(SourceError) as refused:
            resolve_source.fn(cfg, "private", {"web_url": git_http.url, "api_url": git_http.url})
        assert TOKEN not in str(refused.value)
        save_secret("MAT_PRIVATE_GIT_TOKEN", TOKEN)
        assert (
            resolve_source.fn(cfg, "private", {"web_url": git_http.url, "api_url": git_http.url})
            == repo.head()
        )
