"""Hostile YAML shared by the config tests (library and CLI)."""

from __future__ import annotations

# Nine levels of nine aliases: 9**9 (387 million) values once expanded, in ten short lines.
ALIAS_BOMB = "l0: &l0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10)
)
