"""Fixtures for the experiment tests: a small corpus directory shared by the session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.experiments import library_records, write_corpus_dir


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """corpus.jsonl + corpus.txt built from the library's own sources."""
    return write_corpus_dir(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def tiny_corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A corpus small enough that evaluating the built-in template takes a fraction of a second.

    About 40 KB of training text and one validation file of 1.5-4 KB.
    """
    records = sorted(library_records(), key=lambda r: len(r["text"]))
    val = next(r for r in records if len(r["text"]) >= 1500)
    train = [r for r in records if r is not val and len(r["text"]) < 8000][-8:]
    for record in train:
        record["split"] = "train"
    val["split"] = "val"
    return write_corpus_dir(tmp_path_factory.mktemp("tiny-corpus"), [*train, val])
