"""The `github_repo` source: a GitHub web URL, owner/repo or clone URL, fetched like `remote_repo`.

The token (`token_env`, GITHUB_TOKEN by default) is sent only to the configured GitHub host.
A web URL ending in /tree/BRANCH selects that branch unless `branch:` is set.
"""

from __future__ import annotations

from multiagenttrainer.config import GithubRepoSource
from multiagenttrainer.errors import ConfigError, SourceError
from multiagenttrainer.sources.base import SourceContext
from multiagenttrainer.sources.git import GitCredentials
from multiagenttrainer.sources.github_urls import (
    branch_in_ref,
    clone_url_for,
    github_auth_hint,
    github_credentials,
)
from multiagenttrainer.sources.remote_repo import RemoteRepo


class GithubRepo(RemoteRepo):
    """One repository on GitHub (or GitHub Enterprise at `github.web_url`)."""

    source_type = "github_repo"
    cfg: GithubRepoSource

    def __init__(self, cfg: GithubRepoSource, name: str, ctx: SourceContext) -> None:
        super().__init__(cfg, name, ctx)

    def clone_url(self) -> str:
        """The clone URL of the configured web URL or shorthand."""
        try:
            return clone_url_for(self.cfg.url, self.ctx.github)
        except ConfigError as exc:
            raise SourceError(self.name, f"{exc}; fix `url:` in the source") from exc

    def branch(self) -> str | None:
        """`branch:` if set, else the branch in a /tree/BRANCH URL, else the default branch."""
        try:
            return self.cfg.branch or branch_in_ref(self.cfg.url, self.ctx.github)
        except ConfigError:
            return None  # clone_url() reports the bad URL

    def credentials(self, url: str) -> GitCredentials | None:
        """The GitHub token, only when `url` is on the GitHub host."""
        return github_credentials(self.ctx, url, self.cfg.token_env)

    def auth_hint(self, url: str, credentials: GitCredentials | None) -> str:
        """Advice for an HTTP 401, including why no token may have been sent."""
        return github_auth_hint(self.ctx, url, self.cfg.token_env, credentials is not None)
