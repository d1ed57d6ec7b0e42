"""The Data agent: the request's sources, the licenses of what was fetched, and the training set.

The corpus itself is built by the ingest stage (ingest.py) into `<request>/corpus/`, from the sources
the request names (all configured ones by default) and its repositories. This module then names each
fetched tree's license (sources/licenses.py), derives the task's examples from corpus.jsonl
(pairs.py), splits them deterministically and writes `<request>/data/dataset.jsonl` (records with
`text` and `split`, which the fine-tuning backend reads like a corpus) and data.json with the counts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from multiagenttrainer.atomic import write_atomically, write_json_atomically
from multiagenttrainer.config import Config, SourceConfig
from multiagenttrainer.corpus.records import corpus_jsonl_path, iter_corpus_records
from multiagenttrainer.errors import ConfigError
from multiagenttrainer.request.pairs import DERIVERS, split_examples
from multiagenttrainer.request.schema import RequestSpec
from multiagenttrainer.snapshot import Snapshot
from multiagenttrainer.sources.licenses import detect_licenses
from multiagenttrainer.sources.registry import repo_argument_to_source, unique_names

DATA_JSON = "data.json"
DATASET = "data/dataset.jsonl"
CORPUS_DIR = "corpus"


@dataclass
class DataReport:
    """What the Data agent built: counts of files, examples and characters per split, and licenses."""

    task: str
    corpus_dir: str
    dataset: str
    files: int = 0
    files_read: int = 0
    files_skipped: int = 0
    examples: int = 0
    train: int = 0
    val: int = 0
    train_chars: int = 0
    val_chars: int = 0
    licenses: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------- the request's sources


def request_sources(cfg: Config, spec: RequestSpec, repos: tuple[str, ...] = ()) -> list[SourceConfig]:
    """The configured sources the request names (all when it names none), plus its repositories."""
    names = unique_names(list(cfg.sources))
    chosen: list[SourceConfig] = list(cfg.sources)
    if spec.data.sources is not None:
        unknown = [n for n in spec.data.sources if n not in names]
        if unknown:
            valid = ", ".join(names) or "none are configured"
            raise ConfigError(
                f"data.sources: no configured source named {', '.join(unknown)}; sources: {valid}"
            )
        chosen = [s for s, n in zip(cfg.sources, names, strict=True) if n in spec.data.sources]
    return chosen + [repo_argument_to_source(r, cfg.github) for r in (*spec.data.repos, *repos)]


def source_tokens(sources: list[SourceConfig], env: Mapping[str, str]) -> dict[str, str | None]:
    """Each source's token (for GitHub API license look-ups), by the name the ingest gives it."""
    return {
        name: env.get(token_env) if isinstance(token_env := getattr(s, "token_env", None), str) else None
        for s, name in zip(sources, unique_names(sources), strict=True)
    }


# --------------------------------------------------------------------------- the training set


def write_dataset(path: Path, rows: list[dict[str, Any]]) -> None:
    def write(handle: IO[bytes]) -> None:
        for row in rows:
            handle.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))

    write_atomically(path, write)


def prepare_data(
    folder: Path,
    spec: RequestSpec,
    ingest_summary: dict[str, Any],
    cfg: Config,
    tokens: Mapping[str, str | None],
) -> DataReport:
    """Licenses, examples and split for the request, written to data/dataset.jsonl and data.json."""
    corpus_dir = Path(ingest_summary["corpus_dir"])
    records = [record for _, record in iter_corpus_records(corpus_jsonl_path(corpus_dir))]
    derived = DERIVERS[spec.task](records)
    rows = [
        example.record(split) for example, split in split_examples(derived.examples, cfg.corpus.val_fraction)
    ]
    dataset = folder / DATASET
    write_dataset(dataset, rows)
    snapshots = [Snapshot.from_dict(s) for s in ingest_summary.get("snapshots", [])]
    report = DataReport(
        task=spec.task,
        corpus_dir=str(corpus_dir),
        dataset=str(dataset),
        files=len(records),
        files_read=derived.files_read,
        files_skipped=derived.files_skipped,
        examples=len(rows),
        licenses=[f.to_dict() for f in detect_licenses(snapshots, cfg.github, tokens)],
    )
    for row in rows:
        size = len(row["text"])
        if row["split"] == "val":
            report.val, report.val_chars = report.val + 1, report.val_chars + size
        else:
            report.train, report.train_chars = report.train + 1, report.train_chars + size
    report.notes += [f"{f['source']}: {f['error']}" for f in ingest_summary.get("failures", [])]
    write_json_atomically(folder / DATA_JSON, report.to_dict())
    return report
