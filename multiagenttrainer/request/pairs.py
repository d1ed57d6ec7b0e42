"""Training examples for each task, derived from corpus records, and their deterministic split.

- causal-lm: every file's text as it is (the loss covers every token);
- code-completion: from each Python file, every function or method with a docstring whose body goes
  on after it: prompt = decorators, signature and docstring; completion = the rest of the body;
- docs-qa: from each Markdown file, every heading with text under it: prompt = the heading (with the
  headings above it), completion = the section up to the next heading.

Files that do not parse are counted and skipped. The split hashes each example's key (source, path
and position), so the same corpus always splits the same way and an added file moves no other example.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import xxhash

PYTHON_SUFFIXES = (".py", ".pyi")
MARKDOWN_SUFFIXES = (".md", ".markdown")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$")
FENCE = re.compile(r"^[ \t]{0,3}(```|~~~)")


@dataclass(frozen=True)
class Example:
    """One training example: its text, and the prompt/completion it is made of for pair tasks."""

    key: str
    text: str
    prompt: str | None = None
    completion: str | None = None

    def record(self, split: str) -> dict[str, Any]:
        record: dict[str, Any] = {"key": self.key, "split": split, "text": self.text}
        if self.prompt is not None:
            record.update(prompt=self.prompt, completion=self.completion)
        return record


@dataclass
class Derived:
    """The examples of one task and what was read to make them."""

    examples: list[Example]
    files_read: int = 0
    files_skipped: int = 0  # did not parse


def record_key(record: dict[str, Any]) -> str:
    return f"{record.get('source', '')}:{record.get('repo', '')}:{record.get('path', '')}"


def suffix_of(record: dict[str, Any]) -> str:
    path = str(record.get("path", ""))
    return path[path.rfind(".") :].lower() if "." in path.rsplit("/", 1)[-1] else ""


# --------------------------------------------------------------------------- causal-lm


def corpus_examples(records: Iterable[dict[str, Any]]) -> Derived:
    """Every record with text, whole."""
    examples = [Example(record_key(r), r["text"]) for r in records if str(r.get("text", "")).strip()]
    return Derived(examples, files_read=len(examples))


# --------------------------------------------------------------------------- code-completion


def code_completion_pairs(records: Iterable[dict[str, Any]]) -> Derived:
    """Signature and docstring -> body, for every documented function of every Python file."""
    derived = Derived([])
    for record in records:
        if suffix_of(record) not in PYTHON_SUFFIXES:
            continue
        derived.files_read += 1
        try:
            tree = ast.parse(record["text"])
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            derived.files_skipped += 1
            continue
        lines = record["text"].splitlines(keepends=True)
        derived.examples += list(function_pairs(tree, lines, record_key(record)))
    return derived


def function_pairs(tree: ast.AST, lines: list[str], key: str) -> Iterator[Example]:
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if ast.get_docstring(node) is None or len(node.body) < 2 or node.end_lineno is None:
            continue
        start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
        docstring_end = node.body[0].end_lineno or node.body[0].lineno
        prompt = "".join(lines[start:docstring_end])
        completion = "".join(lines[docstring_end : node.end_lineno])
        if completion.strip():
            yield Example(f"{key}#{node.lineno}", prompt + completion, prompt, completion)


# --------------------------------------------------------------------------- docs-qa


def docs_qa_pairs(records: Iterable[dict[str, Any]]) -> Derived:
    """Heading -> section, for every heading with text under it in every Markdown file."""
    derived = Derived([])
    for record in records:
        if suffix_of(record) not in MARKDOWN_SUFFIXES:
            continue
        derived.files_read += 1
        for index, (trail, body) in enumerate(sections(record["text"])):
            prompt = trail + "\n\n"
            derived.examples.append(Example(f"{record_key(record)}#{index}", prompt + body, prompt, body))
    return derived


def sections(text: str) -> Iterator[tuple[str, str]]:
    """(heading trail `# A > ## B`, section text) for each heading with text under it; code fences aware."""
    trail: list[tuple[int, str]] = []
    body: list[str] = []
    in_fence = False
    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        heading = None if in_fence else HEADING.match(line)
        if heading is None:
            body.append(line)
            continue
        if trail and "\n".join(body).strip():
            yield render_trail(trail), "\n".join(body).strip() + "\n"
        level = len(heading.group(1))
        trail = [(lvl, title) for lvl, title in trail if lvl < level] + [(level, heading.group(2))]
        body = []
    if trail and "\n".join(body).strip():
        yield render_trail(trail), "\n".join(body).strip() + "\n"


def render_trail(trail: list[tuple[int, str]]) -> str:
    return " > ".join(f"{'#' * level} {title}" for level, title in trail)


# --------------------------------------------------------------------------- split


def val_count(total: int, fraction: float) -> int:
    """How many examples are held out: the fraction rounded up, at least 1 of 2 or more, never all."""
    if total < 2:
        return 0
    return min(total - 1, max(1, math.ceil(total * fraction)))


def split_examples(examples: list[Example], val_fraction: float) -> list[tuple[Example, str]]:
    """(example, "train"|"val") in the examples' order; the val share is chosen by hashing each key."""
    ranked = sorted(examples, key=lambda e: (xxhash.xxh64_hexdigest(e.key.encode()), e.key))
    held_out = {id(e) for e in ranked[: val_count(len(examples), val_fraction)]}
    return [(e, "val" if id(e) in held_out else "train") for e in examples]


DERIVERS = {"causal-lm": corpus_examples, "code-completion": code_completion_pairs, "docs-qa": docs_qa_pairs}
