"""The native corpus accelerators (C, compiled at install), or None where they could not be built.

`encoder()` is the `_encode` module configured with the content-rule constants of filters.py, so
those constants live in one place. The accelerators only ever decide the plain cases (a valid
UTF-8 text file no rule applies to); everything else goes through the Python rules, which stay
the reference, and the corpus is byte-identical either way.

Set MAT_CORPUS_NATIVE=0 to build with the pure-Python paths (to compare, or to rule them out).
"""

from __future__ import annotations

import os
from functools import cache
from types import ModuleType

from multiagenttrainer.corpus import filters

DISABLE_VARIABLE = "MAT_CORPUS_NATIVE"


def native_allowed() -> bool:
    """False when the environment turns the accelerators off."""
    return os.environ.get(DISABLE_VARIABLE, "1").strip().lower() not in ("0", "false", "no", "off")


@cache
def _load_encoder() -> ModuleType | None:
    try:
        from multiagenttrainer.corpus import _encode  # type: ignore[attr-defined]
    except ImportError:
        return None
    _encode.configure(
        binary_sniff=filters.BINARY_SNIFF_BYTES,
        generated_sniff=filters.GENERATED_SNIFF_BYTES,
        long_line=filters.LONG_LINE_CHARS,
        mean_sample=filters.MEAN_LINE_SAMPLE_BYTES,
        mean_min_newlines=filters.MEAN_LINE_MIN_NEWLINES,
        markers=filters.GENERATED_MARKER_HINTS,
    )
    module: ModuleType = _encode
    return module


def encoder() -> ModuleType | None:
    """The configured `_encode` module, or None when it is not built or turned off."""
    return _load_encoder() if native_allowed() else None
