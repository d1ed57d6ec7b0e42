"""Benchmark: how well secret redaction works: recall on fake credentials, false positives on real code.

    python benchmarks/redaction_quality.py [--examples 3] [--reps 3] [--stdlib DIR] [--json FILE]

(a) Recall: every form of tests/support/fake_credentials.py (random values in each provider's
    documented shape, set in the syntax they are found in) is redacted by mat's rules; a form
    counts as redacted when none of its secret text is left and its expected rule fired.
(b) False positives: the Python standard library's source (`sysconfig.get_paths()["stdlib"]`,
    every *.py outside site-packages), which holds no real credentials: the redactions there,
    per rule, with examples, and how many files the pre-filter sends to the rules at all.
(c) Speed: median MB per CPU second of the pre-filter alone and of the whole redaction over
    the stdlib source, in this process (the load average is printed beside them).
(d) detect-secrets (when it is installed): its default plugins on the same two corpora, for
    comparison: recall, findings on the stdlib, and MB/s.

The last line of stdout is the JSON summary (also --json FILE).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import sysconfig
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from multiagenttrainer.corpus.secrets import SCANNER, redact_secrets, relevant_hits  # noqa: E402
from tests.support.fake_credentials import FakeCredential, fake_credentials, secret_texts  # noqa: E402


def stdlib_sources(root: Path) -> list[tuple[str, bytes]]:
    """(relative path, bytes) of every *.py under root outside site-packages / dist-packages."""
    files = []
    for path in sorted(root.rglob("*.py")):
        if not any(part.endswith("-packages") for part in path.relative_to(root).parts):
            files.append((str(path.relative_to(root)), path.read_bytes()))
    return files


def is_redacted(credential: FakeCredential) -> bool:
    """No piece of the secret is left, and the expected rule fired."""
    redacted, counts = redact_secrets(credential.text.encode())
    text = redacted.decode()
    return credential.rule in counts and not any(piece in text for piece in secret_texts(credential))


def recall(credentials: list[FakeCredential]) -> dict[str, Any]:
    """Forms redacted of all forms, and the ones missed."""
    missed = [c for c in credentials if not is_redacted(c)]
    return {
        "forms": len(credentials),
        "providers": len({c.provider for c in credentials}),
        "redacted": len(credentials) - len(missed),
        "recall": round((len(credentials) - len(missed)) / len(credentials), 4),
        "missed": [f"{c.provider} {c.rule} ({c.syntax})" for c in missed],
    }


def redaction_examples(files: list[tuple[str, bytes]], examples: int) -> dict[str, Any]:
    """Redactions over the files: total, per rule, up to `examples` redacted lines per rule."""
    per_rule: Counter[str] = Counter()
    shown: dict[str, list[str]] = defaultdict(list)
    hit_files = 0
    for path, data in files:
        hit_files += bool(relevant_hits(data, SCANNER.find_matches_as_indexes(data)))
        redacted, counts = redact_secrets(data)
        per_rule.update(counts)
        for number, line in enumerate(redacted.splitlines(), 1):
            for rule in counts:
                if f"<REDACTED:{rule}>".encode() in line and len(shown[rule]) < examples:
                    shown[rule].append(f"{path}:{number}: {line.decode(errors='replace').strip()[:120]}")
    return {
        "files": len(files),
        "mb": round(sum(len(d) for _, d in files) / 1e6, 1),
        "files_sent_to_rules": hit_files,
        "redactions": sum(per_rule.values()),
        "by_rule": dict(per_rule.most_common()),
        "examples": dict(shown),
    }


def median_mb_s(files: list[tuple[str, bytes]], work: Any, reps: int) -> float:
    """Median MB per CPU second of work(data) over every file, over reps repetitions (CPU time, so
    that other processes on a shared machine count less)."""
    size = sum(len(d) for _, d in files) / 1e6
    times = []
    for _ in range(reps):
        started = time.process_time()
        for _, data in files:
            work(data)
        times.append(time.process_time() - started)
    return round(size / statistics.median(times), 1)


def detect_secrets_figures(
    credentials: list[FakeCredential], files: list[tuple[str, bytes]], sample: int
) -> dict[str, Any] | None:
    """detect-secrets' default plugins and filters (SecretsCollection.scan_file) on the fake forms
    and on every `sample`-th stdlib file (it reads about 0.05 MB/s); None when it is not installed."""
    try:
        from detect_secrets import SecretsCollection
        from detect_secrets.settings import default_settings
    except ImportError:
        return None
    with tempfile.TemporaryDirectory() as tmp, default_settings():
        found = [c for c in credentials if finds(SecretsCollection, Path(tmp), c)]
        sampled = files[::sample]
        started = time.process_time()
        collection = SecretsCollection()
        for index, (path, data) in enumerate(sampled):
            target = Path(tmp) / f"std{index}" / Path(path).name
            target.parent.mkdir()
            target.write_bytes(data)
            collection.scan_file(str(target))
        seconds = time.process_time() - started
    per_type = Counter(secret.type for _, secret in collection)
    sampled_mb = sum(len(d) for _, d in sampled) / 1e6
    return {
        "recall": round(len(found) / len(credentials), 4),
        "found": len(found),
        "missed": sorted({f"{c.provider} {c.rule} ({c.syntax})" for c in credentials if c not in found}),
        "stdlib_sample_files": len(sampled),
        "stdlib_sample_mb": round(sampled_mb, 1),
        "stdlib_sample_findings": sum(per_type.values()),
        "stdlib_sample_by_type": dict(per_type.most_common()),
        "mb_s": round(sampled_mb / seconds, 3),
    }


def finds(collection_type: Any, tmp: Path, credential: FakeCredential) -> bool:
    """Whether detect-secrets flags the form's file (each holds one secret, so any finding counts)."""
    target = tmp / f"fake{abs(hash(credential.text))}" / credential.filename
    target.parent.mkdir()
    target.write_text(credential.text)
    collection = collection_type()
    collection.scan_file(str(target))
    return any(True for _ in collection)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--examples", type=int, default=3, help="redacted lines shown per rule")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of the speed runs; medians")
    parser.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    parser.add_argument("--seed", type=int, default=20240601, help="seed of the fake credentials")
    parser.add_argument("--no-detect-secrets", action="store_true", help="skip the detect-secrets comparison")
    parser.add_argument("--detect-secrets-sample", type=int, default=10, help="every Nth stdlib file for it")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    credentials = fake_credentials(args.seed)
    files = stdlib_sources(args.stdlib)
    figures: dict[str, Any] = {
        "fake_credentials": recall(credentials),
        "stdlib": redaction_examples(files, args.examples),
        "prefilter_mb_s": median_mb_s(files, SCANNER.find_matches_as_indexes, args.reps),
        "redaction_mb_s": median_mb_s(files, redact_secrets, args.reps),
        "detect_secrets": None
        if args.no_detect_secrets
        else detect_secrets_figures(credentials, files, args.detect_secrets_sample),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    report(figures, args.stdlib)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures))


def report(figures: dict[str, Any], stdlib: Path) -> None:
    """The figures as readable lines."""
    fake, std, ds = figures["fake_credentials"], figures["stdlib"], figures["detect_secrets"]
    print(
        f"recall: {fake['redacted']}/{fake['forms']} forms ({fake['recall']:.1%}), "
        f"{fake['providers']} providers"
    )
    for miss in fake["missed"]:
        print(f"  missed: {miss}")
    print(f"stdlib ({stdlib}): {std['files']} files, {std['mb']} MB")
    print(f"  {std['files_sent_to_rules']} files have pre-filter hits the rules look at")
    print(f"false positives: {std['redactions']} redactions {std['by_rule']}")
    for rule, lines in std["examples"].items():
        for line in lines:
            print(f"  {rule}: {line}")
    print(
        f"speed: pre-filter {figures['prefilter_mb_s']} MB/s, "
        f"whole redaction {figures['redaction_mb_s']} MB/s (load average {figures['load_average_1m']})"
    )
    if ds is not None:
        print(f"detect-secrets: recall {ds['found']}/{fake['forms']} ({ds['recall']:.1%}), {ds['mb_s']} MB/s")
        print(
            f"  stdlib sample: {ds['stdlib_sample_files']} files, "
            f"{ds['stdlib_sample_mb']} MB, {ds['stdlib_sample_findings']} findings "
            f"{ds['stdlib_sample_by_type']}"
        )
        for miss in ds["missed"]:
            print(f"  missed: {miss}")


if __name__ == "__main__":
    main()
