"""The open-source backend on a tiny local Llama: LoRA runs, reload, resume, cancel and the QLoRA gate."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from multiagenttrainer.errors import BackendError, ConfigError, CorpusError
from multiagenttrainer.finetune.base import JobRecord
from multiagenttrainer.finetune.opensource import (
    CANCEL_MARKER,
    OpenSourceFineTuner,
    check_4bit_supported,
    cuda_available,
    evaluate_loss,
)

from .conftest import MAX_LENGTH

TunerFactory = Callable[..., OpenSourceFineTuner]


def test_prepare_dataset_splits_corpus_into_text_records(make_tuner: TunerFactory, corpus_dir: Path) -> None:
    tuner = make_tuner()
    dataset = tuner.prepare_dataset(corpus_dir / "corpus.txt")  # the sibling corpus.jsonl is used
    folder = Path(dataset.location)
    train = [json.loads(line) for line in (folder / "train.jsonl").read_text().splitlines()]
    val = [json.loads(line) for line in (folder / "val.jsonl").read_text().splitlines()]
    assert (dataset.train_records, dataset.val_records) == (len(train), len(val)) == (24, 4)
    assert all(set(row) == {"text"} for row in train + val)
    assert folder.parent == Path(tuner.cfg.output_dir) / "datasets"
    assert any("# Guide" in row["text"] for row in val + train)


def test_prepare_dataset_takes_a_plain_text_file(make_tuner: TunerFactory, tmp_path: Path) -> None:
    """The product description's `--corpus /path/to/corpus.txt`, with no corpus.jsonl beside it."""
    text = "".join(f"def handler_{i}(request):\n    return load(request, limit={i})\n" for i in range(400))
    (tmp_path / "plain").mkdir()
    corpus = tmp_path / "plain" / "corpus.txt"
    corpus.write_text(text, encoding="utf-8")
    dataset = make_tuner().prepare_dataset(corpus)
    folder = Path(dataset.location)
    train = [json.loads(line)["text"] for line in (folder / "train.jsonl").read_text().splitlines()]
    val = [json.loads(line)["text"] for line in (folder / "val.jsonl").read_text().splitlines()]
    assert "".join(train + val) == text  # nothing lost, nothing repeated, in order
    assert (dataset.train_records, dataset.val_records) == (len(train), len(val)) and len(val) >= 1
    assert len(val) == round((len(train) + len(val)) * 0.1)
    assert dataset.details["corpus"] == str(corpus)


def test_a_training_text_too_small_for_one_sequence_is_refused(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    from multiagenttrainer.finetune.opensource import check_one_sequence

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    check_one_sequence(tokenizer, ["x"], "job-1")  # one token and the end-of-text token: enough
    tokenizer.eos_token = None  # a tokenizer without one: "x" alone cannot be a training sequence
    with pytest.raises(BackendError, match=r"job job-1: the training text is too small .* makes 1 tokens"):
        check_one_sequence(tokenizer, ["x"], "job-1")


def test_prepare_dataset_without_corpus_names_the_fix(make_tuner: TunerFactory, tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="mat ingest"):
        make_tuner().prepare_dataset(tmp_path / "nowhere")


def test_lora_run_records_metrics_progress_and_a_reloadable_adapter(
    make_tuner: TunerFactory, corpus_dir: Path, tiny_model_dir: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tuner = make_tuner()
    dataset = tuner.prepare_dataset(corpus_dir)
    record = tuner.start_job(dataset, "tiny run")

    assert record.status == "completed", record.error
    stored = tuner.get_status(record.id)
    assert stored.status == "completed" and stored.started_at and stored.finished_at
    assert stored.progress["step"] == stored.progress["total_steps"] == 3
    assert stored.progress["tokens_per_s"] > 0 and stored.progress["loss"] > 0
    metrics = stored.metrics
    assert metrics["eval_loss_after"] < metrics["eval_loss_before"]
    assert metrics["perplexity_before"] == pytest.approx(2.718281828 ** metrics["eval_loss_before"], rel=1e-6)

    job_dir = Path(stored.output_path or "")
    assert job_dir == Path(tuner.cfg.output_dir) / record.id
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= {
        p.name for p in job_dir.iterdir()
    }
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    reloaded = PeftModel.from_pretrained(base, job_dir)
    tokenizer = AutoTokenizer.from_pretrained(job_dir)
    val_texts = [json.loads(line)["text"] for line in (Path(dataset.location) / "val.jsonl").open()]
    loss = evaluate_loss(reloaded, tokenizer, val_texts, MAX_LENGTH)
    assert loss == pytest.approx(metrics["eval_loss_after"], abs=1e-5)


def test_restart_of_a_job_id_resumes_from_its_last_checkpoint(
    make_tuner: TunerFactory, corpus_dir: Path
) -> None:
    first = make_tuner(max_steps=2, save_steps=2)
    dataset = first.prepare_dataset(corpus_dir)
    record = first.start_job(dataset, "resumable", job_id="resumable-1")
    assert record.status == "completed" and record.metrics["resumed_from"] is None
    assert (Path(first.cfg.output_dir) / "resumable-1" / "checkpoints" / "checkpoint-2").is_dir()

    again = make_tuner(max_steps=4, save_steps=2)
    resumed = again.start_job(dataset, "resumable", job_id="resumable-1")

    assert resumed.status == "completed"
    assert resumed.metrics["resumed_from"] == "checkpoint-2"
    assert resumed.progress["step"] == 4
    assert (
        resumed.metrics["eval_loss_before"] == record.metrics["eval_loss_before"]
    )  # kept from the first run
    assert len(again.store.all()) == 1


def test_cancel_stops_a_running_job_at_the_next_step(make_tuner: TunerFactory, corpus_dir: Path) -> None:
    tuner = make_tuner(max_steps=400)
    dataset = tuner.prepare_dataset(corpus_dir)
    outcome: dict[str, object] = {}
    worker = threading.Thread(
        target=lambda: outcome.update(record=tuner.start_job(dataset, "to cancel", job_id="cancel-me")),
        daemon=True,
    )
    worker.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        records = tuner.store.all()
        if records and records[0].progress.get("step", 0) >= 1:
            break
        time.sleep(0.05)
    assert tuner.cancel_job("cancel-me").status == "running"  # still running: it stops at its next step
    worker.join(timeout=60)

    assert not worker.is_alive()
    final = tuner.get_status("cancel-me")
    assert final.status == "cancelled"
    assert 1 <= final.progress["step"] < 400
    assert (Path(tuner.cfg.output_dir) / "cancel-me" / CANCEL_MARKER).exists()
    job_dir = Path(tuner.cfg.output_dir) / "cancel-me"
    assert not (job_dir / "adapter_config.json").exists()
    stopped_at = final.progress["step"]
    assert (job_dir / "checkpoints" / f"checkpoint-{stopped_at}").is_dir()  # the work so far is kept

    restarted = make_tuner(max_steps=stopped_at + 1).start_job(dataset, "to cancel", job_id="cancel-me")
    assert restarted.status == "completed"
    assert restarted.metrics["resumed_from"] == f"checkpoint-{stopped_at}"
    assert not (job_dir / CANCEL_MARKER).exists() and (job_dir / "adapter_config.json").exists()


def test_cancel_of_a_job_that_is_not_running_ends_it_now(make_tuner: TunerFactory) -> None:
    tuner = make_tuner()
    record = JobRecord(id="queued-1", backend="opensource", target="default", model="m", status="pending")
    tuner.store.save(record)  # a pending job, as a start that crashed before training would leave it
    assert tuner.cancel_job(record.id).status == "cancelled"
    assert tuner.get_status(record.id).status == "cancelled"
    with pytest.raises(BackendError, match="mat finetune list"):
        tuner.get_status("no-such-job")


def test_unloadable_model_fails_the_job_with_a_fix(
    make_tuner: TunerFactory, corpus_dir: Path, tmp_path: Path
) -> None:
    tuner = make_tuner(model_id=str(tmp_path / "missing-model"))
    dataset = tuner.prepare_dataset(corpus_dir)
    with pytest.raises(BackendError, match="model_id"):
        tuner.start_job(dataset, "broken", job_id="broken-1")
    stored = tuner.get_status("broken-1")
    assert stored.status == "failed" and "model_id" in (stored.error or "")


def test_qlora_gate_refuses_before_loading_anything_without_cuda(
    make_tuner: TunerFactory, corpus_dir: Path, tmp_path: Path
) -> None:
    tuner = make_tuner(use_4bit=True, model_id=str(tmp_path / "never-loaded"))
    dataset = tuner.prepare_dataset(corpus_dir)
    if cuda_available():  # on a GPU machine the gate lets QLoRA through to the model load
        check_4bit_supported(tuner.cfg)
        with pytest.raises(BackendError, match="never-loaded"):
            tuner.start_job(dataset, "qlora")
        return
    with pytest.raises(ConfigError, match="use_4bit: false") as caught:
        tuner.start_job(dataset, "qlora")
    assert caught.value.exit_code == 2
    assert tuner.store.all() == []  # refused before a job record or a model load
    check_4bit_supported(make_tuner(use_4bit=False).cfg)  # plain LoRA needs nothing special


def test_describe_names_backend_model_and_settings(make_tuner: TunerFactory, tiny_model_dir: Path) -> None:
    line = make_tuner().describe()
    assert line.startswith("opensource LoRA on") and str(tiny_model_dir) in line and "r=4" in line


def test_packing_without_flash_attention_is_wrapped(tmp_path: Path) -> None:
    """Without CUDA + flash_attn, padding-free "bfd" packing would let packed sequences see each other."""
    from multiagenttrainer.config import OpenSourceConfig
    from multiagenttrainer.finetune.opensource import build_sft_config, flash_attention_available

    assert not flash_attention_available()
    sft = build_sft_config(OpenSourceConfig(), tmp_path / "ckpt", has_eval=False)
    assert sft.packing and sft.packing_strategy == "wrapped" and not sft.bf16
