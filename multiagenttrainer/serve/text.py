"""Text around generation, the same for every engine: chat prompts, stop sequences, streamed decoding.

- `render_chat`: the tokenizer's chat template when it has one; otherwise a plain `Role: content`
  format whose next-turn markers become stop sequences, so the model does not write the user's turn.
- `cut_at_stop` / `StopScanner`: OpenAI's `stop` semantics (the text ends before the first stop
  sequence, which is not returned); the scanner holds back a tail that could still become one, so a
  stream never shows a stop sequence even when it arrives split across tokens.
- `IncrementalDecoder`: token ids in, printable text out, never half a UTF-8 character.
"""

from __future__ import annotations

from typing import Any

from multiagenttrainer.serve.engine import ChatPrompt, RequestRejected

PLAIN_ROLES = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant"}
PLAIN_STOPS = ("\nUser:", "\nSystem:")
REPLACEMENT_CHAR = "\ufffd"


# --------------------------------------------------------------------------- chat prompts


def render_chat(tokenizer: Any, messages: list[dict[str, str]]) -> ChatPrompt:
    """Messages as one prompt: the tokenizer's chat template, or the plain format without one."""
    if getattr(tokenizer, "chat_template", None):
        return ChatPrompt(apply_template(tokenizer, messages), templated=True)
    return ChatPrompt(render_plain(messages), stops=PLAIN_STOPS)


def apply_template(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The chat template's text with the assistant's turn opened; RequestRejected if it refuses."""
    from jinja2 import TemplateError

    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except (TemplateError, ValueError, TypeError, KeyError) as exc:
        raise RequestRejected(f"the model's chat template rejected these messages: {exc}") from exc
    return str(text)


def render_plain(messages: list[dict[str, str]]) -> str:
    """`System: ...`, `User: ...`, `Assistant: ...` lines, ending with an open `Assistant:` turn."""
    lines = [f"{PLAIN_ROLES.get(m['role'], m['role'].capitalize())}: {m['content']}" for m in messages]
    return "\n".join([*lines, "Assistant:"])


# --------------------------------------------------------------------------- stop sequences


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """The text before the earliest stop sequence, and whether one was found."""
    hits = [i for i in (text.find(stop) for stop in stops if stop) if i >= 0]
    return (text[: min(hits)], True) if hits else (text, False)


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest tail of `text` that is the start of some stop sequence."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


class StopScanner:
    """Streams text through, ending it before the first stop sequence (which is never emitted)."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """The part of the text so far that is safe to emit; sets `stopped` at a stop sequence."""
        if self.stopped:
            return ""
        self.pending += text
        before, hit = cut_at_stop(self.pending, self.stops)
        if hit:
            self.pending, self.stopped = "", True
            return before
        keep = held_back(self.pending, self.stops)
        ready, self.pending = (
            self.pending[: len(self.pending) - keep],
            self.pending[len(self.pending) - keep :],
        )
        return ready

    def flush(self) -> str:
        """What was held back, at the end of the stream."""
        rest, self.pending = ("" if self.stopped else self.pending), ""
        return rest


# --------------------------------------------------------------------------- streamed decoding


class IncrementalDecoder:
    """Decodes a growing list of token ids into text deltas, holding back incomplete characters.

    Each step decodes the tokens since `prefix` (a few already-printed ones give the tokenizer the
    context it needs for spaces) and emits what goes beyond the text printed from them so far.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0
        self.read = 0

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def push(self, token_ids: list[int]) -> str:
        """New printable text after these tokens ('' while a character is still incomplete)."""
        self.ids.extend(token_ids)
        printed = self._decode(self.ids[self.prefix : self.read])
        current = self._decode(self.ids[self.prefix :])
        if len(current) <= len(printed) or current.endswith(REPLACEMENT_CHAR):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return current[len(printed) :]

    def flush(self) -> str:
        """Whatever is left at the end, incomplete characters included."""
        printed = self._decode(self.ids[self.prefix : self.read])
        current = self._decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return current[len(printed) :]
