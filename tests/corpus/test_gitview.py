"""git decides what the walk keeps, run so that the tree it reads cannot steer it: no planted config runs
anything, nothing from the caller's environment or home leaks in; and the cases git leaves to us (nested
repositories, submodules, tracked files below ignored directories) are decided as documented in walk.py."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from multiagenttrainer.config import LocalRepoSource
from multiagenttrainer.corpus.walk import WalkEvent, walk_events
from multiagenttrainer.errors import CorpusError, SourceError
from multiagenttrainer.sources import SourceContext, make_source
from tests.corpus.conftest import git, git_listing, native_code, write_tree


def walked(root: Path) -> list[WalkEvent]:
    """The walk with and without the native code (the same events); returns them."""
    with native_code(True):
        native = walk_events(root)
    with native_code(False):
        assert walk_events(root) == native
    assert len({event.rel for event in native}) == len(native)  # each entry once
    return native


def files_of(events: list[WalkEvent]) -> set[str]:
    return {event.rel for event in events if event.kind == "file"}


def work_tree(root: Path, files: dict[str, str], track: tuple[str, ...] = ()) -> Path:
    write_tree(root, files)
    git(root, "init", "-q")
    if track:
        git(root, "add", "-f", "--", *track)
    return root


# ------------------------------------------------------------------------- the tree cannot steer git


def test_a_planted_fsmonitor_hook_or_worktree_in_the_repository_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    script = tmp_path / "evil.sh"
    script.write_text(f"#!/bin/sh\ntouch {marker}\n")
    script.chmod(0o755)
    elsewhere = write_tree(tmp_path / "elsewhere", {"other.py": "o"})
    root = work_tree(tmp_path / "wt", {"a.py": "a", ".gitignore": "*.log\n", "x.log": "l"}, track=("a.py",))
    git(root, "config", "core.fsmonitor", str(script))
    git(root, "status", "--porcelain")  # the planted config is live: git itself runs the script
    assert marker.exists()
    marker.unlink()
    git(root, "config", "core.worktree", str(elsewhere))
    git(root, "config", "core.hooksPath", str(tmp_path))
    for hook in ("post-index-change", "post-checkout", "reference-transaction"):
        (tmp_path / hook).symlink_to(script)
    events = walked(root)
    source = make_source(LocalRepoSource(type="local_repo", path=str(root)), "wt", SourceContext())
    source.fetch(tmp_path / "staging")
    assert not marker.exists()
    assert files_of(events) == {"a.py", ".gitignore"}  # the tree itself, not core.worktree's


def test_the_callers_git_environment_and_config_do_not_leak_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ignore_all = tmp_path / "ignore-all"
    ignore_all.write_text("*\n")
    other = work_tree(tmp_path / "other", {"o.py": "o"}, track=("o.py",))
    home = write_tree(tmp_path / "home", {".gitconfig": f"[core]\n\texcludesFile = {ignore_all}\n"})
    write_tree(home / ".config", {"git/ignore": "*\n"})
    system = write_tree(tmp_path / "etc", {"gitconfig": f"[core]\n\texcludesFile = {ignore_all}\n"})
    for name, value in {
        "GIT_DIR": str(other / ".git"),
        "GIT_WORK_TREE": str(other),
        "GIT_INDEX_FILE": str(other / ".git" / "index"),
        "GIT_COMMON_DIR": str(other / ".git"),
        "GIT_CONFIG_PARAMETERS": f"'core.excludesfile'='{ignore_all}'",
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "core.excludesFile",
        "GIT_CONFIG_VALUE_0": str(ignore_all),
        "GIT_CONFIG_SYSTEM": str(system / "gitconfig"),
        "GIT_CONFIG_GLOBAL": str(home / ".gitconfig"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
    }.items():
        monkeypatch.setenv(name, value)
    root = write_tree(tmp_path / "plain", {"a.py": "a", "sub/b.md": "b"})
    assert files_of(walked(root)) == {"a.py", "sub/b.md"}


def test_the_repository_config_cannot_change_how_patterns_match(tmp_path: Path) -> None:
    ignore_py = tmp_path / "ignore-py"
    ignore_py.write_text("*.py\n")
    root = work_tree(tmp_path / "wt", {".gitignore": "*.PY\n", "a.py": "a", "b.PY": "b", "c.md": "c"})
    git(root, "config", "core.ignoreCase", "true")
    git(root, "config", "core.excludesFile", str(ignore_py))
    assert files_of(walked(root)) == {".gitignore", "a.py", "c.md"}


def test_the_throw_away_git_directory_is_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    root = write_tree(tmp_path / "plain", {"a.py": "a"})
    assert files_of(walked(root)) == {"a.py"}
    (root / ".git").mkdir()
    (root / ".git" / "index").write_text("not an index")
    assert files_of(walked(root)) == {"a.py"}  # not a repository to git: a plain directory
    bad = work_tree(tmp_path / "bad", {"a.py": "a"}, track=("a.py",))
    (bad / ".git" / "index").write_bytes(b"DIRC" + b"\xff" * 40)
    with pytest.raises(CorpusError):
        walk_events(bad)
    assert list(scratch.iterdir()) == []


def test_a_repository_git_cannot_read_fails_its_source_with_gits_message(tmp_path: Path) -> None:
    root = work_tree(tmp_path / "wt", {"a.py": "a"}, track=("a.py",))
    (root / ".git" / "index").write_bytes(b"DIRC" + b"\xff" * 40)
    source = make_source(LocalRepoSource(type="local_repo", path=str(root)), "broken", SourceContext())
    with pytest.raises(SourceError) as failure:
        source.resolve()
    message = str(failure.value)
    assert message.startswith(f"source 'broken': cannot list {root}: `git ls-files in {root}` failed: ")
    assert "index" in message and "\n" not in message


def test_without_git_the_error_says_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = write_tree(tmp_path / "plain", {"a.py": "a"})
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(CorpusError, match="git is not installed: install git"):
        walk_events(root)


def test_a_dot_git_file_pointing_nowhere_is_a_plain_directory(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "t", {".git": "gitdir: /nonexistent\n", "a.py": "a", "sub/.git": "x"})
    assert [e.rel for e in walked(root)] == ["a.py", "sub"]


def test_a_linked_worktree_uses_the_exclude_file_git_finds_for_it(tmp_path: Path) -> None:
    main = work_tree(tmp_path / "main", {"a.py": "a", "secret.txt": "s"}, track=("a.py",))
    git(main, "commit", "-q", "-m", "a")
    (main / ".git" / "info").mkdir(exist_ok=True)
    (main / ".git" / "info" / "exclude").write_text("secret.txt\n")
    linked = tmp_path / "linked"
    git(main, "worktree", "add", "-q", str(linked))
    (linked / "secret.txt").write_text("s")
    (linked / "new.py").write_text("n")
    assert (linked / ".git").is_file()
    assert files_of(walked(linked)) == {"a.py", "new.py"} == git_listing(linked, tmp_path)


# ------------------------------------------------------------- what git leaves to us, decided


def test_a_nested_repository_is_listed_by_its_own_rules(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path / "outer",
        {".gitignore": "*.md\nignored-repo/\n", "top.md": "t", "top.py": "t", "ignored-repo/x.py": "x"},
    )
    inner = work_tree(
        root / "inner",
        {".gitignore": "*.log\n", "a.md": "a", "b.log": "b", "secret.txt": "s", "c.py": "c", "d/e.py": "e"},
        track=("b.log",),
    )
    (inner / ".git" / "info").mkdir(exist_ok=True)
    (inner / ".git" / "info" / "exclude").write_text("secret.txt\n")
    git(root / "ignored-repo", "init", "-q")
    odd = work_tree(root / "odd\nname", {"kept.py": "k", "local.x": "x"})  # a name git prints on two lines
    (odd / ".git" / "info").mkdir(exist_ok=True)
    (odd / ".git" / "info" / "exclude").write_text("*.x\n")
    events = walked(root)
    inside = {"inner/" + rel for rel in git_listing(inner, tmp_path)}
    assert inside == {"inner/.gitignore", "inner/a.md", "inner/b.log", "inner/c.py", "inner/d/e.py"}
    assert files_of(events) == {".gitignore", "top.py", "odd\nname/kept.py"} | inside
    assert ("ignored-repo", "ignored") in {(e.rel, e.reason) for e in events if e.is_dir}


def test_files_the_outer_index_tracks_in_a_nested_repository_follow_its_rules(tmp_path: Path) -> None:
    root = work_tree(tmp_path / "outer", {"inner/x.log": "x", "inner/y.py": "y"}, track=("inner/x.log",))
    work_tree(root / "inner", {".gitignore": "*.log\n"})
    assert files_of(walked(root)) == {"inner/.gitignore", "inner/y.py"}


def test_submodules_are_read_as_their_own_repositories(tmp_path: Path) -> None:
    lib = work_tree(tmp_path / "lib", {".gitignore": "*.tmp\n", "lib.py": "l", "docs/x.md": "x"})
    git(lib, "add", "-A")
    git(lib, "commit", "-q", "-m", "lib")
    root = work_tree(tmp_path / "main", {"main.py": "m", ".gitignore": "*.py\n"}, track=("main.py",))
    git(root, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "libs/lib")
    git(root, "commit", "-q", "-m", "main")
    (root / "libs" / "lib" / "scratch.tmp").write_text("ignored in lib")
    events = walked(root)
    assert files_of(events) == {
        ".gitignore",
        ".gitmodules",
        "main.py",  # tracked: never ignored
        "libs/lib/.gitignore",
        "libs/lib/lib.py",  # the outer *.py does not reach into the submodule
        "libs/lib/docs/x.md",
    }
    clone = tmp_path / "clone"
    git(
        tmp_path, "clone", "-q", str(root), str(clone)
    )  # the submodule is not initialised: an empty directory
    assert [e.rel for e in walked(clone) if e.rel.startswith("libs")] == ["libs", "libs/lib"]


def test_a_tracked_file_replaced_by_a_directory_is_listed_once(tmp_path: Path) -> None:
    root = work_tree(tmp_path / "wt", {"a.txt": "a", "b.py": "b"}, track=("a.txt", "b.py"))
    (root / "a.txt").unlink()
    write_tree(root, {"a.txt/inner.py": "i"})
    assert files_of(walked(root)) == {"a.txt/inner.py", "b.py"} == git_listing(root, tmp_path) - {"a.txt"}


def test_tracked_files_are_never_ignored_but_caches_are_never_read(tmp_path: Path) -> None:
    files = {
        ".gitignore": "*.log\nbuild/\n!__pycache__/\n",  # a cache taken back: not read either
        "lib/__pycache__/y.py": "y",
        "a.log": "a",
        "b.log": "b",
        "build/keep.txt": "k",
        "build/other.txt": "o",
        "build/out/gen.js": "g",
        "pkg/__pycache__/m.py": "m",
        "pkg/m.py": "m",
    }
    root = work_tree(tmp_path / "wt", files, track=("a.log", "build/keep.txt", "pkg/__pycache__/m.py"))
    events = walked(root)
    assert files_of(events) == {".gitignore", "a.log", "build/keep.txt", "pkg/m.py"}
    assert files_of(events) == git_listing(root, tmp_path) - {"pkg/__pycache__/m.py", "lib/__pycache__/y.py"}
    skips = [(e.rel, e.reason, e.is_dir) for e in events if e.kind == "skip"]
    assert sorted(skips) == [
        ("b.log", "ignored", False),
        ("build/out", "ignored", True),
        ("lib/__pycache__", "cache", True),
        ("pkg/__pycache__", "cache", True),
    ]
    assert ("dir", "build") in {(e.kind, e.rel) for e in events}
