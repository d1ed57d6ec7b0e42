"""write_builtin_data: corpus.jsonl -> data/train.bin and data/val.bin."""

from __future__ import annotations

from pathlib import Path

import pytest

from multiagenttrainer.errors import CorpusError
from multiagenttrainer.workspace.builtin import MIN_TRAIN_BYTES, MIN_VAL_BYTES, write_builtin_data
from tests.workspace.conftest import library_records, write_jsonl


def expected_bytes(records: list[dict[str, str]]) -> bytes:
    return b"".join(f"### {r['repo']}/{r['path']}\n{r['text']}\n".encode() for r in records)


def test_each_split_holds_its_documents_with_a_header_line(library_corpus: Path, tmp_path: Path) -> None:
    records = library_records()
    stats = write_builtin_data(library_corpus, tmp_path / "data")
    train = [r for r in records if r["split"] == "train"]
    val = [r for r in records if r["split"] == "val"]
    assert (tmp_path / "data" / "train.bin").read_bytes() == expected_bytes(train)
    assert (tmp_path / "data" / "val.bin").read_bytes() == expected_bytes(val)
    assert stats == {
        "train_bytes": len(expected_bytes(train)),
        "val_bytes": len(expected_bytes(val)),
        "train_documents": len(train),
        "val_documents": len(val),
        "val_carved_documents": 0,
    }


def test_non_ascii_text_is_written_as_utf8(tmp_path: Path) -> None:
    records = [
        {"repo": "r", "path": f"{i}.md", "split": "train", "text": "héllo ✓ " * 400} for i in range(10)
    ]
    records.append({"repo": "r", "path": "v.md", "split": "val", "text": "naïve " * 300})
    stats = write_builtin_data(write_jsonl(tmp_path / "c.jsonl", records), tmp_path / "data")
    assert (tmp_path / "data" / "val.bin").read_bytes().decode(
        "utf-8"
    ) == "### r/v.md\n" + "naïve " * 300 + "\n"
    assert stats["train_bytes"] == len(expected_bytes(records[:10]))


def test_a_corpus_without_val_split_gets_a_deterministic_carved_val_slice(tmp_path: Path) -> None:
    records = [dict(r, split="train") for r in library_records()]
    first = write_builtin_data(write_jsonl(tmp_path / "a.jsonl", records), tmp_path / "a")
    second = write_builtin_data(write_jsonl(tmp_path / "b.jsonl", records[::-1]), tmp_path / "b")
    assert first["val_carved_documents"] == round(0.1 * len(records)) == second["val_carved_documents"]
    assert first["val_documents"] == first["val_carved_documents"]
    assert "moved to val" in first["note"]
    assert first["val_bytes"] >= MIN_VAL_BYTES and first["train_bytes"] + first["val_bytes"] == len(
        expected_bytes(records)
    )
    # The carved set depends on the documents, not on their order in the file.
    assert headers(tmp_path / "a" / "val.bin") == headers(tmp_path / "b" / "val.bin")


def test_carving_takes_more_documents_until_val_is_big_enough(tmp_path: Path) -> None:
    records = [{"repo": "r", "path": f"{i}.py", "split": "train", "text": "x" * 200} for i in range(120)]
    stats = write_builtin_data(write_jsonl(tmp_path / "c.jsonl", records), tmp_path / "data")
    assert stats["val_bytes"] >= MIN_VAL_BYTES
    assert stats["val_carved_documents"] == 12  # a tenth of 120 documents already exceeds MIN_VAL_BYTES


def headers(path: Path) -> set[bytes]:
    return {line for line in path.read_bytes().split(b"\n") if line.startswith(b"### ")}


def test_records_without_repo_are_named_by_source(tmp_path: Path) -> None:
    records = [{"source": "kb", "path": f"doc{i}", "split": "train", "text": "y" * 4000} for i in range(6)]
    records.append({"source": "kb", "path": "docv", "split": "val", "text": "z" * 2000})
    write_builtin_data(write_jsonl(tmp_path / "c.jsonl", records), tmp_path / "data")
    assert (tmp_path / "data" / "val.bin").read_bytes().startswith(b"### kb/docv\nzzz")


def test_an_empty_corpus_is_refused(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n")
    with pytest.raises(CorpusError, match="holds no documents"):
        write_builtin_data(corpus, tmp_path / "data")
    assert not (tmp_path / "data").exists()


def test_a_corpus_too_small_to_train_on_is_refused(tmp_path: Path) -> None:
    records = [{"repo": "r", "path": f"{i}.py", "split": "train", "text": "x" * 500} for i in range(20)]
    with pytest.raises(CorpusError, match=rf"too small to train on.*need at least {MIN_TRAIN_BYTES}"):
        write_builtin_data(write_jsonl(tmp_path / "c.jsonl", records), tmp_path / "data")


def test_a_single_document_cannot_be_split(tmp_path: Path) -> None:
    records = [{"repo": "r", "path": "big.py", "split": "train", "text": "x" * 100_000}]
    with pytest.raises(CorpusError, match="0 val bytes"):
        write_builtin_data(write_jsonl(tmp_path / "c.jsonl", records), tmp_path / "data")


def test_a_missing_corpus_names_the_file_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match=r"missing\.jsonl.*mat ingest"):
        write_builtin_data(tmp_path / "missing.jsonl", tmp_path / "data")


def test_a_broken_line_is_reported_with_its_number(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"path": "a", "text": "ok"}\n\n{"path": "b", "text": \n')
    with pytest.raises(CorpusError, match="line 3 is not JSON"):
        write_builtin_data(corpus, tmp_path / "data")
    corpus.write_text('{"path": "a", "body": "no text field"}\n')
    with pytest.raises(CorpusError, match="line 1 has no `text` string"):
        write_builtin_data(corpus, tmp_path / "data")


def test_with_a_holdout_dir_the_val_split_stays_out_of_the_workspace(
    library_corpus: Path, tmp_path: Path
) -> None:
    records = library_records()
    train = [r for r in records if r["split"] == "train"]
    stats = write_builtin_data(library_corpus, tmp_path / "data", tmp_path / "holdout")
    holdout = tmp_path / "holdout" / "val.bin"
    assert holdout.read_bytes() == expected_bytes([r for r in records if r["split"] == "val"])
    assert holdout.stat().st_mode & 0o777 == 0o600
    train_bin, dev_bin = (tmp_path / "data" / "train.bin"), (tmp_path / "data" / "val.bin")
    assert headers(dev_bin).isdisjoint(headers(train_bin)) and headers(dev_bin).isdisjoint(headers(holdout))
    assert train_bin.stat().st_size + dev_bin.stat().st_size == len(expected_bytes(train))
    assert stats["dev_documents"] == round(0.1 * len(train)) and stats["dev_bytes"] >= MIN_VAL_BYTES
    assert stats["train_documents"] + stats["dev_documents"] == len(train)
    again = write_builtin_data(library_corpus, tmp_path / "again", tmp_path / "again-holdout")
    assert again == stats and (tmp_path / "again" / "val.bin").read_bytes() == dev_bin.read_bytes()
