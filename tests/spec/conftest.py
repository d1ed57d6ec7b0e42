"""Local stand-ins for everything the product description's examples reach, and the `mat` they run.

`github.com` is a `git http-backend` server on 127.0.0.1 (the repositories the examples name:
user/repo, user/other, myorg/myrepo, my-org/*) with a fake GitHub REST API listing `my-org`; the
Bedrock knowledge base ABCDEF1234 is a fake Bedrock endpoint; `/home/user/my-project` is a local git
work tree. `adapt` rewrites an example's hosts and paths to these stand-ins and nothing else.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.bare_repos import commit_files
from tests.support.fake_bedrock import FakeBedrock, passage, s3
from tests.support.fake_github import FakeGithub, FakeRepo
from tests.support.git_servers import GitHttpServer, git
from tests.support.tiny_model import corpus_dir, sample_files, tiny_model_dir

__all__ = ["corpus_dir", "tiny_model_dir"]  # session fixtures shared with the fine-tuning tests

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = Path(__file__).resolve().parent / "examples"
MAT = [sys.executable, "-m", "multiagenttrainer.cli"]
COMMAND_TIMEOUT_S = 300
KNOWLEDGE_BASE = "ABCDEF1234"
REPOSITORIES = {  # owner/name -> files: what each repository the description names holds
    "user/repo": {"README.md": "# repo\n", "repo.py": "def repo_main():\n    return 'user/repo'\n"},
    "user/other": {"other.py": "def other_main():\n    return 'user/other'\n"},
    "myorg/myrepo": {"myrepo.py": "def myrepo_main():\n    return 'myorg/myrepo'\n"},
    "my-org/alpha": {"alpha.py": "ALPHA = 'my-org/alpha'\n"},
    "my-org/beta": {"beta.py": "BETA = 'my-org/beta'\n"},
}


def local_project_files() -> dict[str, str]:
    """About 50 KB of code for /home/user/my-project: the tiny model's samples and ten of mat's modules."""
    modules = sorted(p for p in (ROOT / "multiagenttrainer").rglob("*.py") if 2000 < p.stat().st_size < 8000)
    files = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in modules[:10]}
    return {"project.py": "def project_main():\n    return 'my-project'\n", **dict(sample_files()), **files}


@dataclass
class StandIns:
    """Where the examples' hosts and paths really are in this test session."""

    git: GitHttpServer
    github: FakeGithub
    bedrock: FakeBedrock
    local_project: Path

    def adapt(self, text: str) -> str:
        """An example with github.com and /home/user/my-project pointed at the stand-ins."""
        return text.replace("https://github.com", self.git.url).replace(
            "/home/user/my-project", str(self.local_project)
        )

    def github_section(self) -> str:
        """The `github:` section that points mat at the stand-in GitHub (web and API)."""
        return f"github:\n  web_url: {self.git.url}\n  api_url: {self.github.url}\n"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a `mat` subprocess: fake AWS credentials and endpoints, fixed training steps."""
        scrubbed = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GITHUB_TOKEN"))}
        return scrubbed | {
            "AWS_ACCESS_KEY_ID": "AKIASPECEXAMPLES0001",
            "AWS_SECRET_ACCESS_KEY": "spec-examples-secret-never-printed",
            "AWS_CONFIG_FILE": "/nonexistent/aws-config",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_ENDPOINT_URL_BEDROCK_AGENT_RUNTIME": self.bedrock.url,
            "MAT_FIXED_STEPS": "3",
            "OMP_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "COLUMNS": "200",
            "NO_COLOR": "1",
            **extra,
        }


def git_work_tree(path: Path, files: dict[str, str]) -> Path:
    """A local git repository with `files` committed (the description's "Local git repository")."""
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text, encoding="utf-8")
    for command in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-q", "-m", "project"]):
        git(*command, cwd=path)
    return path


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandIns]:
    """The git host, GitHub API and Bedrock endpoint with the examples' repositories and knowledge base."""
    root = tmp_path_factory.mktemp("spec-stand-ins")
    for name, files in REPOSITORIES.items():
        commit_files(root / "git" / f"{name}.git", files)
    project = git_work_tree(root / "my-project", local_project_files())
    with GitHttpServer(root / "git") as git, FakeGithub() as github, FakeBedrock() as bedrock:
        github.orgs["my-org"] = [FakeRepo(n, f"{git.url}/my-org/{n}.git") for n in ("alpha", "beta")]
        bedrock.knowledge_bases[KNOWLEDGE_BASE] = [
            passage("Knowledge-base guide: how we write code.", s3("s3://kb/guide.md"))
        ]
        yield StandIns(git, github, bedrock, project)


def run_mat(
    args: list[str], cwd: Path, env: dict[str, str], timeout_s: float = COMMAND_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """`mat ARGS` in `cwd`, as typed."""
    return subprocess.run(
        [*MAT, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )


def example(name: str) -> str:
    """The text of one example under tests/spec/examples/."""
    return (EXAMPLES / name).read_text(encoding="utf-8")
