"""Training examples per task and their split: pure functions over corpus records."""

from __future__ import annotations

from multiagenttrainer.request.pairs import (
    code_completion_pairs,
    corpus_examples,
    docs_qa_pairs,
    sections,
    split_examples,
    val_count,
)

CODE = '''import functools


@functools.cache
def area(width, height):
    """Area of a rectangle."""
    return width * height


class Shelf:
    def count(self):
        """How many widgets the shelf holds."""
        total = len(self.items)
        return total

    def undocumented(self):
        return 1

    async def fetch(self):
        """Only a docstring: nothing to complete."""
'''


def record(path: str, text: str) -> dict[str, str]:
    return {"source": "repo", "repo": "acme/widgets", "path": path, "text": text, "split": "train"}


def test_documented_functions_become_signature_and_docstring_to_body_pairs() -> None:
    derived = code_completion_pairs([record("src/shapes.py", CODE), record("notes.md", "# x\n\ny\n")])
    assert (derived.files_read, derived.files_skipped) == (1, 0)
    pairs = {e.prompt: e.completion for e in derived.examples}
    assert pairs == {
        '@functools.cache\ndef area(width, height):\n    """Area of a rectangle."""\n': (
            "    return width * height\n"
        ),
        '    def count(self):\n        """How many widgets the shelf holds."""\n': (
            "        total = len(self.items)\n        return total\n"
        ),
    }
    assert all(e.text == f"{e.prompt}{e.completion}" for e in derived.examples)


def test_python_files_that_do_not_parse_are_counted_and_skipped() -> None:
    derived = code_completion_pairs([record("broken.py", "def f(:\n"), record("ok.py", CODE)])
    assert (derived.files_read, derived.files_skipped, len(derived.examples)) == (2, 1, 2)


def test_markdown_headings_become_heading_to_section_pairs() -> None:
    text = (
        "Intro before any heading.\n\n# Widgets\n\nList them.\n\n## Install\n\n```bash\n# not a heading\n"
        "pip install widgets\n```\n\n## Empty\n\n### Deep\n\nSee load_items.\n"
    )
    assert list(sections(text)) == [
        ("# Widgets", "List them.\n"),
        ("# Widgets > ## Install", "```bash\n# not a heading\npip install widgets\n```\n"),
        ("# Widgets > ## Empty > ### Deep", "See load_items.\n"),
    ]
    derived = docs_qa_pairs([record("README.md", text), record("src/a.py", CODE)])
    assert derived.files_read == 1 and derived.examples[0].prompt == "# Widgets\n\n"


def test_causal_lm_keeps_every_file_with_text() -> None:
    derived = corpus_examples([record("a.py", CODE), record("empty.txt", "  \n")])
    assert [e.text for e in derived.examples] == [CODE]


def test_the_split_is_deterministic_and_an_added_example_moves_no_other() -> None:
    examples = corpus_examples([record(f"f{i}.py", f"x = {i}\n") for i in range(40)]).examples
    first = split_examples(examples, 0.1)
    assert split_examples(list(reversed(examples)), 0.1)[::-1] == first
    assert sum(1 for _, split in first if split == "val") == 4
    grown = split_examples([*examples, *corpus_examples([record("new.py", "y = 1\n")]).examples], 0.1)
    moved = [e.key for (e, a), (_, b) in zip(first, grown, strict=False) if a != b]
    assert len(moved) <= 1  # at most the one example the bigger val share takes in


def test_val_count_holds_one_out_of_two_or_more_and_never_all() -> None:
    assert [val_count(n, 0.1) for n in (0, 1, 2, 3, 10, 11)] == [0, 0, 1, 1, 1, 2]
    assert val_count(2, 0.99) == 1
