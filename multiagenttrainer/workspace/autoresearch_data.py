"""Turn corpus.jsonl into the parquet shards that autoresearch's prepare.py reads.

autoresearch's loader takes every `*.parquet` in DATA_DIR except VAL_FILENAME as training data, reads the
single string column `text` one row group at a time, and treats each row as one document. It packs
documents into rows of MAX_SEQ_LEN + 1 tokens and throws away the tail of a document that fits nowhere,
so files are cut into chunks of bounded size, each headed by the file's name:

    corpus.jsonl --scan--> val documents (the corpus's split, or a hash-chosen tenth)
                 --chunk--> spill files (train chunks spread by hash; val in one)
                 --shuffle--> shard_00000.parquet ... (train), VAL_FILENAME (val)
"""

from __future__ import annotations

import math
import random
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from multiagenttrainer.atomic import write_atomically
from multiagenttrainer.corpus.records import iter_corpus_records
from multiagenttrainer.errors import CorpusError
from multiagenttrainer.workspace.builtin import (
    MIN_VAL_BYTES,
    carve_val,
    check_sizes,
    document_label,
    scan_corpus,
)

# Rows are first cut at CHARS_PER_TOKEN characters per token (the tokenizer is trained on those shards);
# then, with the trained tokenizer, every row is counted and documents with a row over MAX_SEQ_LEN tokens
# are cut again, finer (plan_token_budgets), and the shards are written again.
# Bytes-per-token estimate behind the first chunk size. autoresearch retrains an 8192-entry BPE on the
# injected corpus. Measured while writing this: such a byte-level BPE (HF tokenizers) trained on 2,000
# Python files averaged 3.5 characters per token on 2,000 other files. Assuming 3 leaves headroom, so most
# chunks of MAX_SEQ_LEN * 3 characters already fit one packed row of MAX_SEQ_LEN + 1 tokens; the best-fit
# packer crops a document that fits nowhere and throws its tail away, hence the recount.
CHARS_PER_TOKEN = 3
MIN_CHUNK_CHARS = 256  # floor for forks with a tiny MAX_SEQ_LEN: a header plus a few lines must fit
HEADER_PREFIX = "### "  # same header form as the built-in workspace's data
PART_SUFFIX_RESERVE = 24  # room for " (part 12/34)" after the file name
SHARD_MAX_CHARS = 32_000_000  # text per train shard (~10 MB of parquet): several bounded files
ROW_GROUP_ROWS = 1000  # rows per parquet row group; the loaders read one row group at a time


# ---------------------------------------------------------------- chunking documents


def chunk_chars_for(max_seq_len: int) -> int:
    """Most characters in one parquet row: MAX_SEQ_LEN tokens at CHARS_PER_TOKEN characters each."""
    return max(MIN_CHUNK_CHARS, max_seq_len * CHARS_PER_TOKEN)


def chunk_document(label: str, text: str, max_chars: int) -> list[str]:
    """Split a file on line boundaries into chunks of at most `max_chars`, each headed by its name."""
    if not text.strip():
        return []
    header = f"{HEADER_PREFIX}{label[: max_chars // 4]}"
    budget = max_chars - len(header) - PART_SUFFIX_RESERVE - 1  # - 1 for the header's newline
    pieces = list(pack_lines(text, budget))
    if len(pieces) == 1:
        return [f"{header}\n{pieces[0]}"]
    return [f"{header} (part {n}/{len(pieces)})\n{piece}" for n, piece in enumerate(pieces, start=1)]


def pack_lines(text: str, budget: int) -> Iterator[str]:
    """Consecutive whole lines joined into pieces of at most `budget` characters; longer lines are cut."""
    piece: list[str] = []
    size = 0
    for line in text.splitlines(keepends=True):
        for part in (line[i : i + budget] for i in range(0, len(line), budget)):
            if size + len(part) > budget and piece:
                yield "".join(piece)
                piece, size = [], 0
            piece.append(part)
            size += len(part)
    if piece:
        yield "".join(piece)


# ---------------------------------------------------------------- cutting by token count

# (texts.jsonl, counts.txt): count the tokens of each JSON string of the first file with the workspace's
# tokenizer, one count per line in the second (autoresearch.py runs it in the workspace's interpreter)
TokenCounter = Callable[[Path, Path], None]
MAX_RECUT_ROUNDS = 6
MIN_RECUT_CHARS = 128  # smallest budget a recount may give: a header (a quarter at most) and some text
RECUT_MARGIN = 0.9  # a new budget aims a little under the limit: the count is not linear in characters


@dataclass
class TokenPlan:
    """How to cut each document so that every row fits MAX_SEQ_LEN tokens, measured with the tokenizer."""

    budgets: dict[int, int] = field(default_factory=dict)  # documents given a smaller character budget
    tokens: dict[int, int] = field(default_factory=dict)  # tokens of a document's rows, one BOS per row
    over_limit: int = 0  # rows still longer than the limit at the smallest budget (MIN_RECUT_CHARS)


def plan_token_budgets(
    corpus_jsonl: Path, chunk_chars: int, max_tokens: int, counter: TokenCounter, scratch: Path
) -> TokenPlan:
    """Count every row's tokens; cut the documents that have a row over `max_tokens` again, finer, and
    count those again, until every row fits (or the budget reaches MIN_RECUT_CHARS)."""
    plan = TokenPlan()
    pending: set[int] | None = None  # None: every document
    for round_number in range(MAX_RECUT_ROUNDS):
        counts = count_chunk_tokens(corpus_jsonl, plan, chunk_chars, pending, counter, scratch)
        last_round = round_number == MAX_RECUT_ROUNDS - 1
        pending = {i for i, c in counts.items() if rebudget(plan, i, c, chunk_chars, max_tokens, last_round)}
        if not pending:
            break
    return plan


def rebudget(
    plan: TokenPlan, index: int, rows: list[tuple[int, int]], chunk_chars: int, max_tokens: int, last: bool
) -> bool:
    """Record a document's (tokens, characters) per row; when a row has too many tokens, give the document
    a budget that fits that row's characters per token. True: count it again."""
    plan.tokens[index] = sum(tokens for tokens, _ in rows) + len(rows)
    tokens, chars = max(rows, default=(0, 0))
    budget = plan.budgets.get(index, chunk_chars)
    if tokens <= max_tokens or budget <= MIN_RECUT_CHARS or last:
        plan.over_limit += sum(1 for tokens, _ in rows if tokens > max_tokens)
        return False
    fitting = int(min(budget, chars) * max_tokens / tokens * RECUT_MARGIN)
    plan.budgets[index] = max(MIN_RECUT_CHARS, min(fitting, budget - 1))
    return True


def count_chunk_tokens(
    corpus_jsonl: Path,
    plan: TokenPlan,
    chunk_chars: int,
    only: set[int] | None,
    counter: TokenCounter,
    scratch: Path,
) -> dict[int, list[tuple[int, int]]]:
    """{document index: (tokens, characters) of each of its rows} for the documents in `only` (None: all)."""
    texts, counts_path = scratch / "texts.jsonl", scratch / "counts.txt"
    owners: list[tuple[int, int]] = []  # (document index, characters) per row
    with texts.open("wb") as handle:
        for index, record in iter_corpus_records(corpus_jsonl):
            if only is None or index in only:
                budget = plan.budgets.get(index, chunk_chars)
                for chunk in chunk_document(document_label(record), record["text"], budget):
                    handle.write(orjson.dumps(chunk) + b"\n")
                    owners.append((index, len(chunk)))
    counter(texts, counts_path)
    counts = [int(line) for line in counts_path.read_text(encoding="utf-8").split()]
    if len(counts) != len(owners):
        raise CorpusError(f"the tokenizer counted {len(counts)} of {len(owners)} rows ({counts_path})")
    by_document: dict[int, list[tuple[int, int]]] = {}
    for (index, chars), count in zip(owners, counts, strict=True):
        by_document.setdefault(index, []).append((count, chars))
    return by_document


# ---------------------------------------------------------------- writing the shards


@dataclass
class ShardStats:
    """What write_corpus_shards wrote."""

    train_shards: int = 0
    train_documents: int = 0
    val_documents: int = 0
    val_carved_documents: int = 0
    train_chunks: int = 0
    val_chunks: int = 0
    train_chars: int = 0
    val_chars: int = 0
    train_tokens: int = 0  # with a TokenPlan: the train rows' tokens, one BOS each (0: not counted)
    val_tokens: int = 0


def choose_val_documents(corpus_jsonl: Path) -> tuple[set[int], int, ShardStats]:
    """(val document indexes, train bytes, counts): the corpus's own val split, or a hash-chosen tenth.

    The same choice as the built-in workspace makes (builtin.carve_val), by a hash of repo/path.
    """
    documents = scan_corpus(corpus_jsonl)
    val = {doc.index for doc in documents if doc.is_val}
    carved = carve_val(documents) if sum(d.size for d in documents if d.is_val) < MIN_VAL_BYTES else set()
    val |= carved
    train_bytes = sum(doc.size for doc in documents if doc.index not in val)
    check_sizes(corpus_jsonl, train_bytes, sum(doc.size for doc in documents if doc.index in val))
    counts = ShardStats(
        train_documents=len(documents) - len(val), val_documents=len(val), val_carved_documents=len(carved)
    )
    return val, train_bytes, counts


def write_corpus_shards(
    corpus_jsonl: Path,
    data_dir: Path,
    val_filename: str,
    chunk_chars: int,
    shard_max_chars: int,
    plan: TokenPlan | None = None,
) -> ShardStats:
    """Replace every parquet file in `data_dir` with the corpus: train shards plus the pinned val shard.

    Chunks are spread over the train shards by hash and shuffled within each shard (deterministically),
    because autoresearch's loader reads files in order: without this a whole repository would arrive
    in one stretch of training. Files are staged in a spill directory, so memory holds one shard at most.
    `plan` (cut by token count) gives some documents a smaller budget than `chunk_chars`, and the tokens.
    """
    plan = plan or TokenPlan()
    val_indexes, train_bytes, stats = choose_val_documents(corpus_jsonl)
    train_buckets = max(1, math.ceil(train_bytes / shard_max_chars))
    remove_parquet_files(data_dir)
    with tempfile.TemporaryDirectory(prefix="spill-", dir=data_dir) as spill_dir:
        spills = [Path(spill_dir) / f"{n}.jsonl" for n in range(train_buckets + 1)]  # last one: val
        handles = [path.open("wb") for path in spills]
        try:
            for index, record in iter_corpus_records(corpus_jsonl):
                is_val = index in val_indexes
                budget = plan.budgets.get(index, chunk_chars)
                chunks = chunk_document(document_label(record), record["text"], budget)
                _count_tokens(stats, is_val, plan.tokens.get(index, 0))
                for part, chunk in enumerate(chunks):
                    bucket = train_buckets if is_val else _bucket(record, part, train_buckets)
                    handles[bucket].write(orjson.dumps(chunk) + b"\n")
                    _count_chunk(stats, is_val, len(chunk))
        finally:
            for handle in handles:
                handle.close()
        stats.train_shards = write_train_shards(spills[:-1], data_dir, val_filename, shard_max_chars)
        write_shard(read_spill(spills[-1], seed=train_buckets), data_dir / val_filename)
    if stats.train_chunks == 0 or stats.val_chunks == 0:
        raise CorpusError(
            f"{corpus_jsonl} gave no text to train or validate on; rebuild it with `mat ingest`"
        )
    return stats


def _bucket(record: dict[str, Any], part: int, buckets: int) -> int:
    return xxhash.xxh64_intdigest(f"{document_label(record)}#{part}".encode()) % buckets


def _count_tokens(stats: ShardStats, is_val: bool, tokens: int) -> None:
    if is_val:
        stats.val_tokens += tokens
    else:
        stats.train_tokens += tokens


def _count_chunk(stats: ShardStats, is_val: bool, chars: int) -> None:
    if is_val:
        stats.val_chunks += 1
        stats.val_chars += chars
    else:
        stats.train_chunks += 1
        stats.train_chars += chars


def read_spill(path: Path, seed: int) -> list[str]:
    """The chunks staged in one spill file, in a shuffled order that depends only on `seed`."""
    with path.open("rb") as handle:
        chunks: list[str] = [orjson.loads(line) for line in handle]
    random.Random(seed).shuffle(chunks)
    return chunks


def write_train_shards(spills: list[Path], data_dir: Path, val_filename: str, shard_max_chars: int) -> int:
    """shard_00000.parquet, shard_00001.parquet, ... of at most `shard_max_chars` each; return how many."""
    names = (name for n in range(10**5) if (name := f"shard_{n:05d}.parquet") != val_filename)
    written = 0
    for seed, spill in enumerate(spills):
        for group in split_by_size(read_spill(spill, seed), shard_max_chars):
            write_shard(group, data_dir / next(names))
            written += 1
    return written


def split_by_size(chunks: list[str], max_chars: int) -> Iterator[list[str]]:
    """Consecutive groups of chunks holding at most `max_chars` characters (or one larger chunk)."""
    group: list[str] = []
    size = 0
    for chunk in chunks:
        if group and size + len(chunk) > max_chars:
            yield group
            group, size = [], 0
        group.append(chunk)
        size += len(chunk)
    if group:
        yield group


def write_shard(chunks: list[str], path: Path) -> None:
    """One parquet file with a single string column `text`, one chunk per row, ~1k rows per row group."""
    table = pa.table({"text": pa.array(chunks, type=pa.string())})
    # written beside the shard under a dot name autoresearch's *.parquet glob never matches
    write_atomically(path, lambda handle: pq.write_table(table, handle, row_group_size=ROW_GROUP_ROWS))


def remove_parquet_files(data_dir: Path) -> None:
    """Delete every parquet file (and half-written temp file) in data_dir: leftovers would be trained on."""
    data_dir.mkdir(parents=True, exist_ok=True)
    for path in data_dir.iterdir():
        half_written = path.name.endswith(".parquet.tmp") or (  # older runs' staging files, and
            path.name.startswith(".") and ".parquet." in path.name  # atomic.py's temp files
        )
        if path.is_file() and (path.name.endswith(".parquet") or half_written):
            path.unlink()
