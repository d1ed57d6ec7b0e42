"""Chat prompts, stop sequences and streamed decoding, on the tiny tokenizers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multiagenttrainer.serve.engine import RequestRejected
from multiagenttrainer.serve.text import (
    IncrementalDecoder,
    StopScanner,
    cut_at_stop,
    render_chat,
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_cut_at_stop_ends_before_the_earliest_stop() -> None:
    assert cut_at_stop("alpha beta gamma", ("gamma", " beta")) == ("alpha", True)
    assert cut_at_stop("alpha", ("", "zeta")) == ("alpha", False)


def scan(pieces: list[str], stops: tuple[str, ...]) -> str:
    scanner = StopScanner(stops)
    emitted = "".join(scanner.feed(piece) for piece in pieces)
    return emitted + scanner.flush()


def test_a_stop_split_across_pieces_is_never_emitted() -> None:
    assert scan(["ab", "c<", "/s", ">tail"], ("</s>",)) == "abc"
    assert scan(["ab", "c<", "/x"], ("</s>",)) == "abc</x"  # held back, then released


@given(
    st.text(alphabet="ab<>/s", max_size=40),
    st.lists(st.integers(0, 40), max_size=6),
    st.text("ab<>/s", min_size=1, max_size=4),
)
def test_streamed_stops_match_the_whole_text(text: str, cuts: list[int], stop: str) -> None:
    points = sorted({0, len(text), *(min(c, len(text)) for c in cuts)})
    pieces = [text[a:b] for a, b in zip(points, points[1:], strict=False)]
    assert scan(pieces, (stop,)) == cut_at_stop(text, (stop,))[0]


def test_incremental_decoding_never_splits_a_character(tokenizer: Any) -> None:
    text = "def naïve(): return 'häßlich ✓ 漢字'  # ok"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    decoder = IncrementalDecoder(tokenizer)
    deltas = [decoder.push([token]) for token in ids]
    deltas.append(decoder.flush())
    assert "".join(deltas) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in delta for delta in deltas)


def test_plain_chat_format_without_a_template(tokenizer: Any) -> None:
    prompt = render_chat(tokenizer, [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}])
    assert prompt.text == "System: S\nUser: hi\nAssistant:"
    assert not prompt.templated and "\nUser:" in prompt.stops


def test_the_chat_template_when_the_tokenizer_has_one(chat_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(chat_model_dir)
    prompt = render_chat(tokenizer, [{"role": "user", "content": "hi"}])
    assert prompt.text == "<|user|>hi</s><|assistant|>"
    assert prompt.templated and prompt.stops == ()


def test_a_template_that_refuses_the_messages_is_a_rejected_request(chat_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(chat_model_dir)
    tokenizer.chat_template = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    )
    with pytest.raises(RequestRejected, match="user first"):
        render_chat(tokenizer, [{"role": "assistant", "content": "hi"}])
