"""A tiny Llama model, BPE tokenizer and corpus built once per session; no hub access."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from multiagenttrainer.config import OpenSourceConfig  # noqa: E402
from multiagenttrainer.finetune.base import JobStore  # noqa: E402
from multiagenttrainer.finetune.opensource import OpenSourceFineTuner  # noqa: E402

VOCAB_SIZE = 400
MAX_LENGTH = 32


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


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A corpus folder with corpus.jsonl: most files train, every sixth file val."""
    folder = tmp_path_factory.mktemp("corpus")
    with (folder / "corpus.jsonl").open("w", encoding="utf-8") as handle:
        for index, (path, text) in enumerate(sample_files()):
            split = "val" if index % 6 == 5 else "train"
            record = {"source": "repo", "repo": "acme/widgets", "path": path, "split": split, "text": text}
            handle.write(json.dumps(record) + "\n")
    (folder / "corpus.txt").write_text("\n".join(t for _, t in sample_files()), encoding="utf-8")
    return folder


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-init 2-layer Llama and a byte-level BPE tokenizer saved to one local folder."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.set_num_threads(1)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-llama")
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator([text for _, text in sample_files()], trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    tokenizer.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=bpe.get_vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture
def make_tuner(tmp_path: Path, tiny_model_dir: Path) -> Callable[..., OpenSourceFineTuner]:
    """Build a tuner on the tiny model with test-sized settings; keyword arguments override the config."""

    def build(**overrides: object) -> OpenSourceFineTuner:
        settings: dict[str, object] = {
            "model_id": str(tiny_model_dir),
            "output_dir": str(tmp_path / "models"),
            "lora_r": 4,
            "lora_alpha": 8,
            "batch_size": 2,
            "max_length": MAX_LENGTH,
            "learning_rate": 5e-3,
            "max_steps": 3,
            "save_steps": 1000,
            "eval_steps": 1000,
        }
        settings.update(overrides)
        return OpenSourceFineTuner(OpenSourceConfig(**settings), JobStore(tmp_path / "jobs"))

    return build
