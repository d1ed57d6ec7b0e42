"""The evaluator of a run: the files that decide a score, recorded at set-up, put back and checked around
every training run.

    built-in      prepare.py, data/train.bin, data/val.bin (the dev split train.py scores itself on) and
                  evaluator/holdout/val.bin in the run directory (the held-out split mat scores on; it
                  never enters the workspace)
    autoresearch  prepare.py and every file of its data and tokenizer directories (<run_dir>/cache/...)

plus, per experiment, every module of the workspace that train.py imports (found with ast), which the
content revert has already put back from the base commit.

    <run_dir>/evaluator/manifest.json     each file's place, sha256, size and mode; the directories whose
                                          extra files are removed (an extra parquet shard would be trained on)
    <run_dir>/evaluator/objects/<sha256>  a copy of each file: restores never read the workspace's git
                                          objects, which an agent can rewrite
    <run_dir>/evaluator/git/              mat's .git/config and info/exclude (gitops.restore_control_files)

Large data files are not re-read before every run: a file whose inode, size, mtime and ctime are those
seen when it was last hashed in this process is taken as unchanged. ctime cannot be set from user space
(utime sets only atime and mtime), so an edit, a rename over the file or a chmod always shows. Each new
process (a resume) hashes every file once.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import stat
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from multiagenttrainer.atomic import write_json_atomically
from multiagenttrainer.errors import ExperimentError
from multiagenttrainer.workspace import gitops, worktree
from multiagenttrainer.workspace.worktree import Spared

EVALUATOR_DIR = "evaluator"
MANIFEST_FILE = "manifest.json"
OBJECTS_DIR = "objects"
GIT_COPY_DIR = "git"
HOLDOUT_REL = "evaluator/holdout/val.bin"  # relative to the run directory
READ_CHUNK = 1 << 20

StatKey = tuple[int, int, int, int, int]


@dataclass(frozen=True)
class FixedFile:
    """One file of the evaluator: where it lives (a root directory and a path below it) and its content."""

    root: str  # absolute: the workspace, the run directory, or the file's own directory
    path: str
    sha256: str
    size: int
    mode: int

    @property
    def location(self) -> Path:
        return Path(self.root) / self.path

    def behind_link(self) -> bool:
        """Whether a directory between the root and the file is now a link (reads would follow it)."""
        current = Path(self.root)
        for part in self.path.split("/")[:-1]:
            current = current / part
            if current.is_symlink():
                return True
        return False


@dataclass(frozen=True)
class Restored:
    """A file of the evaluator that was not as recorded, and what was done about it."""

    label: str  # the path as the user reads it (relative to the workspace or the run directory)
    kind: str  # modified, deleted, added (an extra file in a managed directory, removed)
    location: Path


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def stat_key(path: Path) -> StatKey | None:
    """(device, inode, size, mtime, ctime) of a regular file that is not a link; None otherwise."""
    try:
        st = path.lstat()
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass
class Evaluator:
    """The recorded evaluator of one run; see the module docstring."""

    run_dir: Path
    workspace: Path
    files: list[FixedFile]
    dirs: list[tuple[str, str]]  # (root, path) of directories that hold nothing but recorded files
    _seen: dict[str, tuple[StatKey, str]] = field(default_factory=dict, repr=False)

    # -- reading -------------------------------------------------------------

    @property
    def directory(self) -> Path:
        return self.run_dir / EVALUATOR_DIR

    @property
    def git_copy(self) -> Path:
        return self.directory / GIT_COPY_DIR

    def label(self, location: Path) -> str:
        """A path as the user reads it: relative to the workspace, else to the run directory."""
        for base in (self.workspace, self.run_dir):
            if location == base or base in location.parents:
                return str(location.relative_to(base))
        return str(location)

    def current_sha256(self, location: Path) -> str | None:
        """The sha256 of the regular file at `location` (None when it is not one), cached on its stat."""
        key = stat_key(location)
        if key is None:
            return None
        cached = self._seen.get(str(location))
        if cached is not None and cached[0] == key:
            return cached[1]
        try:
            digest = file_sha256(location)
        except OSError:
            return None
        if stat_key(location) == key:
            self._seen[str(location)] = (key, digest)
        return digest

    def fingerprint(self, extra: Sequence[Path] = ()) -> str:
        """One sha256 over every recorded file and the `extra` files, as they are now. With no extra file
        beyond the recorded ones, it is the recorded fingerprint exactly when nothing changed."""
        lines = sorted(
            f"{self.label(location)}\t{self.current_sha256(location) or 'missing'}"
            for location in {*(f.location for f in self.files), *extra}
        )
        return hashlib.sha256("\n".join(lines).encode("utf-8", "surrogateescape")).hexdigest()

    def recorded_fingerprint(self) -> str:
        """The fingerprint the recorded files have (what `fingerprint()` gives right after `restore()`)."""
        lines = sorted(f"{self.label(f.location)}\t{f.sha256}" for f in self.files)
        return hashlib.sha256("\n".join(lines).encode("utf-8", "surrogateescape")).hexdigest()

    def differences(self) -> list[Restored]:
        """The recorded files that are not as recorded now, and extra files in the managed directories."""
        found = [
            Restored(
                self.label(f.location), "modified" if os.path.lexists(f.location) else "deleted", f.location
            )
            for f in self.files
            if f.behind_link() or self.current_sha256(f.location) != f.sha256
        ]
        return found + [Restored(self.label(extra), "added", extra) for extra in self.extra_files()]

    def extra_files(self) -> list[Path]:
        """Entries of the managed directories that are not recorded files."""
        recorded = {f.location for f in self.files}
        extras: list[Path] = []
        for root, path in self.dirs:
            directory = Path(root) / path
            if directory.is_symlink() or not directory.is_dir():
                extras += [directory] if os.path.lexists(directory) else []
                continue
            for rel, entry in worktree.scan(directory).items():
                location = directory / rel
                if entry.kind != "dir" and location not in recorded:
                    extras.append(location)
        return extras

    def spared(self) -> Spared:
        """What a content comparison of the workspace leaves to this evaluator (its directories), to mat
        (its outputs) and to the interpreter environment (.venv)."""
        inside = {path for root, path in self.dirs if root == str(self.workspace)}
        return Spared(gitops.DEFAULT_SPARED.files, frozenset({".venv", *inside}))

    # -- putting back --------------------------------------------------------

    def restore(self, leave: frozenset[str] = frozenset()) -> list[Restored]:
        """Make every recorded file what was recorded and remove extra files, except the paths labelled in
        `leave`; return what was wrong."""
        wrong = [item for item in self.differences() if item.label not in leave]
        by_location = {f.location: f for f in self.files}
        for item in sorted(wrong, key=lambda item: item.kind != "added"):  # removals first
            if item.kind == "added":
                worktree.remove(item.location.parent, item.location.name)
            else:
                self.put_back(by_location[item.location])
        return wrong

    def put_back(self, fixed: FixedFile) -> None:
        """Copy the recorded bytes of one file over whatever is at its place."""
        source = self.object_path(fixed.sha256)
        if file_sha256(source) != fixed.sha256:
            raise ExperimentError(
                f"mat's copy of {self.label(fixed.location)} in {self.directory} was changed, so it "
                "cannot be restored; the run cannot be trusted any more: start a new run"
            )
        worktree.copy_file(source, Path(fixed.root), fixed.path, fixed.mode)
        self._seen.pop(str(fixed.location), None)

    def object_path(self, sha256: str) -> Path:
        return self.directory / OBJECTS_DIR / sha256

    def check_copies(self) -> None:
        """Raise ExperimentError when one of mat's own copies no longer has its recorded content."""
        for fixed in self.files:
            copy = self.object_path(fixed.sha256)
            if not copy.is_file() or file_sha256(copy) != fixed.sha256:
                raise ExperimentError(
                    f"mat's copy of {self.label(fixed.location)} ({copy}) is missing or was changed; the "
                    "run's evaluator cannot be trusted any more: start a new run"
                )

    def for_workspace(self, workspace: Path) -> Evaluator:
        """The same evaluator for another copy of the workspace (a machine's work tree in a run on several
        machines): files and directories recorded inside the workspace are taken to be inside `workspace`;
        those outside it (the run's data cache, the held-out split) stay where they are."""
        if workspace == self.workspace:
            return self
        home = str(self.workspace)

        def moved(root: str) -> str:
            return str(workspace) if root == home else root

        files = [replace(f, root=moved(f.root)) for f in self.files]
        return Evaluator(self.run_dir, workspace, files, [(moved(root), path) for root, path in self.dirs])

    # -- persistence ---------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """What run.json records about the evaluator: its fingerprint and each file's sha256."""
        return {
            "hash": self.recorded_fingerprint(),
            "files": {self.label(f.location): f.sha256 for f in sorted(self.files, key=lambda f: f.path)},
        }

    def save(self) -> None:
        data = {
            "workspace": str(self.workspace),
            "files": [asdict(f) for f in self.files],
            "dirs": [list(d) for d in self.dirs],
        }
        write_json_atomically(self.directory / MANIFEST_FILE, data)


# ---------------------------------------------------------------- set-up and loading


def record_evaluator(run_dir: Path, workspace: Path, files: list[Path], dirs: list[Path]) -> Evaluator:
    """Hash and copy the evaluator's files, save mat's git control files; write the manifest."""
    evaluator = Evaluator(run_dir, workspace, [], [])
    (evaluator.directory / OBJECTS_DIR).mkdir(parents=True, exist_ok=True)
    evaluator.files = [record_file(evaluator, location) for location in sorted(set(files))]
    evaluator.dirs = [(str(_root_for(evaluator, d)), _rel_to(evaluator, d)) for d in dirs]
    gitops.remove_redirections(gitops.check_git_dir(workspace))  # no hooks (a clone's samples), no grafts
    gitops.save_control_files(workspace, evaluator.git_copy)
    evaluator.save()
    return evaluator


def record_file(evaluator: Evaluator, location: Path) -> FixedFile:
    """Hash one file and keep a copy of it under objects/."""
    if stat_key(location) is None:
        raise ExperimentError(f"{location} should be a regular file of the evaluator; set the run up again")
    digest = file_sha256(location)
    copy = evaluator.object_path(digest)
    if not copy.exists():
        worktree.copy_file(location, copy.parent, copy.name, 0o600)
    mode = stat.S_IMODE(location.lstat().st_mode)
    root = _root_for(evaluator, location)
    return FixedFile(str(root), str(location.relative_to(root)), digest, location.stat().st_size, mode)


def _root_for(evaluator: Evaluator, location: Path) -> Path:
    for base in (evaluator.workspace, evaluator.run_dir):
        if base in location.parents:
            return base
    return location.parent


def _rel_to(evaluator: Evaluator, location: Path) -> str:
    return str(location.relative_to(_root_for(evaluator, location)))


def load_evaluator(run_dir: Path) -> Evaluator:
    """The evaluator recorded for a run; ExperimentError when the run has none (set up by an older mat)."""
    manifest = run_dir / EVALUATOR_DIR / MANIFEST_FILE
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
        files = [FixedFile(**item) for item in data["files"]]
        dirs = [(str(root), str(path)) for root, path in data["dirs"]]
        workspace = Path(data["workspace"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ExperimentError(
            f"{manifest} is missing or unreadable ({exc}); without its record of the evaluator the run "
            "cannot be checked: start a new run"
        ) from exc
    return Evaluator(run_dir, workspace, files, dirs)


# ---------------------------------------------------------------- what train.py imports


def imported_names(source: str) -> set[str]:
    """Top-level module names a Python source imports (absolute imports; `import a.b` gives `a`)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def module_files(workspace: Path, name: str) -> list[Path]:
    """The files of workspace module `name`: name.py, or every file of the package directory name/."""
    single = workspace / f"{name}.py"
    if single.is_file():
        return [single]
    package = workspace / name
    if package.is_dir() and not package.is_symlink():
        return sorted(package / rel for rel, e in worktree.scan(package).items() if e.kind == "file")
    return []


def workspace_imports(workspace: Path, train_file: str = gitops.TRAIN_FILE) -> list[Path]:
    """Every file of the workspace that train.py imports, directly or through those modules (not train.py)."""
    train = workspace / train_file
    pending = [train]
    found: set[Path] = set()
    while pending:
        source = pending.pop()
        try:
            text = source.read_text(encoding="utf-8", errors="replace") if source.suffix == ".py" else ""
        except OSError:
            continue
        for name in imported_names(text):
            for path in module_files(workspace, name):
                if path != train and path not in found:
                    found.add(path)
                    pending.append(path)
    return sorted(found)
