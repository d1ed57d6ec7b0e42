"""Atomic file writes: fill a temp file beside the target, fsync it, rename it over the target.

Readers never see half a file, and a failed write leaves the old file (or none) and no temp file behind.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

DEFAULT_MODE = 0o644  # mkstemp makes 0600 files; mat's outputs are meant to be read and shared


def write_atomically(path: Path, write: Callable[[IO[bytes]], object], mode: int = DEFAULT_MODE) -> None:
    """Let `write` fill a temp file beside `path`, fsync it, then rename it over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_bytes_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically."""
    write_atomically(path, lambda handle: handle.write(data))


def write_json_atomically(path: Path, data: Any) -> None:
    """Dump `data` as indented JSON to `path` atomically."""
    write_bytes_atomically(path, json.dumps(data, indent=2).encode("utf-8"))
