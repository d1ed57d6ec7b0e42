"""The transformers engine: a causal LM (plus a PEFT LoRA adapter) in this process, CPU or one GPU.

The adapter is applied on top of the base weights, or merged into them once at start (`merge`).
One generation runs at a time (a lock): requests from several threads queue for the model, which
keeps memory flat and answers correct. Every request gets a fresh GenerationConfig built from its
own settings (OpenAI semantics: temperature 0 is greedy, no top-k), so a model's shipped sampling
defaults never leak in. Streaming runs `generate` in a worker thread that feeds a queue; a stop
sequence, the engine closing, or the consumer going away stop it at the next token.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, StoppingCriteria
from transformers.generation.streamers import BaseStreamer

from multiagenttrainer.errors import ServeError
from multiagenttrainer.serve.engine import (
    ChatPrompt,
    Completion,
    Delta,
    EngineOptions,
    EngineUnavailable,
    Finished,
    FinishReason,
    ModelSpec,
    SamplingParams,
    StreamEvent,
    cuda_available,
    tokenizer_source,
)
from multiagenttrainer.serve.text import IncrementalDecoder, StopScanner, cut_at_stop, render_chat

STOP_WINDOW_TOKENS = 8  # tokens decoded beyond the longest stop sequence when looking for one


# --------------------------------------------------------------------------- loading


def quiet_transformers() -> None:
    """No progress bars or advisory warnings from transformers on a server's terminal."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]


def load_model(spec: ModelSpec, device: str) -> tuple[Any, Any, str]:
    """(tokenizer, model in eval mode on `device`, how the adapter is used); ServeError naming the fix."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_source(spec))
        model = AutoModelForCausalLM.from_pretrained(spec.base, dtype=dtype)
        model, adapter_note = with_adapter(model, spec)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ServeError(
            f"cannot load model {spec.base!r}{adapter_words(spec)}: {first_line(exc)}; check that the folder "
            "holds a saved model (config.json and weights) and that the adapter was trained on this base"
        ) from exc
    return tokenizer, model.to(device).eval(), adapter_note


def with_adapter(model: Any, spec: ModelSpec) -> tuple[Any, str]:
    """The model with the spec's LoRA adapter applied or merged (unchanged without one)."""
    if spec.adapter is None:
        return model, "no adapter"
    from peft import PeftModel

    adapted = PeftModel.from_pretrained(model, str(spec.adapter))
    if spec.merge:
        return adapted.merge_and_unload(), "adapter merged"
    return adapted, "adapter applied"


def adapter_words(spec: ModelSpec) -> str:
    """' with adapter PATH' for messages, or ''."""
    return f" with adapter {spec.adapter}" if spec.adapter is not None else ""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def eos_token_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """Every id that ends a generation: the model's generation config and the tokenizer's EOS."""
    configured = getattr(model.generation_config, "eos_token_id", None)
    ids = set(configured if isinstance(configured, list) else [configured])
    ids.add(tokenizer.eos_token_id)
    return frozenset(i for i in ids if isinstance(i, int))


# --------------------------------------------------------------------------- generation helpers


def generation_config(model: Any, params: SamplingParams, pad_id: int | None) -> Any:
    """A GenerationConfig for one request: its own sampling settings, the model's special tokens."""
    shipped = model.generation_config
    settings: dict[str, Any] = {
        "max_new_tokens": params.max_tokens,
        "min_new_tokens": params.min_tokens or None,
        "do_sample": params.temperature > 0,
        "top_k": 0,
        "eos_token_id": shipped.eos_token_id,
        "bos_token_id": shipped.bos_token_id,
        "pad_token_id": pad_id,
    }
    if params.temperature > 0:
        settings.update(temperature=params.temperature, top_p=params.top_p)
    return GenerationConfig(**settings)  # type: ignore[no-untyped-call]


class StopCriteria(StoppingCriteria):
    """Stops generating at a stop sequence, or when the request or the engine is cancelled."""

    def __init__(
        self, tokenizer: Any, stops: tuple[str, ...], prompt_len: int, events: list[threading.Event]
    ):
        self.tokenizer, self.stops, self.prompt_len, self.events = tokenizer, stops, prompt_len, events
        self.window = max((len(s) for s in stops), default=0) + STOP_WINDOW_TOKENS

    def __call__(
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any
    ) -> torch.BoolTensor:
        stop = any(event.is_set() for event in self.events) or self.stop_sequence_seen(input_ids)
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)  # type: ignore[return-value]

    def stop_sequence_seen(self, input_ids: torch.LongTensor) -> bool:
        """Whether the generated text's tail holds a stop sequence."""
        if not self.stops:
            return False
        start = max(self.prompt_len, input_ids.shape[1] - self.window)
        tail = self.tokenizer.decode(input_ids[0, start:], skip_special_tokens=True)
        return any(stop in tail for stop in self.stops)


class QueueStreamer(BaseStreamer):
    """Receives new token ids from `generate` (the prompt, sent first, is skipped) into a queue."""

    def __init__(self) -> None:
        self.queue: queue.Queue[list[int] | None] = queue.Queue()
        self.prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.queue.put(value.reshape(-1).tolist())

    def end(self) -> None:
        """Nothing: the generation thread closes the queue itself, also when generate fails."""


# --------------------------------------------------------------------------- the engine


class TransformersEngine:
    """A transformers causal LM (with its LoRA adapter) behind a lock; see the module docstring."""

    name = "transformers"

    def __init__(self, spec: ModelSpec, options: EngineOptions) -> None:
        quiet_transformers()
        if options.threads:
            torch.set_num_threads(options.threads)
        self.spec = spec
        self.device = "cuda" if options.use_gpu and cuda_available() else "cpu"
        self.tokenizer, self.model, self.adapter_note = load_model(spec, self.device)
        self.eos_ids = eos_token_ids(self.model, self.tokenizer)
        self.pad_id = (
            self.tokenizer.pad_token_id
            if self.tokenizer.pad_token_id is not None
            else min(self.eos_ids, default=None)
        )
        self._lock = threading.Lock()
        self._tokenizer_lock = threading.Lock()
        self._closing = threading.Event()

    @property
    def description(self) -> str:
        """`transformers (cpu, 2 threads; adapter applied)`."""
        threads = torch.get_num_threads()
        where = f"cpu, {threads} thread{'s' if threads != 1 else ''}" if self.device == "cpu" else self.device
        return f"transformers ({where}; {self.adapter_note})"

    @property
    def context_length(self) -> int | None:
        """The model's max_position_embeddings, when its config has one."""
        value = getattr(self.model.config, "max_position_embeddings", None)
        return value if isinstance(value, int) else None

    @property
    def vocab_size(self) -> int:
        """Rows of the input embedding: the ids the model accepts."""
        return int(self.model.get_input_embeddings().num_embeddings)

    def encode(self, text: str, special_tokens: bool = True) -> list[int]:
        """Token ids of the text; an empty prompt becomes the BOS token where there is one."""
        with self._tokenizer_lock:  # a fast tokenizer may update its settings in place: one caller at a time
            ids: list[int] = self.tokenizer(text, add_special_tokens=special_tokens)["input_ids"]
        if not ids and self.tokenizer.bos_token_id is not None:
            ids = [self.tokenizer.bos_token_id]
        return ids

    def chat_prompt(self, messages: list[dict[str, str]]) -> ChatPrompt:
        """The tokenizer's chat template, or the plain format."""
        return render_chat(self.tokenizer, messages)

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        """A whole completion (waits for the model when another request has it)."""
        generated = self._generate(prompt_ids, params, None, [])
        text, stopped = cut_at_stop(self.tokenizer.decode(generated, skip_special_tokens=True), params.stop)
        reason = self.finish_reason(generated, params, stopped)
        return Completion(text, reason, len(prompt_ids), len(generated))

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Generator[StreamEvent, None, None]:
        """Text deltas as tokens arrive, then Finished; closing the iterator stops the generation."""
        cancel = threading.Event()
        streamer = QueueStreamer()
        worker = GenerationThread(self, prompt_ids, params, streamer, cancel)
        worker.start()
        decoder, scanner = IncrementalDecoder(self.tokenizer), StopScanner(params.stop)
        try:
            while not scanner.stopped and (ids := streamer.queue.get()) is not None:
                if text := scanner.feed(decoder.push(ids)):
                    yield Delta(text)
            cancel.set()  # after a stop sequence; a no-op when generation has ended by itself
            worker.join()
            if worker.error is not None:
                if isinstance(worker.error, ServeError):
                    raise worker.error
                raise EngineUnavailable(f"generation failed: {first_line(worker.error)}") from worker.error
            if tail := (scanner.feed(decoder.flush()) + scanner.flush()):
                yield Delta(tail)
            reason = self.finish_reason(worker.generated, params, scanner.stopped)
            yield Finished(reason, len(prompt_ids), len(worker.generated))
        finally:
            cancel.set()

    def finish_reason(self, generated: list[int], params: SamplingParams, stopped: bool) -> FinishReason:
        """ "length" when max_tokens ran out before an EOS token or a stop sequence, else "stop"."""
        if stopped or (generated and generated[-1] in self.eos_ids):
            return "stop"
        return "length" if len(generated) >= params.max_tokens else "stop"

    def healthy(self) -> bool:
        """Whether the engine still takes requests."""
        return not self._closing.is_set()

    def shutdown(self) -> None:
        """Stop every generation at its next token; later requests are refused."""
        self._closing.set()

    def close(self) -> None:
        """The same as shutdown: the model goes with the process."""
        self._closing.set()

    def _generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        streamer: QueueStreamer | None,
        events: list[threading.Event],
    ) -> list[int]:
        """The generated token ids, under the model lock."""
        inputs = torch.tensor([prompt_ids], device=self.device)
        criteria = StopCriteria(self.tokenizer, params.stop, len(prompt_ids), [self._closing, *events])
        config = generation_config(self.model, params, self.pad_id)
        with self._lock, torch.inference_mode():
            if self._closing.is_set():
                raise EngineUnavailable("the server is shutting down")
            if params.seed is not None:
                torch.manual_seed(params.seed)
            output = self.model.generate(
                input_ids=inputs,
                attention_mask=torch.ones_like(inputs),
                generation_config=config,
                stopping_criteria=[criteria],
                streamer=streamer,
            )
        if self._closing.is_set():  # cut short by a signal: say so rather than answer half a text
            raise EngineUnavailable("the server is shutting down")
        generated: list[int] = output[0, len(prompt_ids) :].tolist()
        return generated


class GenerationThread(threading.Thread):
    """Runs one streamed generation; always closes the streamer's queue, keeping any error."""

    def __init__(
        self,
        engine: TransformersEngine,
        prompt_ids: list[int],
        params: SamplingParams,
        streamer: QueueStreamer,
        cancel: threading.Event,
    ) -> None:
        super().__init__(name="mat-serve-generation", daemon=True)
        self.engine, self.prompt_ids, self.params = engine, prompt_ids, params
        self.streamer, self.cancel = streamer, cancel
        self.generated: list[int] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.generated = self.engine._generate(self.prompt_ids, self.params, self.streamer, [self.cancel])
        except BaseException as exc:  # handed to the consumer, which raises it in the request's thread
            self.error = exc
        finally:
            self.streamer.queue.put(None)
