"""Reading a built corpus back: where its corpus.jsonl is, and its records, streamed.

Workspaces (built-in and autoresearch) and both fine-tuning backends read the corpus through
these functions, so a missing or damaged corpus gives the same message everywhere.

Fine-tuning also takes any plain text file (`mat finetune start --corpus notes.txt`). It is cut
into chunks of at most PLAIN_TEXT_CHUNK_CHARS characters at line ends, and the split is a stable
cut: the last PLAIN_TEXT_VAL_FRACTION of the chunks (at least one, when there are two or more) are
validation, the rest training. The same file always gives the same split.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from multiagenttrainer.errors import CorpusError

CORPUS_JSONL = "corpus.jsonl"
CORPUS_TXT = "corpus.txt"
PLAIN_TEXT_CHUNK_CHARS = 4096
PLAIN_TEXT_VAL_FRACTION = 0.1


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


# --------------------------------------------------------------------------- fine-tuning input


def corpus_file(corpus_path: Path) -> Path:
    """What a fine-tuning `--corpus` names: a corpus.jsonl, or a plain text file.

    A corpus folder and mat's own corpus.txt mean the corpus.jsonl beside them (it keeps each
    file's split); a folder with only corpus.txt, and any other file, are plain text.
    """
    path = Path(corpus_path)
    if path.is_dir():
        for name in (CORPUS_JSONL, CORPUS_TXT):
            if (path / name).is_file():
                return path / name
        raise CorpusError(
            f"no {CORPUS_JSONL} or {CORPUS_TXT} in {path}; run `mat ingest` or pass --corpus FILE"
        )
    if path.name == CORPUS_TXT and path.with_name(CORPUS_JSONL).is_file():
        return path.with_name(CORPUS_JSONL)
    if not path.is_file():
        raise CorpusError(f"no corpus at {path}; run `mat ingest` first or pass --corpus PATH")
    return path


def iter_training_records(corpus_path: Path) -> Iterator[dict[str, Any]]:
    """Records with `text` and `split`: corpus.jsonl's, or a plain text file's chunks."""
    file = corpus_file(corpus_path)
    if file.suffix == ".jsonl":
        yield from (record for _, record in iter_corpus_records(file))
    else:
        yield from plain_text_records(file)


def plain_text_records(file: Path) -> list[dict[str, Any]]:
    """The file's chunks as records, the last PLAIN_TEXT_VAL_FRACTION of them in `val`."""
    chunks = chunk_lines(read_plain_text(file), PLAIN_TEXT_CHUNK_CHARS)
    first_val = len(chunks) - val_chunk_count(len(chunks))
    return [{"text": chunk, "split": "val" if i >= first_val else "train"} for i, chunk in enumerate(chunks)]


def val_chunk_count(chunks: int) -> int:
    """How many trailing chunks are validation: the fraction, at least 1, never all of them."""
    if chunks < 2:
        return 0
    return min(chunks - 1, max(1, round(chunks * PLAIN_TEXT_VAL_FRACTION)))


def read_plain_text(file: Path) -> str:
    """The file's text; CorpusError when it cannot be read, is not UTF-8 or holds no text."""
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise CorpusError(
            f"cannot read {file}: {exc.strerror or exc}; check the path and its permissions"
        ) from exc
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CorpusError(
            f"{file} is not UTF-8 text (byte {exc.start} is 0x{data[exc.start]:02x}); "
            "convert it to UTF-8, or pass a corpus.jsonl built by `mat ingest`"
        ) from None
    if not text.strip():
        raise CorpusError(f"{file} holds no text; a plain text corpus needs some")
    return text


def chunk_lines(text: str, limit: int) -> list[str]:
    """The text cut at line ends into chunks of at most `limit` characters (longer lines are cut too)."""
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    for line in text.splitlines(keepends=True):
        for piece in (line[i : i + limit] for i in range(0, len(line), limit)):
            if current and size + len(piece) > limit:
                chunks.append("".join(current))
                current, size = [], 0
            current.append(piece)
            size += len(piece)
    if current:
        chunks.append("".join(current))
    return [chunk for chunk in chunks if chunk.strip()]
