"""Which license a fetched tree is under: its LICENSE/COPYING files, else the GitHub API's answer.

    findings = detect_licenses(snapshots, github, tokens)   # one LicenseFinding per tree

A tree's top-level license files (LICENSE, LICENCE, COPYING, UNLICENSE, with any extension) are read
from the work tree or from the fetched commit of a bare clone, at most MAX_LICENSE_BYTES each, and
named by SPDX id in this order: an `SPDX-License-Identifier:` line; the full text matched against
the licenses choosealicense.com lists (the `identify` library: under 5 % of the text edited, so a
copyright line or reflowed paragraphs still match); the opening lines of the well-known licenses
(a GPL file cut after its preamble). Trees of GitHub sources without such a file are looked up with
GitHub's REST API (`GET /repos/OWNER/REPO`, its `license.spdx_id`). Knowledge-base documents and
trees without any of these have no license (`spdx` None), which an allow-list treats as not allowed.
"""

from __future__ import annotations

import logging
import re
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import requests
from dulwich.errors import NotGitRepository
from dulwich.objects import Blob, Commit
from dulwich.objects import Tree as GitTree
from dulwich.repo import Repo

from multiagenttrainer.config import GithubConfig
from multiagenttrainer.snapshot import Snapshot, Tree

log = logging.getLogger(__name__)

LICENSE_NAME = re.compile(r"^(?:UN)?(?:LICEN[CS]E|COPYING)(?:[._-][A-Za-z0-9._-]*)?$", re.IGNORECASE)
MAX_LICENSE_BYTES = 256 * 1024  # the longest common license (AGPL-3.0) is about 34 KB
GITHUB_SOURCE_TYPES = frozenset({"github_repo", "github_org", "github_repo_list"})
FULL_NAME = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")
SPDX_LINE = re.compile(r"SPDX-License-Identifier:\s*([A-Za-z0-9.+-]+)")
API_TIMEOUT_S = 15.0
HEAD_LINES = 12  # opening lines compared with OPENINGS

# Opening lines of licenses whose files are often cut or reformatted; the more specific ones first.
OPENINGS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"GNU AFFERO GENERAL PUBLIC LICENSE\s+Version 3"), "AGPL-3.0"),
    (re.compile(r"GNU LESSER GENERAL PUBLIC LICENSE\s+Version 3"), "LGPL-3.0"),
    (re.compile(r"GNU LESSER GENERAL PUBLIC LICENSE\s+Version 2\.1"), "LGPL-2.1"),
    (re.compile(r"GNU GENERAL PUBLIC LICENSE\s+Version 3"), "GPL-3.0"),
    (re.compile(r"GNU GENERAL PUBLIC LICENSE\s+Version 2"), "GPL-2.0"),
    (re.compile(r"Apache License\s+Version 2\.0"), "Apache-2.0"),
    (re.compile(r"Mozilla Public License,? (?:Version|v\.) 2\.0"), "MPL-2.0"),
    (re.compile(r"^(?:The )?MIT License"), "MIT"),
    (re.compile(r"This is free and unencumbered software released into the public domain"), "Unlicense"),
]


@dataclass(frozen=True)
class LicenseFinding:
    """The license of one fetched tree: its SPDX id (None when none was found) and where it came from."""

    source: str
    repo: str
    spdx: str | None
    evidence: str  # "LICENSE", "GitHub API", "no LICENSE or COPYING file", ...

    def to_dict(self) -> dict[str, str | None]:
        return {"source": self.source, "repo": self.repo, "spdx": self.spdx, "evidence": self.evidence}


# --------------------------------------------------------------------------- naming a license text


def spdx_of_text(text: str) -> str | None:
    """The SPDX id of a license file's text, or None when it matches no known license."""
    declared = SPDX_LINE.search(text)
    if declared:
        return declared.group(1)
    return full_text_match(text) or opening_match(text)


def full_text_match(text: str) -> str | None:
    """The license whose full text this is (choosealicense.com's list, through `identify`)."""
    from identify.identify import license_id

    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".txt") as handle:
        handle.write(text)
        handle.flush()
        found: str | None = license_id(handle.name)
    return found


def opening_match(text: str) -> str | None:
    """The license whose title opens the text (a GPL file cut after its preamble, say)."""
    head = " ".join(" ".join(text.splitlines()[:HEAD_LINES]).split())
    for pattern, spdx in OPENINGS:
        if pattern.search(head):
            return spdx
    return None


def same_license(found: str, allowed: str) -> bool:
    """Whether two SPDX ids name the same license (case and an `-only` suffix do not matter)."""
    return normalized(found) == normalized(allowed)


def normalized(spdx: str) -> str:
    return spdx.strip().upper().removesuffix("-ONLY")


# --------------------------------------------------------------------------- license files of a tree


def license_files(tree: Tree) -> list[tuple[str, bytes]]:
    """(name, first MAX_LICENSE_BYTES) of each top-level license file of the tree, by name."""
    if tree.kind == "dir":
        return sorted(dir_license_files(Path(tree.path)))
    if tree.kind == "git" and tree.commit:
        return sorted(git_license_files(Path(tree.path), tree.commit))
    return []


def dir_license_files(folder: Path) -> Iterator[tuple[str, bytes]]:
    try:
        entries = list(folder.iterdir())
    except OSError:
        return
    for entry in entries:
        if LICENSE_NAME.match(entry.name) and entry.is_file() and not entry.is_symlink():
            try:
                with entry.open("rb") as handle:
                    yield entry.name, handle.read(MAX_LICENSE_BYTES)
            except OSError as exc:
                log.warning("cannot read %s: %s", entry, exc.strerror)


def git_license_files(bare: Path, commit: str) -> Iterator[tuple[str, bytes]]:
    try:
        with Repo(str(bare)) as repo:
            head = repo[commit.encode()]
            if not isinstance(head, Commit):
                return
            root = repo[head.tree]
            assert isinstance(root, GitTree)
            for item in root.items():
                name = item.path.decode("utf-8", errors="replace")
                blob = repo[item.sha] if LICENSE_NAME.match(name) else None
                if isinstance(blob, Blob):
                    yield name, blob.as_raw_string()[:MAX_LICENSE_BYTES]
    except (NotGitRepository, KeyError, OSError) as exc:
        log.warning("cannot read the license files of %s at %s: %s", bare, commit[:12], exc)


def license_from_files(tree: Tree) -> tuple[str | None, str]:
    """(SPDX id, file it came from) from the tree's license files; (None, why not) without a match."""
    files = license_files(tree)
    for name, data in files:
        spdx = spdx_of_text(data.decode("utf-8", errors="replace"))
        if spdx:
            return spdx, name
    if files:
        return None, f"{', '.join(name for name, _ in files)}: not a license mat recognises"
    return None, "no LICENSE or COPYING file"


# --------------------------------------------------------------------------- the GitHub API


def github_license(full_name: str, github: GithubConfig, token: str | None) -> tuple[str | None, str]:
    """(SPDX id, evidence) from GitHub's answer for the repository; never raises."""
    headers = {"Accept": "application/vnd.github+json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        answer = requests.get(f"{github.api_url}/repos/{full_name}", headers=headers, timeout=API_TIMEOUT_S)
    except requests.RequestException as exc:
        return None, f"GitHub API unreachable ({type(exc).__name__})"
    if answer.status_code != 200:
        return None, f"GitHub API answered {answer.status_code}"
    try:
        spdx = (answer.json().get("license") or {}).get("spdx_id")
    except (ValueError, AttributeError):
        return None, "GitHub API answer is not a repository object"
    if not isinstance(spdx, str) or not spdx or spdx == "NOASSERTION":
        return None, "GitHub API: no recognised license"
    return spdx, "GitHub API"


# --------------------------------------------------------------------------- every tree of a snapshot


def detect_licenses(
    snapshots: list[Snapshot], github: GithubConfig, tokens: Mapping[str, str | None] | None = None
) -> list[LicenseFinding]:
    """One finding per fetched tree; `tokens`: the GitHub token of each source, by source name."""
    findings = []
    for snapshot in snapshots:
        for tree in snapshot.trees:
            findings.append(tree_license(snapshot, tree, github, (tokens or {}).get(snapshot.source)))
    return findings


def tree_license(snapshot: Snapshot, tree: Tree, github: GithubConfig, token: str | None) -> LicenseFinding:
    """The finding for one tree: its files first, then (GitHub sources only) the API."""
    if tree.kind == "docs":
        return LicenseFinding(snapshot.source, tree.repo, None, "knowledge-base documents carry no license")
    spdx, evidence = license_from_files(tree)
    if spdx is None and snapshot.type in GITHUB_SOURCE_TYPES and FULL_NAME.fullmatch(tree.repo):
        from_api, api_evidence = github_license(tree.repo, github, token)
        if from_api is not None:
            spdx, evidence = from_api, api_evidence
        else:
            evidence = f"{evidence}; {api_evidence}"
    return LicenseFinding(snapshot.source, tree.repo, spdx, evidence)
