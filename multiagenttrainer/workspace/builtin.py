"""Set up the built-in autoresearch workspace: byte-level training data and the template files.

The template (prepare.py, train.py, program.md under `template/`) follows the autoresearch contract:
prepare.py is fixed and holds the evaluation, train.py is what an agent edits, and a run prints the
`---` summary block. This module only writes files; it never runs training.

    corpus.jsonl --write_builtin_data--> data/train.bin, data/val.bin   (UTF-8 bytes, one token per byte)
    template/    --render_template-----> prepare.py (TIME_BUDGET set), train.py, program.md

For a run, write_builtin_data gets a holdout directory outside the workspace: the corpus's val split goes
there (mat scores the checkpoint on it) and data/val.bin becomes a dev split cut from the train documents,
which train.py scores itself on.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, BinaryIO

import xxhash

from multiagenttrainer.corpus.records import iter_corpus_records
from multiagenttrainer.errors import ConfigError, CorpusError, ExperimentError

TEMPLATE_FILES = ("prepare.py", "train.py", "program.md")
MIN_TRAIN_BYTES = 16 * 1024  # below this a run overfits within seconds and val_bpb means little
MIN_VAL_BYTES = 1024  # below this the val split is topped up from train documents (see carve_val)
VAL_CARVE_FRACTION = 0.1  # share of train documents moved to val when the val split is too small
VAL_SPLITS = frozenset({"val", "validation"})
_TIME_BUDGET_LINE = re.compile(r"^TIME_BUDGET = \d+(?=\s)", re.MULTILINE)


@dataclass(frozen=True)
class DocumentInfo:
    """What the first pass over corpus.jsonl keeps of one record: no text."""

    index: int
    key: str
    size: int
    is_val: bool


# ---------------------------------------------------------------- reading corpus.jsonl


def document_label(record: dict[str, Any]) -> str:
    """`repo/path` (or `source/path` when the record has no repo) naming one document."""
    owner = record.get("repo") or record.get("source") or "corpus"
    return f"{owner}/{record.get('path') or ''}".rstrip("/")


def document_bytes(record: dict[str, Any]) -> bytes:
    """A document as written to the .bin files: a header line naming it, its text, a separating newline."""
    header = f"### {document_label(record)}\n"
    text: str = record["text"]
    return (header + text + "\n").encode("utf-8", errors="replace")


def scan_corpus(corpus_jsonl: Path) -> list[DocumentInfo]:
    """First pass: size, split and a stable key of every document."""
    return [
        DocumentInfo(
            index, document_label(record), len(document_bytes(record)), record.get("split") in VAL_SPLITS
        )
        for index, record in iter_corpus_records(corpus_jsonl)
    ]


# ---------------------------------------------------------------- splitting


def carve_order(doc: DocumentInfo) -> tuple[int, int]:
    """Sort key independent of the order of corpus.jsonl: a hash of the document's name, then its size."""
    return xxhash.xxh64_intdigest(doc.key.encode("utf-8")), doc.size


def carve_val(documents: list[DocumentInfo]) -> set[int]:
    """Train documents to move to val: the highest-hash tenth, more until val holds MIN_VAL_BYTES."""
    train = sorted((doc for doc in documents if not doc.is_val), key=carve_order, reverse=True)
    wanted = max(1, round(VAL_CARVE_FRACTION * len(train)))
    val_bytes = sum(doc.size for doc in documents if doc.is_val)
    carved: set[int] = set()
    for doc in train[:-1]:  # always leave at least one document to train on
        if len(carved) >= wanted and val_bytes >= MIN_VAL_BYTES:
            break
        carved.add(doc.index)
        val_bytes += doc.size
    return carved


def check_sizes(corpus_jsonl: Path, train_bytes: int, val_bytes: int) -> None:
    """Raise CorpusError when either split is too small to train or evaluate on."""
    if train_bytes == 0 and val_bytes == 0:
        raise CorpusError(
            f"{corpus_jsonl} holds no documents; check the sources and filters, then `mat ingest`"
        )
    if train_bytes < MIN_TRAIN_BYTES or val_bytes < MIN_VAL_BYTES:
        raise CorpusError(
            f"{corpus_jsonl} is too small to train on: {train_bytes} train and {val_bytes} val bytes "
            f"(need at least {MIN_TRAIN_BYTES} and {MIN_VAL_BYTES}); add sources or widen `corpus.include`"
        )


# ---------------------------------------------------------------- public API


def write_builtin_data(corpus_jsonl: Path, data_dir: Path, holdout_dir: Path | None = None) -> dict[str, Any]:
    """Write data_dir/train.bin and data_dir/val.bin from corpus.jsonl; return byte and document counts.

    With `holdout_dir`, the corpus's val split goes to holdout_dir/val.bin instead (mat scores on it and it
    never enters the workspace), and data_dir/val.bin holds a dev split cut from the train documents, which
    train.py scores itself on (see write_holdout_data).
    """
    if holdout_dir is not None:
        return write_holdout_data(corpus_jsonl, data_dir, holdout_dir)
    documents = scan_corpus(corpus_jsonl)
    val_indexes, carved, val_bytes = val_split(documents)
    train_bytes = sum(doc.size for doc in documents if doc.index not in val_indexes)
    check_sizes(corpus_jsonl, train_bytes, sum(doc.size for doc in documents if doc.index in val_indexes))
    data_dir.mkdir(parents=True, exist_ok=True)
    written = stream_splits(
        corpus_jsonl,
        {"train": data_dir / "train.bin", "val": data_dir / "val.bin"},
        lambda index: "val" if index in val_indexes else "train",
    )
    stats: dict[str, Any] = {
        "train_bytes": written["train"],
        "val_bytes": written["val"],
        "train_documents": len(documents) - len(val_indexes),
        "val_documents": len(val_indexes),
        "val_carved_documents": len(carved),
    }
    if carved:
        stats["note"] = (
            f"val held {val_bytes} bytes, so {len(carved)} train documents (chosen by hash) were moved to val"
        )
    return stats


def val_split(documents: list[DocumentInfo]) -> tuple[set[int], set[int], int]:
    """(val document indexes, those carved from train, bytes the corpus's own val split held)."""
    val_bytes = sum(doc.size for doc in documents if doc.is_val)
    carved = carve_val(documents) if val_bytes < MIN_VAL_BYTES else set()
    return {doc.index for doc in documents if doc.is_val} | carved, carved, val_bytes


def write_holdout_data(corpus_jsonl: Path, data_dir: Path, holdout_dir: Path) -> dict[str, Any]:
    """Three splits: train and dev (a hash-chosen tenth of the train documents) in data_dir, the corpus's
    val split (topped up from train like write_builtin_data's) as holdout_dir/val.bin."""
    documents = scan_corpus(corpus_jsonl)
    holdout, carved, _ = val_split(documents)
    dev = carve_val([doc for doc in documents if doc.index not in holdout])
    sizes = {"train": 0, "dev": 0, "holdout": 0}
    for doc in documents:
        sizes["holdout" if doc.index in holdout else "dev" if doc.index in dev else "train"] += doc.size
    check_sizes(corpus_jsonl, sizes["train"], min(sizes["dev"], sizes["holdout"]))
    data_dir.mkdir(parents=True, exist_ok=True)
    holdout_dir.mkdir(parents=True, exist_ok=True)
    targets = {
        "train": data_dir / "train.bin",
        "dev": data_dir / "val.bin",
        "holdout": holdout_dir / "val.bin",
    }
    written = stream_splits(
        corpus_jsonl,
        targets,
        lambda index: "holdout" if index in holdout else "dev" if index in dev else "train",
    )
    os.chmod(targets["holdout"], 0o600)
    return {
        **{f"{split}_bytes": count for split, count in written.items()},
        "train_documents": len(documents) - len(holdout) - len(dev),
        "dev_documents": len(dev),
        "holdout_documents": len(holdout),
        "holdout_carved_documents": len(carved),
    }


def stream_splits(
    corpus_jsonl: Path, targets: dict[str, Path], split_of: Callable[[int], str]
) -> dict[str, int]:
    """Second pass: append each document's bytes to the file of its split; return the bytes per split."""
    counts = dict.fromkeys(targets, 0)
    with contextlib.ExitStack() as stack:
        handles: dict[str, BinaryIO] = {
            split: stack.enter_context(path.open("wb")) for split, path in targets.items()
        }
        for index, record in iter_corpus_records(corpus_jsonl):
            split = split_of(index)
            counts[split] += handles[split].write(document_bytes(record))
    return counts


def render_template(workspace: Path, train_time_s: int, program_md: Path | None) -> None:
    """Copy the template into `workspace`, set TIME_BUDGET, and use `program_md` as program.md when given."""
    if train_time_s < 1:
        raise ConfigError(f"autoresearch.train_time must be at least 1 second, got {train_time_s}")
    if program_md is not None and not program_md.is_file():
        raise ConfigError(
            f"autoresearch.program_md: {program_md} is not a file; fix the path or remove the key"
        )
    workspace.mkdir(parents=True, exist_ok=True)
    template = resources.files("multiagenttrainer.workspace") / "template"
    for name in TEMPLATE_FILES:
        (workspace / name).write_bytes((template / name).read_bytes())
    prepare = workspace / "prepare.py"
    prepare.write_text(set_time_budget(prepare.read_text(encoding="utf-8"), train_time_s), encoding="utf-8")
    if program_md is not None:
        shutil.copyfile(program_md, workspace / "program.md")


def set_time_budget(prepare_source: str, train_time_s: int) -> str:
    """Rewrite the single `TIME_BUDGET = <n>` line of prepare.py; the rest of the file is unchanged."""
    updated, count = _TIME_BUDGET_LINE.subn(f"TIME_BUDGET = {train_time_s}", prepare_source)
    if count != 1:
        raise ExperimentError(
            f"the workspace template's prepare.py has {count} `TIME_BUDGET = <seconds>` lines, expected 1; "
            "reinstall multiagenttrainer"
        )
    return updated
