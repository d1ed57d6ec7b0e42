"""A tiny random-init Llama, a byte-level BPE tokenizer and a small corpus, built locally (no hub access).

`build_tiny_model` is plain code (benchmarks call it too); `corpus_dir` and `tiny_model_dir` are the
session fixtures that feature conftests import, so every test directory builds them the same way.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

VOCAB_SIZE = 400
MAX_LENGTH = 32
MAX_POSITIONS = 128

# A ChatML-style template, for tests of the chat-template path (the default tiny tokenizer has none).
CHATML_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def sample_files() -> list[tuple[str, str]]:
    """A few KB of repository-like text: small Python and Markdown files."""
    files = []
    for i in range(24):
        code = "\n".join(
            f"def handler_{i}_{j}(request, limit={j}):\n    items = load_items(request)\n"
            f"    return [item for item in items if item.size < limit]\n"
            for j in range(4)
        )
        files.append((f"src/module_{i}.py", code))
    for i in range(4):
        files.append(
            (f"docs/guide_{i}.md", f"# Guide {i}\n\nCall handler_{i}_1 with a request to list items.\n")
        )
    return files


def write_corpus(folder: Path) -> Path:
    """corpus.jsonl and corpus.txt in `folder`: most files train, every sixth file val."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "corpus.jsonl").open("w", encoding="utf-8") as handle:
        for index, (path, text) in enumerate(sample_files()):
            split = "val" if index % 6 == 5 else "train"
            record = {"source": "repo", "repo": "acme/widgets", "path": path, "split": split, "text": text}
            handle.write(json.dumps(record) + "\n")
    (folder / "corpus.txt").write_text("\n".join(t for _, t in sample_files()), encoding="utf-8")
    return folder


def build_tiny_model(
    folder: Path,
    *,
    hidden_size: int = 32,
    layers: int = 2,
    vocab_size: int = VOCAB_SIZE,
    heads: int = 4,
    kv_heads: int = 2,
    chat_template: str | None = None,
    seed: int = 0,
) -> Path:
    """A random-init Llama and a byte-level BPE tokenizer (trained on sample_files) saved to `folder`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator([text for _, text in sample_files()], trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=bpe.get_vocab_size(),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A corpus folder with corpus.jsonl: most files train, every sixth file val."""
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-init 2-layer Llama and a byte-level BPE tokenizer saved to one local folder."""
    import torch

    torch.set_num_threads(1)
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


def tiny_opensource_section(model_dir: Path, output_dir: Path, max_steps: int = 3) -> dict[str, object]:
    """Test-sized LoRA settings on the tiny model (a `finetuner.opensource` section)."""
    return {
        "model_id": str(model_dir),
        "output_dir": str(output_dir),
        "lora_r": 4,
        "lora_alpha": 8,
        "batch_size": 2,
        "max_length": MAX_LENGTH,
        "learning_rate": 5e-3,
        "max_steps": max_steps,
        "save_steps": 1000,
        "eval_steps": 1000,
    }


def train_tiny_job(folder: Path, model_dir: Path, corpus: Path, name: str = "tiny") -> tuple[Path, Any]:
    """A completed open-source fine-tune job on the tiny model, made by mat's own backend in this process.

    Returns the config file that finds it (`finetuner.jobs_dir` under `folder`) and its JobRecord.
    """
    import yaml

    from multiagenttrainer.config import OpenSourceConfig
    from multiagenttrainer.finetune.base import JobStore
    from multiagenttrainer.finetune.opensource import OpenSourceFineTuner

    section = tiny_opensource_section(model_dir, folder / "models")
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "mat.yaml"
    document = {"finetuner": {"jobs_dir": str(folder / "jobs"), "opensource": section}}
    config.write_text(yaml.safe_dump(document), encoding="utf-8")
    tuner = OpenSourceFineTuner(OpenSourceConfig.model_validate(section), JobStore(folder / "jobs"))
    record = tuner.start_job(tuner.prepare_dataset(corpus), name)
    assert record.status == "completed", record.error
    return config, record
