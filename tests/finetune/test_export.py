"""`mat finetune export`: a finished job's adapter, or its merged model, loadable by transformers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from multiagenttrainer.serve.models import spec_from_paths
from tests.finetune.conftest import mat

pytestmark = pytest.mark.integration

TEXT = "def handler_5_2(request, limit=2):\n    items = load_items(request)\n"


def logits_of(model: Any, tokenizer: Any) -> Any:
    import torch

    with torch.no_grad():
        return model(**tokenizer(TEXT, return_tensors="pt")).logits


@pytest.fixture(scope="module")
def reference(finished_job: tuple[Path, Any]) -> tuple[Any, Any, Any]:
    """(tokenizer, logits of base + adapter through PEFT, logits of the base alone) on TEXT."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, record = finished_job
    tokenizer = AutoTokenizer.from_pretrained(record.output_path)
    base_logits = logits_of(AutoModelForCausalLM.from_pretrained(record.model).eval(), tokenizer)
    adapted = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(record.model), record.output_path
    )
    return tokenizer, logits_of(adapted.eval(), tokenizer), base_logits


def test_export_of_the_adapter(
    finished_job: tuple[Path, Any], reference: tuple[Any, Any, Any], tmp_path: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    config, record = finished_job
    output = tmp_path / "adapter"
    result = mat("finetune", "export", record.id, "--output", str(output), "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert f"exported the adapter of job {record.id} to {output}" in result.stdout
    files = {p.name for p in output.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "tokenizer.json"} <= files
    assert json.loads((output / "adapter_config.json").read_text())["base_model_name_or_path"] == record.model
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no staging folder left

    tokenizer, adapted_logits, _ = reference
    loaded = AutoModelForCausalLM.from_pretrained(output).eval()  # transformers applies the adapter (PEFT)
    assert torch.allclose(logits_of(loaded, tokenizer), adapted_logits, atol=1e-5)

    spec = spec_from_paths(str(output))  # `mat serve --model <adapter export>` finds the base by itself
    assert spec.adapter == output.resolve() and spec.base == record.model


def test_export_merged(
    finished_job: tuple[Path, Any], reference: tuple[Any, Any, Any], tmp_path: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config, record = finished_job
    output = tmp_path / "merged"
    output.mkdir()  # an empty folder is fine
    result = mat("finetune", "export", record.id, "--merge", "--output", str(output), "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert "exported the merged model" in result.stdout
    files = {p.name for p in output.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= files
    assert not any(name.startswith("adapter_") for name in files)

    tokenizer, adapted_logits, base_logits = reference
    merged = AutoModelForCausalLM.from_pretrained(output).eval()
    assert type(merged).__name__ == "LlamaForCausalLM"
    assert torch.allclose(logits_of(merged, tokenizer), adapted_logits, atol=1e-5)
    assert not torch.allclose(adapted_logits, base_logits, atol=1e-5)  # the adapter changed the model
    assert AutoTokenizer.from_pretrained(output)(TEXT)["input_ids"] == tokenizer(TEXT)["input_ids"]


def test_export_refuses_a_used_folder_and_unknown_jobs(
    finished_job: tuple[Path, Any], tmp_path: Path
) -> None:
    config, record = finished_job
    (tmp_path / "keep.txt").write_text("mine", encoding="utf-8")
    used = mat("finetune", "export", record.id, "--output", str(tmp_path), "--config", str(config))
    assert used.returncode == 2 and "is not an empty folder; choose a new folder" in used.stderr
    assert (tmp_path / "keep.txt").read_text() == "mine"
    unknown = mat(
        "finetune", "export", "no-such-job", "--output", str(tmp_path / "x"), "--config", str(config)
    )
    assert unknown.returncode == 1 and "no fine-tuning job 'no-such-job'" in unknown.stderr
