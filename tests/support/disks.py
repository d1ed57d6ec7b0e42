"""A small file system of the test's own (a tmpfs it mounts), and filling one up to the last byte."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def mounted_tmpfs(mount: Path, size: str = "48m") -> Iterator[Path]:
    """A tmpfs of `size` at mount (created), unmounted afterwards; the test is skipped without root."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> Path:
    """Fill the file system of `directory` up to the last byte; the filler's path."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for size in (1 << 20, 4096, 512, 1):
            try:
                while os.write(fd, b"\0" * size) == size:
                    pass
            except OSError:
                continue
    finally:
        os.close(fd)
    return filler
