"""License detection on fetched trees: LICENSE files in work trees and bare clones, and GitHub's API."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from multiagenttrainer.config import GithubConfig
from multiagenttrainer.snapshot import Snapshot, Tree
from multiagenttrainer.sources.licenses import detect_licenses, same_license, spdx_of_text
from tests.support.http import LOOPBACK, ServerThread

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "requests"
MIT = (ASSETS / "MIT.txt").read_text(encoding="utf-8")
GPL_OPENING = (ASSETS / "GPL-3.0-opening.txt").read_text(encoding="utf-8")


def dir_snapshot(folder: Path, source_type: str = "local_repo", repo: str | None = None) -> Snapshot:
    return Snapshot("src", source_type, "v1", [Tree(repo or folder.name, "dir", str(folder))])


@pytest.mark.parametrize(
    ("text", "spdx"),
    [
        (MIT, "MIT"),  # the full text with a real copyright line: matched by `identify`
        (MIT.replace("\n", " ").replace("  ", " "), "MIT"),  # reflowed
        (GPL_OPENING, "GPL-3.0"),  # only the opening lines: matched by its title
        ("// SPDX-License-Identifier: BSD-3-Clause\nsee the terms at https://example.com\n", "BSD-3-Clause"),
        ("All rights reserved. Do not copy.\n", None),
    ],
)
def test_license_texts_are_named_by_spdx_id(text: str, spdx: str | None) -> None:
    assert spdx_of_text(text) == spdx


def test_a_work_tree_license_file_is_found_and_named(tmp_path: Path) -> None:
    (tmp_path / "COPYING.md").write_text(GPL_OPENING, encoding="utf-8")
    (tmp_path / "LICENSES.txt.bak").write_text(MIT, encoding="utf-8")  # not a license file name: ignored
    (finding,) = detect_licenses([dir_snapshot(tmp_path)], GithubConfig())
    assert (finding.spdx, finding.evidence) == ("GPL-3.0", "COPYING.md")


def test_a_tree_without_a_license_has_none_and_says_why(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("# no license here\n", encoding="utf-8")
    (finding,) = detect_licenses([dir_snapshot(tmp_path)], GithubConfig())
    assert (finding.spdx, finding.evidence) == (None, "no LICENSE or COPYING file")
    (tmp_path / "LICENSE").write_text("Ask us first.\n", encoding="utf-8")
    (finding,) = detect_licenses([dir_snapshot(tmp_path)], GithubConfig())
    assert (finding.spdx, finding.evidence) == (None, "LICENSE: not a license mat recognises")


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def test_a_bare_clone_is_read_at_its_fetched_commit(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    git("init", "-q", "-b", "main", cwd=work)
    (work / "LICENSE").write_text(MIT, encoding="utf-8")
    git("add", "LICENSE", cwd=work)
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "mit", cwd=work)
    first = git("rev-parse", "HEAD", cwd=work)
    (work / "LICENSE").write_text(GPL_OPENING, encoding="utf-8")
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qam", "gpl", cwd=work)
    git("clone", "-q", "--bare", str(work), str(tmp_path / "clone.git"), cwd=tmp_path)

    def at(commit: str) -> str | None:
        tree = Tree("acme/widgets", "git", str(tmp_path / "clone.git"), commit)
        (finding,) = detect_licenses([Snapshot("src", "remote_repo", commit, [tree])], GithubConfig())
        return finding.spdx

    assert at(first) == "MIT"
    assert at(git("rev-parse", "HEAD", cwd=work)) == "GPL-3.0"


class GithubLicenses(BaseHTTPRequestHandler):
    """GET /repos/OWNER/REPO as GitHub answers it, with the license of acme/widgets only."""

    seen_authorization: list[str | None] = []

    def do_GET(self) -> None:
        GithubLicenses.seen_authorization.append(self.headers.get("Authorization"))
        if self.path == "/repos/acme/widgets":
            body = {"full_name": "acme/widgets", "license": {"key": "apache-2.0", "spdx_id": "Apache-2.0"}}
        elif self.path == "/repos/acme/other":
            body = {"full_name": "acme/other", "license": {"key": "other", "spdx_id": "NOASSERTION"}}
        else:
            self.send_response(404)
            self.end_headers()
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def github_api() -> Iterator[str]:
    server = ServerThread(lambda: ThreadingHTTPServer((LOOPBACK, 0), GithubLicenses))
    server.start()
    GithubLicenses.seen_authorization = []
    try:
        yield server.url
    finally:
        server.stop()


def test_github_trees_without_a_license_file_ask_the_api(tmp_path: Path, github_api: str) -> None:
    github = GithubConfig(web_url="https://github.example.com", api_url=github_api)
    snapshots = [
        Snapshot("org", "github_org", "v", [Tree(name, "dir", str(tmp_path)) for name in
                                            ("acme/widgets", "acme/other", "acme/gone")]),
        dir_snapshot(tmp_path, "local_repo", "acme/widgets"),  # not a GitHub source: the API is not asked
    ]  # fmt: skip
    findings = detect_licenses(snapshots, github, {"org": "ghp-test-token"})
    assert [(f.repo, f.spdx) for f in findings] == [
        ("acme/widgets", "Apache-2.0"), ("acme/other", None), ("acme/gone", None), ("acme/widgets", None)
    ]  # fmt: skip
    assert findings[0].evidence == "GitHub API"
    assert findings[1].evidence == "no LICENSE or COPYING file; GitHub API: no recognised license"
    assert findings[2].evidence == "no LICENSE or COPYING file; GitHub API answered 404"
    assert GithubLicenses.seen_authorization == ["Bearer ghp-test-token"] * 3


def test_spdx_ids_compare_without_case_or_only_suffix() -> None:
    assert same_license("GPL-3.0", "gpl-3.0-only") and same_license("MIT", "mit")
    assert not same_license("GPL-3.0", "GPL-2.0") and not same_license("LGPL-3.0", "GPL-3.0")
