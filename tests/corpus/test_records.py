"""What a fine-tuning `--corpus` may name (corpus.jsonl, a corpus folder, any plain text file) and how
plain text is cut into records and split; broken input is a CorpusError saying what to do."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from multiagenttrainer.corpus.records import (
    PLAIN_TEXT_CHUNK_CHARS,
    chunk_lines,
    corpus_file,
    iter_training_records,
    val_chunk_count,
)
from multiagenttrainer.errors import CorpusError


def write_corpus(folder: Path, with_jsonl: bool = True) -> Path:
    """A corpus folder like `mat ingest` writes: corpus.txt, and corpus.jsonl unless told otherwise."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "corpus.txt").write_text("=== repo/a.py\nprint(1)\n", encoding="utf-8")
    if with_jsonl:
        record = {"source": "repo", "path": "a.py", "split": "val", "text": "print(1)\n"}
        (folder / "corpus.jsonl").write_text(json.dumps(record) + "\n", encoding="utf-8")
    return folder


def test_a_corpus_folder_and_its_corpus_txt_mean_the_jsonl(tmp_path: Path) -> None:
    folder = write_corpus(tmp_path / "corpus")
    assert corpus_file(folder) == corpus_file(folder / "corpus.txt") == folder / "corpus.jsonl"
    assert list(iter_training_records(folder / "corpus.txt"))[0]["split"] == "val"  # the jsonl's own split


def test_corpus_txt_without_jsonl_and_any_other_file_are_plain_text(tmp_path: Path) -> None:
    folder = write_corpus(tmp_path / "corpus", with_jsonl=False)
    notes = tmp_path / "notes.md"
    notes.write_text("# notes\n", encoding="utf-8")
    assert corpus_file(folder) == folder / "corpus.txt"
    assert corpus_file(folder / "corpus.txt") == folder / "corpus.txt"
    assert list(iter_training_records(notes)) == [{"text": "# notes\n", "split": "train"}]


def test_plain_text_is_cut_at_line_ends_and_the_last_tenth_is_validation(tmp_path: Path) -> None:
    lines = [f"line {i:05d} " + "x" * 90 + "\n" for i in range(2000)]  # 100 characters each
    file = tmp_path / "big.txt"
    file.write_text("".join(lines), encoding="utf-8")
    records = list(iter_training_records(file))
    assert "".join(r["text"] for r in records) == "".join(lines)
    assert all(len(r["text"]) <= PLAIN_TEXT_CHUNK_CHARS and r["text"].endswith("\n") for r in records)
    splits = [r["split"] for r in records]
    val = splits.count("val")
    assert val == round(len(records) * 0.1) and splits == ["train"] * (len(records) - val) + ["val"] * val
    assert list(iter_training_records(file)) == records  # the same file, the same split


@pytest.mark.parametrize(("chunks", "val"), [(0, 0), (1, 0), (2, 1), (9, 1), (20, 2), (1000, 100)])
def test_the_validation_share_never_takes_everything(chunks: int, val: int) -> None:
    assert val_chunk_count(chunks) == val


def test_a_line_longer_than_a_chunk_is_cut() -> None:
    assert chunk_lines("a" * 10 + "\nb\n", 4) == ["aaaa", "aaaa", "aa\n", "b\n"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", r"holds no text; a plain text corpus needs some"),
        (b" \n\t\n", r"holds no text"),
        (b"caf\xe9 au lait\n", r"is not UTF-8 text \(byte 3 is 0xe9\); convert it to UTF-8"),
        (b"\xff\xfeh\x00i\x00", r"is not UTF-8 text \(byte 0 is 0xff\)"),
    ],
)
def test_broken_plain_text_says_what_is_wrong(content: bytes, message: str, tmp_path: Path) -> None:
    file = tmp_path / "corpus.txt"
    file.write_bytes(content)
    with pytest.raises(CorpusError, match=rf"^{re.escape(str(file))} {message}"):
        list(iter_training_records(file))


def test_an_unreadable_file_and_a_folder_without_a_corpus(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match=r"cannot read /proc/self/mem: Input/output error"):
        list(iter_training_records(Path("/proc/self/mem")))
    with pytest.raises(CorpusError, match=rf"no corpus.jsonl or corpus.txt in {tmp_path}"):
        corpus_file(tmp_path)
    with pytest.raises(CorpusError, match="run `mat ingest` first or pass --corpus PATH"):
        corpus_file(tmp_path / "missing.txt")
