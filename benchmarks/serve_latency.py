"""Benchmark: what `mat serve` adds to generation, measured with the openai client against a baseline.

    python benchmarks/serve_latency.py [--requests 40] [--tokens 64] [--warmup 4] [--threads 1]
                                       [--hidden 64] [--layers 4] [--json FILE] [--no-gpu]

CPU part (always): a random-init Llama and a byte-level BPE tokenizer are built in a temporary
folder (tests/support/tiny_model.py's builder, hidden --hidden, --layers layers). Then, for
--requests prompts, one at a time and alternating so that machine load hits both alike:

  direct  in this process: tokenize, `model.generate(max_new_tokens=K, min_new_tokens=K, greedy)`,
          decode; torch with --threads threads.
  served  `mat serve --model <folder> --port 0 --threads N --no-access-log` in a subprocess, called
          with the official openai client: `completions.create(max_tokens=K, temperature=0,
          extra_body={"min_tokens": K})`, so both generate exactly K tokens.

Both report p50/p95 latency per request (ms) and tokens/s (K / latency, median). The overhead is
served p50 / direct p50 - 1 (target under 15 %). A streamed request's time to first token is shown too.

GPU part (with CUDA and the vllm package): the same comparison between `mat serve --engine vllm` and
`mat serve --engine transformers` on a larger random Llama (hidden 1024, 8 layers, head size 64)
with a LoRA adapter, sequentially and with 16 concurrent clients; it says why it is skipped otherwise.
The load average is printed before and after. The last line of stdout is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.mat_serve import ServeProcess, serve_env  # noqa: E402
from tests.support.tiny_model import build_tiny_model, sample_files  # noqa: E402

TARGET_OVERHEAD = 0.15
GPU_CONCURRENCY = 16
SERVER_START_TIMEOUT_S = 900  # vLLM compiles and captures CUDA graphs at start


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def summarize(latencies_s: list[float], tokens: int) -> dict[str, float]:
    """p50/p95 in ms and tokens/s at the median."""
    p50 = statistics.median(latencies_s)
    return {
        "p50_ms": round(1000 * p50, 2),
        "p95_ms": round(1000 * percentile(latencies_s, 0.95), 2),
        "tokens_per_s": round(tokens / p50, 1),
    }


def prompts(count: int) -> list[str]:
    """Repository-like prompts, a different one per request."""
    files = [text for _, text in sample_files()]
    return [files[i % len(files)][: 40 + (i % 7) * 5] for i in range(count)]


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# --------------------------------------------------------------------------- the two sides


class Direct:
    """model.generate in this process."""

    def __init__(self, folder: Path, threads: int, tokens: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(threads)
        self.torch, self.tokens = torch, tokens
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder).eval()

    def __call__(self, prompt: str) -> str:
        ids = self.tokenizer(prompt, return_tensors="pt")
        with self.torch.inference_mode():
            out = self.model.generate(
                **ids, max_new_tokens=self.tokens, min_new_tokens=self.tokens, do_sample=False,
                pad_token_id=self.tokenizer.pad_token_id,
            )  # fmt: skip
        return str(self.tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True))


class Served:
    """The openai client against a `mat serve` subprocess."""

    def __init__(self, args: list[str], log: Path, tokens: int) -> None:
        import openai

        threads = args[args.index("--threads") + 1]
        self.server = ServeProcess(args, log, serve_env(OMP_NUM_THREADS=threads))
        try:
            self.server.wait_ready(timeout_s=SERVER_START_TIMEOUT_S)
        except BaseException:
            self.server.close()
            raise
        self.client = openai.OpenAI(base_url=self.server.base_url, api_key="none", max_retries=0, timeout=600)
        self.model, self.tokens = self.client.models.list().data[0].id, tokens

    def __call__(self, prompt: str) -> str:
        answer = self.client.completions.create(
            model=self.model, prompt=prompt, max_tokens=self.tokens, temperature=0,
            extra_body={"min_tokens": self.tokens},
        )  # fmt: skip
        assert answer.usage is not None and answer.usage.completion_tokens == self.tokens
        return answer.choices[0].text

    def first_token_s(self, prompt: str) -> float:
        """Seconds to the first streamed text."""
        started = time.perf_counter()
        stream = self.client.completions.create(
            model=self.model, prompt=prompt, max_tokens=self.tokens, temperature=0, stream=True,
            extra_body={"min_tokens": self.tokens},
        )  # fmt: skip
        for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                elapsed = time.perf_counter() - started
                break
        for _ in stream:
            pass
        return elapsed

    def close(self) -> None:
        self.server.stop()
        self.server.close()


def timed(call: Callable[[str], str], prompt: str) -> float:
    started = time.perf_counter()
    call(prompt)
    return time.perf_counter() - started


def alternate(
    sides: dict[str, Callable[[str], str]], texts: list[str], warmup: int
) -> dict[str, list[float]]:
    """Latencies per side, the sides taking turns on each prompt (after `warmup` untimed rounds)."""
    for text in texts[:warmup]:
        for call in sides.values():
            call(text)
    latencies: dict[str, list[float]] = {name: [] for name in sides}
    for text in texts[warmup:]:
        for name, call in sides.items():
            latencies[name].append(timed(call, text))
    return latencies


# --------------------------------------------------------------------------- CPU


def run_cpu(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    folder = build_tiny_model(scratch / "cpu-model", hidden_size=args.hidden, layers=args.layers)
    texts = prompts(args.warmup + args.requests)
    direct = Direct(folder, args.threads, args.tokens)
    server_args = ["--model", str(folder), "--port", "0", "--threads", str(args.threads), "--no-access-log"]
    served = Served(server_args, scratch / "cpu-serve.log", args.tokens)
    try:
        assert direct(texts[0]) == served(texts[0]), "the server and model.generate disagree"
        latencies = alternate({"direct": direct, "served": served}, texts, args.warmup)
        first = [served.first_token_s(text) for text in texts[args.warmup : args.warmup + 10]]
    finally:
        served.close()
    result: dict[str, Any] = {name: summarize(values, args.tokens) for name, values in latencies.items()}
    result["overhead"] = round(result["served"]["p50_ms"] / result["direct"]["p50_ms"] - 1, 4)
    result["served"]["first_token_p50_ms"] = round(1000 * statistics.median(first), 2)
    result["within_target"] = result["overhead"] < TARGET_OVERHEAD
    return result


def print_cpu(result: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"CPU: tiny Llama (hidden {args.hidden}, {args.layers} layers), {args.requests} requests x "
          f"{args.tokens} tokens, {args.threads} thread(s), one at a time")  # fmt: skip
    for name in ("direct", "served"):
        row = result[name]
        print(f"  {name:7} p50 {row['p50_ms']:8.2f} ms  p95 {row['p95_ms']:8.2f} ms  "
              f"{row['tokens_per_s']:8.1f} tokens/s")  # fmt: skip
    print(f"  served: first streamed token after {result['served']['first_token_p50_ms']:.2f} ms (p50)")
    verdict = "met" if result["within_target"] else "MISSED"
    print(f"  overhead of the server: {100 * result['overhead']:+.1f} % at p50 "
          f"(target < {100 * TARGET_OVERHEAD:.0f} %: {verdict})")  # fmt: skip


# --------------------------------------------------------------------------- GPU


def gpu_skip_reason() -> str | None:
    """Why the GPU part cannot run here, or None."""
    import importlib.util

    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    if importlib.util.find_spec("vllm") is None:
        return "the vllm package is not installed"
    return None


def build_gpu_model(scratch: Path) -> tuple[Path, Path]:
    """A Llama with head size 64 (what vLLM's kernels take) and a non-zero LoRA adapter on it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = scratch / "gpu-model"
    build_tiny_model(base, hidden_size=1024, layers=8, vocab_size=4000, heads=16, kv_heads=8)
    lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", init_lora_weights=False)
    adapted = get_peft_model(AutoModelForCausalLM.from_pretrained(base), lora)
    adapter = scratch / "gpu-adapter"
    adapted.save_pretrained(adapter)
    return base, adapter


def concurrent_throughput(served: Served, texts: list[str], clients: int) -> float:
    """Generated tokens per second with `clients` clients at once, each sending its share of texts."""
    share = [texts[i::clients] for i in range(clients)]
    started = time.perf_counter()
    threads = [threading.Thread(target=lambda ts=ts: [served(t) for t in ts]) for ts in share]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return round(len(texts) * served.tokens / (time.perf_counter() - started), 1)


def run_gpu(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    base, adapter = build_gpu_model(scratch)
    texts = prompts(args.warmup + args.requests)
    result: dict[str, Any] = {}
    for engine in ("transformers", "vllm"):
        server_args = ["--model", str(base), "--adapter", str(adapter), "--port", "0", "--engine", engine,
                       "--threads", str(args.threads), "--no-access-log"]  # fmt: skip
        served = Served(server_args, scratch / f"gpu-{engine}.log", args.tokens)
        try:
            latencies = alternate({engine: served}, texts, args.warmup)[engine]
            row = summarize(latencies, args.tokens)
            row["concurrent_tokens_per_s"] = concurrent_throughput(served, texts * 2, GPU_CONCURRENCY)
        finally:
            served.close()
        result[engine] = row
    result["vllm_speedup_p50"] = round(result["transformers"]["p50_ms"] / result["vllm"]["p50_ms"], 2)
    return result


def print_gpu(result: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"GPU: Llama hidden 1024, 8 layers, LoRA r=16, {args.requests} requests x {args.tokens} tokens")
    for name in ("transformers", "vllm"):
        row = result[name]
        print(f"  {name:12} p50 {row['p50_ms']:8.2f} ms  p95 {row['p95_ms']:8.2f} ms  "
              f"{row['tokens_per_s']:8.1f} tokens/s; {GPU_CONCURRENCY} clients: "
              f"{row['concurrent_tokens_per_s']} tokens/s")  # fmt: skip
    print(f"  vLLM vs transformers at p50: {result['vllm_speedup_p50']}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--no-gpu", action="store_true", help="skip the GPU part even where it could run")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    summary: dict[str, Any] = {"load_before": load_average()}
    with tempfile.TemporaryDirectory(prefix="mat-serve-bench-") as scratch:
        summary["cpu"] = run_cpu(args, Path(scratch))
        print_cpu(summary["cpu"], args)
        reason = "--no-gpu" if args.no_gpu else gpu_skip_reason()
        if reason is None:
            summary["gpu"] = run_gpu(args, Path(scratch))
            print_gpu(summary["gpu"], args)
        else:
            summary["gpu"] = {"skipped": reason}
            print(f"GPU part skipped: {reason}")
    summary["load_after"] = load_average()
    print(f"load average before {summary['load_before']}, after {summary['load_after']}")
    line = json.dumps(summary)
    if args.json:
        args.json.write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
