"""Reading a built corpus back: where its corpus.jsonl is, and its records, streamed.

Workspaces (built-in and autoresearch) and both fine-tuning backends read the corpus through
these two functions, so a missing or damaged corpus gives the same message everywhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from multiagenttrainer.errors import CorpusError

CORPUS_JSONL = "corpus.jsonl"


def corpus_jsonl_path(corpus_path: Path) -> Path:
    """corpus.jsonl for a corpus folder, a corpus.jsonl file, or the corpus.txt beside it."""
    path = Path(corpus_path)
    candidate = (
        path / CORPUS_JSONL
        if path.is_dir()
        else (path if path.suffix == ".jsonl" else path.with_name(CORPUS_JSONL))
    )
    if not candidate.is_file():
        raise CorpusError(f"no {CORPUS_JSONL} at {candidate}; run `mat ingest` first or pass --corpus PATH")
    return candidate


def iter_corpus_records(corpus_jsonl: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (index, record) for each non-blank line of corpus.jsonl, streaming."""
    try:
        handle = corpus_jsonl.open("rb")
    except OSError as exc:
        raise CorpusError(f"cannot read {corpus_jsonl}: {exc.strerror}; run `mat ingest` first") from exc
    with handle:
        index = 0
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            yield index, parse_record(line, corpus_jsonl, line_number)
            index += 1


def parse_record(line: bytes, corpus_jsonl: Path, line_number: int) -> dict[str, Any]:
    """Decode one corpus.jsonl line; it must be an object with a string `text`."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise CorpusError(
            f"{corpus_jsonl} line {line_number} is not JSON ({exc}); rebuild with `mat ingest`"
        ) from exc
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise CorpusError(
            f"{corpus_jsonl} line {line_number} has no `text` string; rebuild with `mat ingest`"
        )
    return record
