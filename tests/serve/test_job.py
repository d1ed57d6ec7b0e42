"""`mat serve --job`: a fine-tune job made by mat's open-source backend, served with its adapter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from multiagenttrainer.serve.engine import EngineOptions, ModelSpec
from multiagenttrainer.serve.transformers_engine import TransformersEngine
from tests.support.mat_serve import ServeProcess

pytestmark = pytest.mark.integration

PROMPT = "def handler_3_1(request, limit=1):\n"


def client_for(server: ServeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=60)


def expected_greedy(record: Any, prompt_ids: list[int], max_tokens: int) -> str:
    """The base model with the job's adapter, run in this process through PEFT directly."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(record.model)
    model = PeftModel.from_pretrained(base, record.output_path).eval()
    import torch

    with torch.no_grad():
        output = model.generate(
            input_ids=torch.tensor([prompt_ids]),
            max_new_tokens=max_tokens,
            do_sample=False,
            min_new_tokens=max_tokens,
        )
    tokenizer = AutoTokenizer.from_pretrained(record.output_path)
    return str(tokenizer.decode(output[0, len(prompt_ids) :], skip_special_tokens=True))


def test_the_job_is_served_with_its_adapter(job_server: ServeProcess, finished_job: tuple[Path, Any]) -> None:
    from transformers import AutoTokenizer

    _, record = finished_job
    client = client_for(job_server)
    assert [m.id for m in client.models.list().data] == [record.id]
    assert "engine: transformers (cpu, 1 thread; adapter applied)" in job_server.output

    answer = client.completions.create(
        model=record.id, prompt=PROMPT, max_tokens=10, temperature=0, extra_body={"min_tokens": 10}
    )
    tokenizer = AutoTokenizer.from_pretrained(record.output_path)
    prompt_ids = tokenizer(PROMPT)["input_ids"]
    assert answer.choices[0].text == expected_greedy(record, prompt_ids, 10)


def test_chat_uses_the_job_tokenizers_template(
    job_server: ServeProcess, finished_job: tuple[Path, Any]
) -> None:
    from transformers import AutoTokenizer

    _, record = finished_job
    messages = [{"role": "user", "content": "list the items"}]
    answer = client_for(job_server).chat.completions.create(model=record.id, messages=messages, max_tokens=5)
    tokenizer = AutoTokenizer.from_pretrained(record.output_path)
    templated = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert templated.startswith("<|user|>list the items")
    expected = tokenizer(templated, add_special_tokens=False)["input_ids"]
    assert answer.usage is not None and answer.usage.prompt_tokens == len(expected)


def test_requests_past_the_concurrency_limit_get_429(
    job_server: ServeProcess, finished_job: tuple[Path, Any]
) -> None:
    _, record = finished_job
    client = client_for(job_server)
    long_stream = {"model": record.id, "prompt": "x", "max_tokens": 120, "stream": True}
    refusals: list[openai.RateLimitError] = []
    for _ in range(3):  # two long streams hold both places; a third request meanwhile is refused
        streams = [client.completions.create(**long_stream, extra_body={"min_tokens": 120}) for _ in range(2)]
        try:
            client.completions.create(model=record.id, prompt="x", max_tokens=1)
        except openai.RateLimitError as exc:
            refusals.append(exc)
        for stream in streams:
            assert "".join(c.choices[0].text for c in stream if c.choices)
        if refusals:
            break
    assert refusals, "no request was refused while two streams held both places"
    assert "serve.max_concurrent_requests" in str(refusals[0])
    # the places are given back: the server answers again
    assert client.completions.create(model=record.id, prompt="x", max_tokens=1).choices


def test_merging_the_adapter_once_gives_the_same_model(finished_job: tuple[Path, Any]) -> None:
    import torch

    _, record = finished_job
    spec = ModelSpec(base=record.model, name="m", adapter=Path(record.output_path))
    applied = TransformersEngine(spec, EngineOptions(threads=1))
    merged = TransformersEngine(ModelSpec(spec.base, "m", spec.adapter, merge=True), EngineOptions(threads=1))
    plain = TransformersEngine(ModelSpec(spec.base, "m"), EngineOptions(threads=1))
    assert merged.description.endswith("adapter merged)") and applied.description.endswith("adapter applied)")
    ids = torch.tensor([applied.encode(PROMPT)])
    with torch.no_grad():
        logits = [engine.model(input_ids=ids).logits for engine in (applied, merged, plain)]
    assert torch.allclose(logits[0], logits[1], atol=1e-5)
    assert not torch.allclose(logits[0], logits[2], atol=1e-5)  # the adapter does change the model
