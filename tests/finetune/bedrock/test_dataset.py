"""prepare_dataset: corpus.jsonl -> Bedrock JSONL records in S3, within the per-record character limit."""

from __future__ import annotations

import boto3
import pytest

from multiagenttrainer.errors import BackendError, ConfigError, CorpusError
from multiagenttrainer.finetune.bedrock import (
    MULTI_BATCH_CHAR_LIMIT,
    SINGLE_BATCH_CHAR_LIMIT,
    chunk_text,
    prompt_completion,
)
from tests.finetune.bedrock.conftest import BUCKET, REGION, SECRET_KEY, read_jsonl, write_corpus


def long_file(lines: int = 400, width: int = 99) -> str:
    return "".join(f"{n:05d} " + "x" * (width - 7) + "\n" for n in range(lines))


def test_chunk_text_splits_on_line_boundaries_within_the_limit():
    text = long_file(lines=50, width=100)
    chunks = chunk_text(text, 1000)
    assert "".join(chunks) == text
    assert all(len(chunk) <= 1000 for chunk in chunks)
    assert all(chunk.endswith("\n") for chunk in chunks)
    assert len(chunks) == 5


def test_chunk_text_cuts_a_line_longer_than_the_limit_and_drops_blank_text():
    chunks = chunk_text("a" * 2500 + "\nend\n", 1000)
    assert [len(c) for c in chunks] == [1000, 1000, 500 + 1 + 4]
    assert chunk_text("\n\n   \n", 1000) == []


def test_prompt_completion_uses_the_first_quarter_of_lines_as_prompt():
    chunk = "".join(f"line {n}\n" for n in range(8))
    pair = prompt_completion("# File: acme/app/a.py\n", chunk)
    assert pair == {
        "prompt": "# File: acme/app/a.py\nline 0\nline 1\n",
        "completion": "".join(f"line {n}\n" for n in range(2, 8)),
    }
    assert prompt_completion("", "one line only") == {"prompt": "one li", "completion": "ne only"}


def test_continued_pretraining_uploads_input_records_for_train_and_validation(aws, make_tuner, tmp_path):
    big = long_file(lines=400)  # 39,600 characters: more than one record even at batch size 1
    corpus = write_corpus(
        tmp_path / "corpus",
        [
            {"path": "big.py", "split": "train", "text": big},
            {"path": "small.py", "split": "train", "text": "print('hi')\n"},
            {"path": "held.py", "split": "val", "text": "def held():\n    return 1\n"},
        ],
    )
    dataset = make_tuner().prepare_dataset(corpus)

    train = read_jsonl(dataset.details["train_s3_uri"])
    assert all(set(record) == {"input"} for record in train)
    assert all(len(record["input"]) <= SINGLE_BATCH_CHAR_LIMIT for record in train)
    assert "".join(r["input"] for r in train[:-1]) == big
    assert train[-1] == {"input": "print('hi')\n"}
    assert read_jsonl(dataset.details["validation_s3_uri"]) == [{"input": "def held():\n    return 1\n"}]
    assert (dataset.train_records, dataset.val_records) == (len(train), 1)
    assert dataset.location == dataset.details["train_s3_uri"]
    assert dataset.location.startswith(f"s3://{BUCKET}/data/titan-")
    assert dataset.location.endswith("/train.jsonl")
    assert dataset.details["customization_type"] == "CONTINUED_PRE_TRAINING"


def test_a_plain_text_corpus_is_uploaded_with_its_last_tenth_as_validation(aws, make_tuner, tmp_path):
    text = long_file(lines=2000)  # 198,000 characters: 50 chunks of plain text
    corpus = tmp_path / "notes.txt"
    corpus.write_text(text, encoding="utf-8")
    dataset = make_tuner().prepare_dataset(corpus)
    train = read_jsonl(dataset.details["train_s3_uri"])
    val = read_jsonl(dataset.details["validation_s3_uri"])
    assert "".join(r["input"] for r in train + val) == text
    assert val[-1]["input"].endswith("01999 " + "x" * 92 + "\n")  # the end of the file is held out
    assert dataset.val_records == len(val) >= 1 and dataset.train_records == len(train) > len(val)


def test_larger_batches_use_the_smaller_record_limit(aws, make_tuner, tmp_path):
    big = long_file(lines=400)
    corpus = write_corpus(tmp_path / "c", [{"path": "big.py", "split": "train", "text": big}])
    dataset = make_tuner(batch_size=4).prepare_dataset(corpus.parent)
    train = read_jsonl(dataset.location)
    assert dataset.details["record_char_limit"] == MULTI_BATCH_CHAR_LIMIT
    assert len(train) == 4  # 39,600 characters in lines of 99 -> 121 lines (11,979 chars) per record
    assert all(len(r["input"]) <= MULTI_BATCH_CHAR_LIMIT for r in train)
    assert "".join(r["input"] for r in train) == big


def test_fine_tuning_uploads_prompt_completion_records(aws, make_tuner, tmp_path):
    big = long_file(lines=400)
    corpus = write_corpus(tmp_path / "c", [{"path": "src/big.py", "split": "train", "text": big}])
    dataset = make_tuner(customization_type="FINE_TUNING").prepare_dataset(corpus)
    train = read_jsonl(dataset.location)
    header = "# File: acme/app/src/big.py\n"
    assert len(train) >= 2
    assert all(set(r) == {"prompt", "completion"} for r in train)
    assert all(r["prompt"].startswith(header) and r["completion"].strip() for r in train)
    assert all(len(r["prompt"]) + len(r["completion"]) <= SINGLE_BATCH_CHAR_LIMIT for r in train)
    assert "".join(r["prompt"].removeprefix(header) + r["completion"] for r in train) == big
    assert "validation_s3_uri" not in dataset.details
    assert dataset.val_records == 0


def test_missing_training_uri_names_the_setting(aws, make_tuner, tmp_path):
    corpus = write_corpus(tmp_path / "c", [{"path": "a.py", "split": "train", "text": "x = 1\n"}])
    with pytest.raises(ConfigError, match=r"finetuner\.bedrock\.training_data_s3_uri is not set"):
        make_tuner(training_data_s3_uri=None).prepare_dataset(corpus)
    with pytest.raises(
        ConfigError, match=r"finetuner\.bedrock\.training_data_s3_uri: 'bucket/x' is not an S3"
    ):
        make_tuner(training_data_s3_uri="bucket/x").prepare_dataset(corpus)


def test_missing_corpus_and_empty_train_split_are_corpus_errors(aws, make_tuner, tmp_path):
    with pytest.raises(CorpusError, match="run `mat ingest` first"):
        make_tuner().prepare_dataset(tmp_path / "nothing" / "corpus.txt")
    corpus = write_corpus(tmp_path / "c", [{"path": "a.py", "split": "val", "text": "x = 1\n"}])
    with pytest.raises(CorpusError, match="no training text"):
        make_tuner().prepare_dataset(corpus)


def test_a_missing_bucket_is_a_backend_error_with_the_fix(aws, make_tuner, tmp_path):
    corpus = write_corpus(tmp_path / "c", [{"path": "a.py", "split": "train", "text": "x = 1\n"}])
    with pytest.raises(
        BackendError, match="NoSuchBucket.*create the bucket or fix finetuner.bedrock"
    ) as caught:
        make_tuner(training_data_s3_uri="s3://no-such-bucket/data").prepare_dataset(corpus)
    assert SECRET_KEY not in str(caught.value)


def test_no_credentials_fail_with_a_clear_message(clean_aws_env, make_tuner, tmp_path):
    corpus = write_corpus(tmp_path / "c", [{"path": "a.py", "split": "train", "text": "x = 1\n"}])
    with pytest.raises(BackendError, match="no AWS credentials found; set AWS_PROFILE"):
        make_tuner().prepare_dataset(corpus)


def test_objects_land_under_the_prefix(aws, make_tuner, tmp_path):
    corpus = write_corpus(tmp_path / "c", [{"path": "a.py", "split": "train", "text": "x = 1\n"}])
    make_tuner().prepare_dataset(corpus)
    keys = [
        o["Key"] for o in boto3.client("s3", region_name=REGION).list_objects_v2(Bucket=BUCKET)["Contents"]
    ]
    assert len(keys) == 1 and keys[0].startswith("data/titan-") and keys[0].endswith("/train.jsonl")
