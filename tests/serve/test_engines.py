"""Choosing an engine, and the vLLM engine's real code path with an OpenAI-compatible child server.

vLLM needs CUDA, which this machine lacks; its engine is driven here with `mat serve` itself as the
child (same OpenAI endpoints, same `/health`), started, supervised and stopped by the engine exactly
as it would start, supervise and stop `vllm.entrypoints.openai.api_server`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from multiagenttrainer.errors import ServeError
from multiagenttrainer.processes import pid_alive
from multiagenttrainer.serve.engine import (
    Delta,
    EngineOptions,
    Finished,
    ModelSpec,
    SamplingParams,
    choose_engine,
    cuda_available,
    vllm_available,
)
from multiagenttrainer.serve.transformers_engine import TransformersEngine
from multiagenttrainer.serve.vllm_engine import ADAPTER_NAME, VllmEngine, max_lora_rank, vllm_command

PROMPT = "def handler_2_3(request, limit=3):\n"


def test_vllm_command_serves_the_adapter_as_a_lora_module(finished_job: tuple[Path, Any]) -> None:
    _, record = finished_job
    spec = ModelSpec(base=record.model, name="job", adapter=Path(record.output_path))
    command = vllm_command(spec, 8123)
    assert command[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert command[command.index("--model") + 1] == record.model
    assert command[command.index("--host") + 1] == "127.0.0.1" and "8123" in command
    assert "--enable-lora" in command
    assert command[command.index("--lora-modules") + 1] == f"{ADAPTER_NAME}={record.output_path}"
    assert command[command.index("--max-lora-rank") + 1] == "8"  # the job's r=4, rounded up to vLLM's 8
    merged = vllm_command(ModelSpec(spec.base, "job", spec.adapter, merge=True), 8123)
    assert "--enable-lora" not in merged


def test_max_lora_rank_rounds_up_to_a_value_vllm_accepts() -> None:
    assert [max_lora_rank(r) for r in (1, 8, 9, 16, 17, 300, 999)] == [8, 8, 16, 16, 32, 320, 512]


@pytest.mark.skipif(cuda_available() and vllm_available(), reason="this machine can run vLLM")
def test_engine_choice_without_vllm_or_cuda() -> None:
    name, reason = choose_engine("auto", EngineOptions())
    assert name == "transformers" and reason in ("no CUDA device", "vllm is not installed")
    with pytest.raises(ServeError, match="vllm package and a CUDA GPU"):
        choose_engine("vllm", EngineOptions())
    assert choose_engine("transformers", EngineOptions()) == ("transformers", "requested")


def mat_serve_launcher(config: Path) -> Any:
    """Start `mat serve` where vLLM's server would start, answering to the same model name."""

    def launch(spec: ModelSpec, port: int) -> list[str]:
        command = [sys.executable, "-m", "multiagenttrainer.cli", "serve", "--model", spec.base]
        if spec.adapter is not None:
            command += ["--adapter", str(spec.adapter)]
        name = ADAPTER_NAME if spec.adapter is not None else "base"
        return [*command, "--name", name, "--port", str(port), "--config", str(config), "--no-access-log"]

    return launch


@pytest.mark.integration
def test_the_vllm_engine_drives_and_stops_its_child_server(
    finished_job: tuple[Path, Any], tmp_path: Path
) -> None:
    _, record = finished_job
    config = tmp_path / "mat.yaml"
    config.write_text("serve: {max_tokens: 64}\n", encoding="utf-8")
    spec = ModelSpec(base=record.model, name=record.id, adapter=Path(record.output_path))
    local = TransformersEngine(spec, EngineOptions(threads=1))
    engine = VllmEngine(spec, EngineOptions(), launcher=mat_serve_launcher(config))
    try:
        assert engine.healthy() and engine.context_length == 128 and engine.vocab_size == local.vocab_size
        assert "LoRA adapter via --enable-lora" in engine.description
        ids = engine.encode(PROMPT)
        params = SamplingParams(max_tokens=12, temperature=0, min_tokens=12)
        expected = local.generate(ids, params)
        assert engine.generate(ids, params) == expected
        events = list(engine.stream(ids, params))
        assert "".join(e.text for e in events if isinstance(e, Delta)) == expected.text
        assert events[-1] == Finished("length", len(ids), 12)
        stopped = engine.generate(
            ids, SamplingParams(max_tokens=12, temperature=0, stop=(expected.text[4:6],))
        )
        assert (
            stopped.finish_reason == "stop"
            and stopped.text == expected.text[: expected.text.index(expected.text[4:6])]
        )
    finally:
        engine.close()
    assert engine.process is not None and engine.process.returncode == 0  # SIGTERM: mat serve exits 0
    assert not pid_alive(engine.process.pid) and not engine.healthy()
    assert not engine.workdir.exists()
