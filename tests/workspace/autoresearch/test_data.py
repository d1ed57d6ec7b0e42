"""Pure helpers: reading and editing prepare.py, chunking files, writing parquet shards."""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from multiagenttrainer.errors import CorpusError, ExperimentError
from multiagenttrainer.workspace.autoresearch import (
    cache_layout,
    disable_downloads,
    edit_prepare,
    point_cache_at,
    read_constants,
    set_train_time,
)
from multiagenttrainer.workspace.autoresearch_data import (
    chunk_chars_for,
    chunk_document,
    plan_token_budgets,
    split_by_size,
    write_corpus_shards,
    write_shard,
)
from tests.workspace.autoresearch.conftest import source_records, write_jsonl

# The lines of karpathy/autoresearch's prepare.py that mat reads, in their real form.
REAL_PREPARE = """
import os

MAX_SEQ_LEN = 2048       # context length
TIME_BUDGET = 300        # training time budget in seconds (5 minutes)
EVAL_TOKENS = 40 * 524288  # number of tokens for val eval

CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "autoresearch")
DATA_DIR = os.path.join(CACHE_DIR, "data")
TOKENIZER_DIR = os.path.join(CACHE_DIR, "tokenizer")
MAX_SHARD = 6542 # the last datashard is shard_06542.parquet
VAL_SHARD = MAX_SHARD  # pinned validation shard (shard_06542)
VAL_FILENAME = f"shard_{VAL_SHARD:05d}.parquet"
VOCAB_SIZE = 8192
SPECIAL_TOKENS = [f"<|reserved_{i}|>" for i in range(4)]
"""
PREPARE_PY = Path("workspace/prepare.py")


# ---------------------------------------------------------------- prepare.py


def test_constants_are_read_without_running_the_file() -> None:
    constants = read_constants(REAL_PREPARE)
    assert constants["MAX_SEQ_LEN"] == 2048
    assert constants["EVAL_TOKENS"] == 20_971_520
    assert constants["VAL_FILENAME"] == "shard_06542.parquet"
    # ~ is not resolved at set-up, so nothing that depends on it is claimed.
    assert "CACHE_DIR" not in constants and "DATA_DIR" not in constants
    assert "SPECIAL_TOKENS" not in constants


def test_the_cache_dir_line_points_at_the_run(tmp_path: Path) -> None:
    cache = tmp_path / "run" / "cache" / "autoresearch"
    edited = point_cache_at(REAL_PREPARE, cache, PREPARE_PY)
    constants = read_constants(edited)
    assert constants["CACHE_DIR"] == str(cache)
    assert constants["DATA_DIR"] == str(cache / "data")
    assert constants["TOKENIZER_DIR"] == str(cache / "tokenizer")
    assert len(edited.splitlines()) == len(REAL_PREPARE.splitlines())


def test_time_budget_is_set_and_its_stale_comment_replaced() -> None:
    edited = set_train_time(REAL_PREPARE, 45, PREPARE_PY)
    assert read_constants(edited)["TIME_BUDGET"] == 45
    line = next(line for line in edited.splitlines() if line.startswith("TIME_BUDGET"))
    assert line.startswith("TIME_BUDGET = 45  # ") and "5 minutes" not in line


def test_a_value_spread_over_lines_after_non_ascii_text_is_replaced(tmp_path: Path) -> None:
    source = (
        '"""Données: café."""\nimport os\nCACHE_DIR = os.path.join(  # é\n    "~", ".cache"\n)\nAFTER = 1\n'
    )
    edited = point_cache_at(source, tmp_path / "c", PREPARE_PY)
    assert read_constants(edited) == {"CACHE_DIR": str(tmp_path / "c"), "AFTER": 1}
    assert edited.startswith('"""Données: café."""\nimport os\nCACHE_DIR = ')


@pytest.mark.parametrize(
    ("source", "count"),
    [("import os\nCACHE = 1\n", 0), ("CACHE_DIR = 'a'\nCACHE_DIR = 'b'\n", 2)],
)
def test_the_cache_dir_line_must_be_there_exactly_once(source: str, count: int, tmp_path: Path) -> None:
    with pytest.raises(ExperimentError) as caught:
        point_cache_at(source, tmp_path, PREPARE_PY)
    assert f"{PREPARE_PY} has {count} top-level `CACHE_DIR = ...` assignments" in str(caught.value)


def test_edits_keep_the_files_own_line_endings(tmp_path: Path) -> None:
    (tmp_path / "prepare.py").write_bytes(REAL_PREPARE.replace("\n", "\r\n").encode())
    layout = edit_prepare(tmp_path, tmp_path / "cache", 30)
    data = (tmp_path / "prepare.py").read_bytes()
    assert data.count(b"\r\n") == data.count(b"\n") == REAL_PREPARE.count("\n")
    assert (layout.max_seq_len, layout.val_filename) == (2048, "shard_06542.parquet")
    assert layout.data_dir == tmp_path / "cache" / "data"
    assert layout.notes == []


def test_missing_constants_fall_back_to_autoresearch_defaults_with_a_note(tmp_path: Path) -> None:
    layout = cache_layout({"MAX_SEQ_LEN": "long"}, tmp_path)
    assert (layout.max_seq_len, layout.val_filename) == (2048, "shard_06542.parquet")
    assert (layout.data_dir, layout.tokenizer_dir) == (tmp_path / "data", tmp_path / "tokenizer")
    assert len(layout.notes) == 4 and "no readable MAX_SEQ_LEN" in layout.notes[0]


# ---------------------------------------------------------------- chunking


def test_chunk_size_follows_the_sequence_length() -> None:
    assert chunk_chars_for(2048) == 6144
    assert chunk_chars_for(16) == 256  # a header and a few lines still fit


def test_a_short_file_is_one_chunk_with_its_header() -> None:
    assert chunk_document("acme/app/a.py", "x = 1\n", 300) == ["### acme/app/a.py\nx = 1\n"]


def test_a_long_file_is_cut_on_line_boundaries_with_the_header_on_every_part() -> None:
    text = "".join(f"line number {n}\n" for n in range(200))
    chunks = chunk_document("acme/app/long.py", text, 300)
    assert len(chunks) > 5
    bodies = []
    for n, chunk in enumerate(chunks, start=1):
        assert len(chunk) <= 300
        header, body = chunk.split("\n", 1)
        assert header == f"### acme/app/long.py (part {n}/{len(chunks)})"
        assert body.endswith("\n")
        bodies.append(body)
    assert "".join(bodies) == text


def test_a_line_longer_than_a_chunk_is_cut() -> None:
    text = "a" * 1000 + "\nend\n"
    chunks = chunk_document("acme/app/min.js", text, 300)
    assert all(len(chunk) <= 300 for chunk in chunks)
    assert "".join(chunk.split("\n", 1)[1] for chunk in chunks) == text


def test_blank_files_give_no_chunks() -> None:
    assert chunk_document("acme/app/empty.py", " \n\n", 300) == []


def test_split_by_size_bounds_every_group() -> None:
    groups = list(split_by_size(["a" * 40] * 10, 100))
    assert [len(group) for group in groups] == [2, 2, 2, 2, 2]
    assert list(split_by_size(["a" * 500], 100)) == [["a" * 500]]  # one oversized chunk stays whole


# ---------------------------------------------------------------- shards


LIBRARY = Path(__file__).resolve().parents[3] / "multiagenttrainer"


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "corpus.jsonl", source_records(LIBRARY, "acme/mat", 8))


def shard_texts(data_dir: Path) -> dict[str, list[str]]:
    return {path.name: pq.read_table(path).column("text").to_pylist() for path in sorted(data_dir.iterdir())}


def test_train_shards_are_bounded_and_numbered_around_the_val_file(corpus: Path, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    stats = write_corpus_shards(corpus, data_dir, "shard_00001.parquet", 768, shard_max_chars=40_000)
    shards = shard_texts(data_dir)
    train = {name: rows for name, rows in shards.items() if name != "shard_00001.parquet"}
    assert stats.train_shards == len(train) > 3
    expected = [f"shard_{n:05d}.parquet" for n in range(stats.train_shards + 1) if n != 1]
    assert sorted(train) == expected  # the pinned val name is skipped, never overwritten
    assert all(sum(map(len, rows)) <= 40_000 for rows in train.values())
    assert sum(len(rows) for rows in train.values()) == stats.train_chunks
    assert len(shards["shard_00001.parquet"]) == stats.val_chunks


def test_shards_are_deterministic(corpus: Path, tmp_path: Path) -> None:
    write_corpus_shards(corpus, tmp_path / "one", "shard_06542.parquet", 768, 40_000)
    write_corpus_shards(corpus, tmp_path / "two", "shard_06542.parquet", 768, 40_000)
    assert shard_texts(tmp_path / "one") == shard_texts(tmp_path / "two")


def test_rows_are_shuffled_across_files(corpus: Path, tmp_path: Path) -> None:
    write_corpus_shards(corpus, tmp_path / "data", "shard_06542.parquet", 768, 10**9)
    labels = [
        row.split("\n", 1)[0].split(" (part")[0]
        for row in shard_texts(tmp_path / "data")["shard_00000.parquet"]
    ]
    runs = sum(1 for before, after in zip(labels, labels[1:], strict=False) if before != after)
    assert runs > len(set(labels)) * 2  # files are interleaved, not one after the other


def test_row_groups_hold_about_a_thousand_rows(tmp_path: Path) -> None:
    write_shard([f"row {n}" for n in range(2500)], tmp_path / "shard_00000.parquet")
    metadata = pq.ParquetFile(tmp_path / "shard_00000.parquet").metadata
    assert [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)] == [1000, 1000, 500]


def test_leftover_parquet_files_are_removed(corpus: Path, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    for name in ("shard_00000.parquet", "shard_00042.parquet", "shard_00043.parquet.tmp"):
        (data_dir / name).write_bytes(b"leftover")
    (data_dir / "README").write_text("not a shard")
    write_corpus_shards(corpus, data_dir, "shard_06542.parquet", 768, 10**9)
    assert sorted(p.name for p in data_dir.iterdir()) == [
        "README",
        "shard_00000.parquet",
        "shard_06542.parquet",
    ]


def test_a_corpus_of_blank_files_is_refused(tmp_path: Path) -> None:
    records = [
        {"repo": "acme/x", "path": f"{n}.txt", "split": "train", "text": " " * 20_000} for n in range(3)
    ]
    records.append({"repo": "acme/x", "path": "v.txt", "split": "val", "text": " " * 2_000})
    corpus = write_jsonl(tmp_path / "corpus.jsonl", records)
    with pytest.raises(CorpusError, match="no text to train or validate on"):
        write_corpus_shards(corpus, tmp_path / "data", "shard_06542.parquet", 768, 10**9)


def test_download_functions_are_replaced_whole_and_nothing_else() -> None:
    source = (
        "import functools\r\n\r\n"
        "@functools.lru_cache\r\ndef download_single_shard(index):\r\n    return fetch(index)\r\n\r\n"
        "def download_data(n):\r\n    '''Doc.'''\r\n"
        "    for i in range(n):\r\n        download_single_shard(i)\r\n\r\n"
        "def train_tokenizer():\r\n    return 1\r\n"
    )
    edited, names = disable_downloads(source)
    assert names == ["download_data", "download_single_shard"]
    assert "lru_cache" not in edited and "fetch(" not in edited and edited.count("\r\n") == edited.count("\n")
    assert edited.endswith("def train_tokenizer():\r\n    return 1\r\n")
    namespace: dict[str, object] = {}
    exec(compile(edited, "prepare.py", "exec"), namespace)
    with pytest.raises(RuntimeError, match="downloads are disabled in this workspace by mat"):
        namespace["download_data"](3)  # type: ignore[operator]
    assert disable_downloads("X = 1\n") == ("X = 1\n", [])


def count_utf8_bytes(texts: Path, counts: Path) -> None:
    """A byte-level tokenizer (one token per UTF-8 byte), through the TokenCounter file contract."""
    lines = texts.read_bytes().splitlines()
    counts.write_text("".join(f"{len(orjson.loads(line).encode('utf-8'))}\n" for line in lines))


def test_documents_with_a_row_over_the_token_limit_are_cut_finer_until_every_row_fits(
    corpus: Path, tmp_path: Path
) -> None:
    records = [orjson.loads(line) for line in corpus.read_bytes().splitlines()]
    wide = "".join(f"ÉTÉ_{n} = '{'é' * 400}'\n" for n in range(5))  # 2 bytes a character, long lines
    records.append({**records[1], "path": "wide.py", "bytes": len(wide.encode()), "text": wide})
    source = write_jsonl(tmp_path / "wide.jsonl", records)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    plan = plan_token_budgets(source, 768, 300, count_utf8_bytes, scratch)
    assert plan.over_limit == 0 and len(plan.budgets) > 0
    assert all(budget < 768 for budget in plan.budgets.values())
    stats = write_corpus_shards(source, tmp_path / "data", "shard_00009.parquet", 768, 10**7, plan)
    rows = [row for texts in shard_texts(tmp_path / "data").values() for row in texts]
    assert max(len(row.encode("utf-8")) for row in rows) <= 300
    assert stats.train_tokens + stats.val_tokens == sum(len(row.encode("utf-8")) + 1 for row in rows)
