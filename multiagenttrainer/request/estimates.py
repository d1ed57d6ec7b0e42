"""Estimates and probes the Task agent plans with: memory per candidate, machine speed, one epoch's time.

Memory is estimated before any model loads (LLaMA-Factory's rules of thumb): the weights and LoRA
state at ~2 GB per billion parameters (QLoRA: ~0.5 GB), plus the activations of one batch, computed
from the model's config.json when it is a local folder (s·b·h·L·34 + 5·a·s²·b·L bytes, Korthikanti et
al.) and otherwise assumed to be a quarter of the weights' share. The probes run on this machine: a
matmul for its floating-point speed, and greedy generation on the smallest candidate for its latency.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multiagenttrainer.config import ModelCandidate

GB = 1e9
LORA_GB_PER_BILLION = 2.0
QLORA_GB_PER_BILLION = 0.5
ASSUMED_ACTIVATION_SHARE = 0.25
CHARS_PER_TOKEN = 4.0  # for sizing text before a tokenizer is chosen
TRAINING_FLOPS_PER_PARAM_TOKEN = 6.0  # forward and backward
ASSUMED_UTILIZATION = 0.3  # share of the probe's matmul speed a training step reaches
PROBE_MATRIX = 512
PROBE_REPEATS = 5
MAX_CONFIG_BYTES = 1 << 20


@dataclass(frozen=True)
class MemoryEstimate:
    gb: float
    basis: str


# --------------------------------------------------------------------------- memory


def model_shape(model_id: str) -> dict[str, int] | None:
    """hidden size, layers and heads from a local model folder's config.json (None for hub ids)."""
    path = Path(model_id).expanduser() / "config.json"
    try:
        if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
        shape = {key: int(data[key]) for key in ("hidden_size", "num_hidden_layers", "num_attention_heads")}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return shape if all(value > 0 for value in shape.values()) else None


def activation_bytes(shape: dict[str, int], batch: int, seq: int) -> float:
    """Activations of one training batch in 16-bit, without recomputation."""
    hidden, layers, heads = shape["hidden_size"], shape["num_hidden_layers"], shape["num_attention_heads"]
    return float(seq * batch * hidden * layers * 34 + 5 * heads * seq * seq * batch * layers)


def estimate_memory(candidate: ModelCandidate, batch: int, seq: int) -> MemoryEstimate:
    """Memory to fine-tune the candidate with LoRA (QLoRA with use_4bit) at this batch and length."""
    per_billion = QLORA_GB_PER_BILLION if candidate.use_4bit else LORA_GB_PER_BILLION
    weights = candidate.params / GB * per_billion
    method = f"{'QLoRA' if candidate.use_4bit else 'LoRA'} {per_billion:g} GB/B"
    shape = model_shape(candidate.model_id)
    if shape is None:
        return MemoryEstimate(
            weights * (1 + ASSUMED_ACTIVATION_SHARE), f"{method} + activations assumed 25 %"
        )
    activations = activation_bytes(shape, batch, seq) / GB
    return MemoryEstimate(weights + activations, f"{method} + activations of batch {batch}x{seq}")


def machine_memory_gb(configured: float | None) -> tuple[float, str]:
    """(GB, where the figure comes from): the configured value, the GPU's, else this machine's RAM."""
    if configured is not None:
        return configured, "request.machine_memory_gb"
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return props.total_memory / GB, f"GPU 0 ({props.name})"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GB, "this machine's RAM (no GPU)"


# --------------------------------------------------------------------------- time


def percentile(values: list[float], pct: float) -> float:
    """The nearest-rank percentile (p95 of 10 values is the 10th smallest)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def measure_gflops() -> float:
    """This machine's fp32 matmul speed in GFLOP/s (the best of a few small products)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    a = torch.randn(PROBE_MATRIX, PROBE_MATRIX, device=device)
    b = torch.randn(PROBE_MATRIX, PROBE_MATRIX, device=device)
    best = math.inf
    for _ in range(PROBE_REPEATS):
        started = time.perf_counter()
        (a @ b).sum().item()
        best = min(best, time.perf_counter() - started)
    return 2 * PROBE_MATRIX**3 / max(best, 1e-9) / GB


def epoch_seconds(params: int, train_chars: int, gflops: float) -> float:
    """Estimated time of one epoch over `train_chars` characters of text for a model of `params`."""
    tokens = train_chars / CHARS_PER_TOKEN
    flops = TRAINING_FLOPS_PER_PARAM_TOKEN * params * tokens
    return flops / (gflops * GB * ASSUMED_UTILIZATION)


def measure_latency_ms(model_id: str, tokens: int, runs: int) -> list[float]:
    """Milliseconds to generate exactly `tokens` tokens greedily, `runs` times after one warm-up."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_id)
    model: Any = AutoModelForCausalLM.from_pretrained(model_id)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = model.to(device).eval()
    ids = tokenizer("def ", return_tensors="pt")["input_ids"].to(device)
    timings = []
    with torch.no_grad():
        for run in range(runs + 1):
            started = time.perf_counter()
            model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
            )
            if run:  # the first run warms caches up
                timings.append((time.perf_counter() - started) * 1000)
    return timings
