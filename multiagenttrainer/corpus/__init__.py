"""The corpus: walking, filtering, dedupe, secret redaction, train/val split, and the writers.

    build_corpus(snapshots, options, Path("corpus/corpus.txt"))  # + corpus.jsonl, stats.json

Modules, in the order data flows through them:
    ignore.py    include/exclude globs (gitignore syntax)
    gitview.py   what git lists in a directory: .gitignore rules are git's own answer
    walk.py      the directory walk over git's listing, and the fingerprint local sources use as version
    listing_cache.py  snapshots of a walk, so an unchanged tree is checked by stat, not walked
    filters.py   path and content rules, each a named skip reason
    plan.py      listing every tree (dir, git, docs) into the files to read
    secrets.py   secret redaction rules behind a literal pre-filter
    secret_formats.py  provider token formats (prefixes, lengths) the redaction rules use
    chunks.py    the per-file hot loop, run in worker processes
    accel.py     the C accelerators (native/statfields.c, native/encode.c) when they are built
    assemble.py  stitching chunks together in order, cross-chunk dedupe, atomic outputs
    stats.py     stats.json
    builder.py   build_corpus: reuse when unchanged, else plan, run chunks, assemble
"""

from multiagenttrainer.corpus.assemble import CorpusPaths
from multiagenttrainer.corpus.builder import CORPUS_FORMAT, build_corpus, corpus_fingerprint, reusable_stats
from multiagenttrainer.corpus.ignore import GlobSet, PathSelector
from multiagenttrainer.corpus.secrets import RULES, redact_secrets
from multiagenttrainer.corpus.walk import (
    DirListing,
    WalkEvent,
    directory_fingerprint,
    list_directory,
    walk_events,
)

__all__ = [
    "CORPUS_FORMAT",
    "RULES",
    "CorpusPaths",
    "DirListing",
    "GlobSet",
    "PathSelector",
    "build_corpus",
    "corpus_fingerprint",
    "directory_fingerprint",
    "redact_secrets",
    "reusable_stats",
    "WalkEvent",
    "list_directory",
    "walk_events",
]
