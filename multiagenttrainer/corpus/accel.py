"""The native corpus accelerators (C, compiled at install), or None where they could not be built.

`stat_module()` is the stat loop of directory listings and their snapshots (listing_cache.py uses
it; it decides nothing: which files a walk lists is git's answer either way); `encoder()` the
per-file work, configured with the content-rule constants of filters.py, so those constants live in
one place. The encoder only ever decides the plain cases (a valid UTF-8 text file no rule applies
to); everything else goes through the Python rules, which stay the reference, and the corpus is
byte-identical either way.

Set MAT_CORPUS_NATIVE=0 to build with the pure-Python paths (to compare, or to rule them out).
"""

from __future__ import annotations

import importlib
import os
from functools import cache
from types import ModuleType

from multiagenttrainer.corpus import filters

DISABLE_VARIABLE = "MAT_CORPUS_NATIVE"


def native_allowed() -> bool:
    """False when the environment turns the accelerators off."""
    return os.environ.get(DISABLE_VARIABLE, "1").strip().lower() not in ("0", "false", "no", "off")


@cache
def _native_module(name: str) -> ModuleType | None:
    """A compiled module of this package, or None when it was not built."""
    try:
        return importlib.import_module(f"multiagenttrainer.corpus.{name}")
    except ImportError:
        return None


@cache
def _configured_encoder() -> ModuleType | None:
    module = _native_module("_encode")
    if module is not None:
        module.configure(
            binary_sniff=filters.BINARY_SNIFF_BYTES,
            generated_sniff=filters.GENERATED_SNIFF_BYTES,
            long_line=filters.LONG_LINE_CHARS,
            mean_sample=filters.MEAN_LINE_SAMPLE_BYTES,
            mean_min_newlines=filters.MEAN_LINE_MIN_NEWLINES,
            markers=filters.GENERATED_MARKER_HINTS,
        )
    return module


def encoder() -> ModuleType | None:
    """The configured `_encode` module (native/encode.c), or None when it is not built or turned off."""
    return _configured_encoder() if native_allowed() else None


def stat_module() -> ModuleType | None:
    """The `_statfields` module (native/statfields.c), or None when it is not built or turned off."""
    return _native_module("_statfields") if native_allowed() else None
