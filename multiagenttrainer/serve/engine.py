"""The engine contract: what the HTTP app asks of a model, and the registry of engines that provide it.

An engine holds one loaded model (a base, optionally with a LoRA adapter) and turns token ids into
text: `generate` returns a whole completion, `stream` yields text deltas and then one `Finished`
event; closing the stream's iterator cancels its generation. Engines are thread-safe: the app calls
them from worker threads, several requests at a time. `choose_engine` picks one for this machine:
vLLM where it is installed and a CUDA device is visible, transformers otherwise.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from multiagenttrainer.errors import ServeError

FinishReason = Literal["stop", "length"]
ENGINE_CHOICES = ("auto", "transformers", "vllm")


class RequestRejected(ServeError):
    """The engine cannot take this request as asked (answered 400 with the message)."""


class EngineUnavailable(ServeError):
    """The engine cannot take requests now: shutting down, or its model process died (answered 503)."""


@dataclass(frozen=True)
class ModelSpec:
    """What to serve: a base model (folder or hub id), an optional adapter folder, and the served name."""

    base: str
    name: str
    adapter: Path | None = None
    merge: bool = False  # merge the adapter into the weights once at start instead of applying it


@dataclass(frozen=True)
class EngineOptions:
    """How to run the model: CPU threads (None: torch's default) and whether a GPU may be used."""

    threads: int | None = None
    use_gpu: bool = True


@dataclass(frozen=True)
class SamplingParams:
    """One request's generation settings, already checked against the server's limits."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    min_tokens: int = 0


@dataclass(frozen=True)
class Completion:
    """A finished generation: the text (cut before any stop sequence) and the token counts."""

    text: str
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Delta:
    """A piece of streamed text."""

    text: str


@dataclass(frozen=True)
class Finished:
    """The last event of a stream: why it ended and the token counts."""

    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int


StreamEvent = Delta | Finished


@dataclass(frozen=True)
class ChatPrompt:
    """A chat rendered as one prompt, with the stop sequences its format implies."""

    text: str
    stops: tuple[str, ...] = ()
    templated: bool = False  # the tokenizer's chat template made it (it carries its special tokens)


class Engine(Protocol):
    """A loaded model that generates text; implementations are registered in ENGINES."""

    name: str  # the registry key: "transformers", "vllm"

    @property
    def description(self) -> str:
        """One line for the start-up banner: engine, device and how the adapter is used."""

    @property
    def context_length(self) -> int | None:
        """Most tokens (prompt plus completion) the model takes; None when unknown."""

    @property
    def vocab_size(self) -> int:
        """Token ids run from 0 to vocab_size - 1."""

    def encode(self, text: str, special_tokens: bool = True) -> list[int]:
        """Token ids of a prompt (with the tokenizer's special tokens when special_tokens)."""

    def chat_prompt(self, messages: list[dict[str, str]]) -> ChatPrompt:
        """Messages ({role, content}) as one prompt: the chat template, or a plain format without one."""

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        """A whole completion of the prompt."""

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Generator[StreamEvent, None, None]:
        """Deltas of the completion, then one Finished; closing the iterator stops the generation."""

    def healthy(self) -> bool:
        """Whether the engine can take requests."""

    def shutdown(self) -> None:
        """Refuse new requests and stop generations in flight; returns at once (signal handlers call it)."""

    def close(self) -> None:
        """Release the model and stop any process the engine started (may take seconds)."""


EngineFactory = Callable[[ModelSpec, EngineOptions], Engine]


def tokenizer_source(spec: ModelSpec) -> str:
    """The adapter folder when it carries a tokenizer (fine-tune jobs save one), else the base."""
    if spec.adapter is not None and (spec.adapter / "tokenizer_config.json").is_file():
        return str(spec.adapter)
    return spec.base


def vllm_available() -> bool:
    """Whether the vllm package is installed (it is not imported here)."""
    return importlib.util.find_spec("vllm") is not None


def cuda_available() -> bool:
    """Whether torch sees a CUDA device."""
    import torch

    return bool(torch.cuda.is_available())


def choose_engine(requested: str, options: EngineOptions) -> tuple[str, str]:
    """(engine name, reason) for `--engine auto|transformers|vllm` on this machine."""
    if requested not in ENGINE_CHOICES:
        raise ServeError(f"unknown engine {requested!r}; choose one of {', '.join(ENGINE_CHOICES)}")
    gpu = options.use_gpu and cuda_available()
    if requested == "vllm":
        if not (gpu and vllm_available()):
            raise ServeError(
                "engine vllm needs the vllm package and a CUDA GPU"
                f" ({'vllm is not installed' if gpu else 'no CUDA device is visible'});"
                " use --engine transformers or --engine auto"
            )
        return "vllm", "requested"
    if requested == "transformers":
        return "transformers", "requested"
    if gpu and vllm_available():
        return "vllm", "CUDA and vllm found"
    return "transformers", "vllm is not installed" if gpu else "no CUDA device"


def _transformers() -> EngineFactory:
    from multiagenttrainer.serve.transformers_engine import TransformersEngine

    return TransformersEngine


def _vllm() -> EngineFactory:
    from multiagenttrainer.serve.vllm_engine import VllmEngine

    return VllmEngine


# Engines are imported on first use: torch, transformers and httpx only load for the one chosen.
ENGINES: dict[str, Callable[[], EngineFactory]] = {"transformers": _transformers, "vllm": _vllm}


def make_engine(name: str, spec: ModelSpec, options: EngineOptions) -> Engine:
    """Load the model with the engine registered under `name`."""
    if name not in ENGINES:
        raise ServeError(f"unknown engine {name!r}; registered engines: {', '.join(sorted(ENGINES))}")
    return ENGINES[name]()(spec, options)
