"""A small corpus.jsonl made by hand from this repository's own library sources."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
import pytest

import multiagenttrainer

LIBRARY_DIR = Path(multiagenttrainer.__file__).parent


def library_records() -> list[dict[str, Any]]:
    """One corpus record per library .py file; every tenth file (sorted by path) is in the val split."""
    files = sorted(p for p in LIBRARY_DIR.rglob("*.py") if p.stat().st_size > 0)
    return [
        {
            "source": "self",
            "repo": "acme/mat",
            "commit": "0" * 40,
            "path": str(path.relative_to(LIBRARY_DIR.parent)),
            "split": "val" if position % 10 == 0 else "train",
            "text": path.read_text(encoding="utf-8"),
        }
        for position, path in enumerate(files)
    ]


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> Path:
    """Write records as corpus.jsonl lines."""
    path.write_bytes(b"".join(orjson.dumps(record) + b"\n" for record in records))
    return path


@pytest.fixture(scope="session")
def library_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """corpus.jsonl of the library's own sources, with a train and a val split."""
    return write_jsonl(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", library_records())
