"""Read the `---` summary block that an autoresearch-style train.py prints at the end of a run.

    ---
    val_bpb:          0.997900
    training_seconds: 300.1
    ...

The parser is pure: it takes the log text and returns numbers. A run that printed no block, or a
block without a finite `val_bpb`, produced no usable result: the parser returns None and the
harness records the experiment as a crash.
"""

from __future__ import annotations

import math
import re

SEPARATOR = "---"
REQUIRED_KEY = "val_bpb"
_ENTRY = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*):\s+(\S+)\s*$")
_INTEGER = re.compile(r"^[+-]?\d+$")


def parse_number(text: str) -> int | float | None:
    """`953` -> 953, `0.9979` -> 0.9979, `nan` -> nan; None when the text is not a number."""
    if _INTEGER.match(text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return None


def read_block(lines: list[str]) -> dict[str, int | float]:
    """The numeric `key: value` entries at the top of `lines`, up to the first line that is not one."""
    entries: dict[str, int | float] = {}
    for line in lines:
        match = _ENTRY.match(line.strip())
        if match is None:
            break
        value = parse_number(match.group(2))
        if value is not None:  # a non-numeric entry is ignored, not an end of the block
            entries[match.group(1)] = value
    return entries


def parse_run_summary(log_text: str) -> dict[str, int | float] | None:
    """Entries of the last `---` block in `log_text`; None unless it holds a finite `val_bpb`."""
    lines = log_text.splitlines()  # also splits on \r, which progress lines may use
    for position in range(len(lines) - 1, -1, -1):
        if lines[position].strip() != SEPARATOR:
            continue
        entries = read_block(lines[position + 1 :])
        if entries:
            value = entries.get(REQUIRED_KEY)
            return entries if value is not None and math.isfinite(value) else None
    return None
