"""Benchmark: mat's open-source fine-tuning backend against a plain TRL SFTTrainer with default settings.

    python benchmarks/finetune_throughput.py [--device cpu|cuda] [--threads N] [--batch N] [--seq N]
                                             [--warmup 2] [--windows 5] [--window-steps 4] [--json FILE]

Both variants train the same random-init Llama, on the same generated repository-like texts, with the
same LoRA settings (mat's `build_lora_config`: r=16, alpha=32, dropout 0.05, all linear layers), the same
max_length, batch size and step count, and report_to none:

  mat    mat's own path: `OpenSourceFineTuner.prepare_dataset` for the data, then `load_base`,
         `build_sft_config`, `build_lora_config` and mat's job-progress callback around an SFTTrainer,
         exactly as `run_training` builds it (wrapped packing, explicit precision, CUDA extras).
  plain  `SFTTrainer(model=<model folder>, args=SFTConfig(...defaults...), peft_config=<same LoRA>)`;
         only output_dir, max_length, per_device_train_batch_size, max_steps, report_to and, on CPU,
         use_cpu=True (SFTConfig's default bf16 refuses to start on a CPU otherwise) are set.

Each variant runs in its own subprocess (no shared accelerate/torch state) and is measured as:

  tokens/s  real tokens trained: per batch, the count of label positions that are not -100 (padding is
            -100; with packing every position is real), divided by the wall time between consecutive
            `on_step_end` callbacks (so data loading, logging and callbacks count). The first --warmup
            steps are dropped; the rest form --windows windows of --window-steps steps; the median
            window's tokens/s is reported. `tokens_per_cpu_s` divides by this process's CPU time instead;
            with one thread on a shared CPU it is steadier than wall time (on CUDA it means little).
  memory    CPU: peak RSS (ru_maxrss) minus the RSS after imports, before the model loads.
            CUDA: torch.cuda.max_memory_allocated over the run (weights included).
  MFU       CUDA only: tokens/s * 6 * N / peak, where N counts every parameter once (frozen base, LoRA,
            tied embeddings once) and peak is a bf16 8192^3 matmul measured in the same run. 6N is the
            usual dense-training approximation (2N forward + 4N backward); with LoRA the frozen weights
            get no weight gradients, so the true work is nearer 4N plus attention (excluded), and
            activation checkpointing re-runs the forward: MFU here compares variants, not absolute.

Shapes: `--device cpu` (the default without CUDA): a Llama with hidden 128, 4 layers, vocab 2048,
batch 4 x 256 tokens, torch threads 1 unless --threads. `--device cuda`: Llama-3.2-1B-shaped with random
weights (hidden 2048, 16 layers, 32 heads, 8 KV heads, intermediate 8192, vocab 128256, tied
embeddings), 8 x 2048 tokens. The tokenizer is a byte-level BPE trained locally (no hub access); on
CUDA its vocabulary is smaller than the model's, which leaves the compute unchanged.
Without CUDA the GPU part prints "no CUDA: GPU part skipped". The last line of stdout is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("mat", "plain")
WORKER_TIMEOUT_S = 1800
TARGET_RATIO = {"cpu": 1.0, "cuda": 1.2}
SHAPES: dict[str, dict[str, Any]] = {
    "cpu": {
        "hidden_size": 128,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 2048,
        "tie_word_embeddings": False,
        "seq": 256,
        "batch": 4,
        "tokenizer_vocab": 2048,
    },
    "cuda": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "tie_word_embeddings": True,
        "seq": 2048,
        "batch": 8,
        "tokenizer_vocab": 8192,
    },
}
WORDS = (  # noqa: SIM905
    "value result items index count name path config data buffer stream reader writer node tree "
    "parse load save user request response handler error message format length offset size cache "
    "client server session queue worker task event state record field schema model table column"
).split()


# --------------------------------------------------------------------------- data and model


def generate_texts(count: int, seed: int = 0) -> list[str]:
    """Python-like files of lognormal length (median ~1.5 kB), so some fit max_length and some do not."""
    rng = random.Random(seed)
    texts = []
    for index in range(count):
        target = int(rng.lognormvariate(7.3, 0.8))
        lines = [f"# module {index}: {rng.choice(WORDS)} {rng.choice(WORDS)}"]
        while sum(map(len, lines)) < target:
            name, arg = f"{rng.choice(WORDS)}_{rng.randint(0, 99)}", rng.choice(WORDS)
            lines.append(f"def {name}({arg}, {rng.choice(WORDS)}={rng.randint(0, 9)}):")
            lines.append(f"    {arg} = load_{rng.choice(WORDS)}({arg})[{rng.randint(0, 31)}]")
            lines.append(f"    return [x for x in {arg} if x.{rng.choice(WORDS)} < {rng.randint(1, 500)}]\n")
        texts.append("\n".join(lines))
    return texts


def write_corpus(folder: Path, texts: list[str]) -> Path:
    """corpus.jsonl records as `mat ingest` writes them, every one in the train split."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "corpus.jsonl").open("w", encoding="utf-8") as handle:
        for index, text in enumerate(texts):
            record = {
                "source": "bench",
                "repo": "bench/repo",
                "path": f"m{index}.py",
                "split": "train",
                "text": text,
            }
            handle.write(json.dumps(record) + "\n")
    return folder


def build_model_folder(folder: Path, shape: dict[str, Any], texts: list[str], bf16: bool) -> None:
    """Train a byte-level BPE on the texts and save it with a random-init Llama of the given shape."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=shape["tokenizer_vocab"],
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    tokenizer.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=max(shape["vocab_size"], bpe.get_vocab_size()),
        hidden_size=shape["hidden_size"],
        intermediate_size=shape["intermediate_size"],
        num_hidden_layers=shape["num_hidden_layers"],
        num_attention_heads=shape["num_attention_heads"],
        num_key_value_heads=shape["num_key_value_heads"],
        tie_word_embeddings=shape["tie_word_embeddings"],
        max_position_embeddings=max(shape["seq"], 2048),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    if bf16:
        model = model.to(torch.bfloat16)  # type: ignore[arg-type]
    model.save_pretrained(folder)


# --------------------------------------------------------------------------- worker (one variant per process)


def current_rss_bytes() -> int:
    """This process's resident set size now, from /proc."""
    with open("/proc/self/statm", encoding="ascii") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def count_real_tokens(batch: Any) -> int:
    """Positions that the loss trains on: labels that are not -100 (else attention-mask ones)."""
    if "labels" in batch:
        return int((batch["labels"] != -100).sum())
    if "attention_mask" in batch:
        return int(batch["attention_mask"].sum())
    return int(batch["input_ids"].numel())


class TokenCountingCollator:
    """Wraps a collator and records the real tokens of each batch, in order."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.counts: list[int] = []

    def __call__(self, examples: Any) -> Any:
        batch = self.inner(examples)
        self.counts.append(count_real_tokens(batch))
        return batch


def make_step_timer(on_cuda: bool) -> Any:
    """A TrainerCallback recording the wall clock at the end of every optimizer step."""
    import torch
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []
            self.cpu_ends: list[float] = []
            self.start = 0.0

        def _now(self) -> float:
            if on_cuda:
                torch.cuda.synchronize()
            return time.perf_counter()

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.start = self._now()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.ends.append(self._now())
            self.cpu_ends.append(time.process_time())

    return StepTimer()


def build_mat_trainer(spec: dict[str, Any], extra_callbacks: list[Any]) -> tuple[Any, int]:
    """SFTTrainer assembled the way mat's run_training does, from mat's own builders."""
    from datasets import Dataset
    from trl.trainer.sft_trainer import SFTTrainer

    from multiagenttrainer.config import OpenSourceConfig
    from multiagenttrainer.finetune.base import JobRecord, JobStore
    from multiagenttrainer.finetune.opensource import (
        OpenSourceFineTuner,
        build_lora_config,
        build_sft_config,
        load_base,
        make_job_callback_class,
        read_text_jsonl,
    )

    work = Path(spec["workdir"]) / "mat"
    cfg = OpenSourceConfig(
        model_id=spec["model_dir"],
        output_dir=str(work / "models"),
        batch_size=spec["batch"],
        max_length=spec["seq"],
        max_steps=spec["steps"],
        save_steps=10**6,
        eval_steps=10**6,
    )
    store = JobStore(work / "jobs")
    tuner = OpenSourceFineTuner(cfg, store)
    dataset = tuner.prepare_dataset(Path(spec["corpus_dir"]))
    texts = read_text_jsonl(Path(dataset.location) / "train.jsonl")
    record = store.save(
        JobRecord(
            id="bench",
            backend="opensource",
            target=tuner.target,
            model=cfg.model_id,
            status="running",
            name="bench",
            output_path=str(tuner.job_dir("bench")),
        )
    )
    tokenizer, model = load_base(cfg)
    args = build_sft_config(cfg, tuner.job_dir("bench") / "checkpoints", has_eval=False)
    job_callback = make_job_callback_class()(store, record, tuner.job_dir("bench"), args)
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list([{"text": t} for t in texts]),
        processing_class=tokenizer,
        peft_config=build_lora_config(cfg),
        callbacks=[job_callback, *extra_callbacks],
    )
    return trainer, len(texts)


def build_plain_trainer(spec: dict[str, Any], extra_callbacks: list[Any], on_cuda: bool) -> tuple[Any, int]:
    """SFTTrainer with SFTConfig defaults apart from the settings that must match."""
    from datasets import Dataset
    from trl.trainer.sft_config import SFTConfig
    from trl.trainer.sft_trainer import SFTTrainer

    from multiagenttrainer.config import OpenSourceConfig
    from multiagenttrainer.finetune.opensource import build_lora_config

    texts = [
        json.loads(line)["text"] for line in Path(spec["corpus_dir"], "corpus.jsonl").read_text().splitlines()
    ]
    args = SFTConfig(
        output_dir=str(Path(spec["workdir"]) / "plain" / "out"),
        max_length=spec["seq"],
        per_device_train_batch_size=spec["batch"],
        max_steps=spec["steps"],
        report_to="none",
        use_cpu=not on_cuda,  # required on CPU: the default bf16=True refuses to start there
    )
    lora = build_lora_config(OpenSourceConfig(model_id=spec["model_dir"]))  # the same LoRA settings as mat
    trainer = SFTTrainer(
        model=spec["model_dir"],
        args=args,
        train_dataset=Dataset.from_list([{"text": t} for t in texts]),
        peft_config=lora,
        callbacks=extra_callbacks,
    )
    return trainer, len(texts)


def window_rates(counts: list[int], ends: list[float], warmup: int, windows: int, size: int) -> list[float]:
    """Tokens/s of each timed window; step i's time is ends[i] - ends[i-1], steps < warmup are dropped."""
    rates = []
    for w in range(windows):
        first, last = warmup + w * size, warmup + (w + 1) * size  # steps first..last-1 (0-based)
        if last > len(ends) or first < 1:
            break
        rates.append(sum(counts[first:last]) / (ends[last - 1] - ends[first - 1]))
    return rates


def run_worker(spec_path: Path, result_path: Path) -> None:
    """Train one variant and write its measurements as JSON."""
    spec = json.loads(spec_path.read_text())
    import torch

    on_cuda = spec["device"] == "cuda"
    if not on_cuda:
        torch.set_num_threads(spec["threads"])
    import datasets  # noqa: F401  (imported before the baseline so both variants pay it outside the delta)
    import peft  # noqa: F401
    import trl  # noqa: F401

    baseline_rss = current_rss_bytes()
    timer = make_step_timer(on_cuda)
    build = (
        build_mat_trainer if spec["variant"] == "mat" else (lambda s, c: build_plain_trainer(s, c, on_cuda))
    )
    trainer, documents = build(spec, [timer])
    collator = TokenCountingCollator(trainer.data_collator)
    trainer.data_collator = collator
    trainer.train()
    model = trainer.model
    result = {
        "variant": spec["variant"],
        "documents": documents,
        "steps": len(timer.ends),
        "counts": collator.counts[: len(timer.ends)],
        "cpu_rates": window_rates(
            collator.counts, timer.cpu_ends, spec["warmup"], spec["windows"], spec["window_steps"]
        ),
        "rates": window_rates(
            collator.counts, timer.ends, spec["warmup"], spec["windows"], spec["window_steps"]
        ),
        "params_total": sum(p.numel() for p in model.parameters()),
        "params_trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "dtype": str(next(model.parameters()).dtype),
        "gradient_checkpointing": bool(getattr(trainer.args, "gradient_checkpointing", False)),
        "packing": bool(trainer.args.packing),
        "memory_bytes": torch.cuda.max_memory_allocated() if on_cuda else peak_rss_bytes() - baseline_rss,
    }
    result_path.write_text(json.dumps(result))


def run_peak_worker(result_path: Path) -> None:
    """Measure bf16 matmul throughput (8192^3) on the GPU and write FLOP/s as JSON."""
    import torch

    n, iters = 8192, 30
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        a @ b
    torch.cuda.synchronize()
    result_path.write_text(json.dumps({"peak_flops": 2 * n**3 * iters / (time.perf_counter() - start)}))


# --------------------------------------------------------------------------- parent


def worker_env(device: str, threads: int) -> dict[str, str]:
    """Environment for a child: offline hub, fixed thread counts on CPU, the repo on the path."""
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    )
    if device == "cpu":
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), CUDA_VISIBLE_DEVICES="")
    return env


def run_child(args: list[str], env: dict[str, str], result_path: Path) -> dict[str, Any]:
    """Run this script as a worker subprocess and return the JSON it wrote; exit on failure."""
    command = [sys.executable, str(Path(__file__).resolve()), *args, str(result_path)]
    done = subprocess.run(command, env=env, timeout=WORKER_TIMEOUT_S, capture_output=True, text=True)
    if done.returncode != 0 or not result_path.is_file():
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-8000:])
        raise SystemExit(f"worker {' '.join(args)} failed with exit code {done.returncode}")
    loaded: dict[str, Any] = json.loads(result_path.read_text())
    return loaded


def summarize(result: dict[str, Any], wall_s: float, peak_flops: float | None) -> dict[str, Any]:
    """Median tokens/s, memory and (with a measured peak) MFU of one variant."""
    tokens_s = statistics.median(result["rates"]) if result["rates"] else 0.0
    summary = {
        "tokens_per_s": round(tokens_s, 1),
        "window_tokens_per_s": [round(r, 1) for r in result["rates"]],
        "tokens_per_cpu_s": round(statistics.median(result["cpu_rates"]), 1) if result["cpu_rates"] else 0.0,
        "memory_mib": round(result["memory_bytes"] / 2**20, 1),
        "real_tokens_per_step": round(statistics.mean(result["counts"]), 1) if result["counts"] else 0,
        "params_total": result["params_total"],
        "params_trainable": result["params_trainable"],
        "dtype": result["dtype"],
        "gradient_checkpointing": result["gradient_checkpointing"],
        "packing": result["packing"],
        "process_wall_s": round(wall_s, 1),
    }
    if peak_flops:
        summary["mfu"] = round(tokens_s * 6 * result["params_total"] / peak_flops, 4)
    return summary


def print_table(device: str, rows: dict[str, dict[str, Any]], ratio: float, memory_ratio: float) -> None:
    """The human-readable comparison."""
    print(f"\n{device}: tokens/s = real (non-pad) tokens / step wall time, median of timed windows")
    print(
        f"{'variant':8} {'tokens/s':>10} {'windows':>26} {'tok/step':>9} {'mem MiB':>9} {'MFU':>7} "
        f"{'ckpt':>5} {'pack':>5} {'dtype':>15}"
    )
    for name, row in rows.items():
        windows = ",".join(f"{r:.0f}" for r in row["window_tokens_per_s"])
        mfu = f"{row['mfu']:.1%}" if "mfu" in row else "-"
        print(
            f"{name:8} {row['tokens_per_s']:>10.1f} {windows:>26} {row['real_tokens_per_step']:>9.0f} "
            f"{row['memory_mib']:>9.1f} {mfu:>7} {row['gradient_checkpointing']!s:>5} {row['packing']!s:>5} "
            f"{row['dtype']:>15}"
        )
    target = TARGET_RATIO[device]
    verdict = "met" if target_met(device, ratio, memory_ratio) else "NOT met"
    memory_goal = "target <= 1.0" if device == "cuda" else "reported only; the CPU target is speed alone"
    print(
        f"mat/plain tokens/s = {ratio:.2f} (target >= {target}), memory mat/plain = {memory_ratio:.2f} "
        f"({memory_goal}): {verdict}"
    )


def target_met(device: str, ratio: float, memory_ratio: float) -> bool:
    """CPU: at least as fast as plain TRL. GPU: TARGET_RATIO times as fast at no more memory."""
    return ratio >= TARGET_RATIO[device] and (device != "cuda" or memory_ratio <= 1.0)


def run_device(device: str, opts: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Build model and data for the device's shape, run both variants in subprocesses, compare."""
    shape = dict(SHAPES[device])
    batch, seq = opts.batch or shape["batch"], opts.seq or shape["seq"]
    shape["seq"] = seq
    steps = opts.warmup + opts.windows * opts.window_steps
    texts = generate_texts(max(200, batch * steps * 2))
    folder = workdir / device
    corpus_dir = write_corpus(folder / "corpus", texts)
    started = time.perf_counter()
    build_model_folder(folder / "model", shape, texts, bf16=device == "cuda")
    print(
        f"{device}: built model and tokenizer in {time.perf_counter() - started:.1f} s; "
        f"{len(texts)} documents, batch {batch} x {seq}, {opts.warmup} warm-up + "
        f"{opts.windows} x {opts.window_steps} timed steps",
        flush=True,
    )
    env = worker_env(device, opts.threads)
    peak = None
    if device == "cuda":
        peak = run_child(["--peak-worker"], env, folder / "peak.json")["peak_flops"]
        print(f"cuda: bf16 8192^3 matmul peak {peak / 1e12:.1f} TFLOP/s", flush=True)
    rows = {}
    for variant in VARIANTS:
        spec = {
            "variant": variant,
            "device": device,
            "threads": opts.threads,
            "workdir": str(folder / variant),
            "model_dir": str(folder / "model"),
            "corpus_dir": str(corpus_dir),
            "batch": batch,
            "seq": seq,
            "steps": steps,
            "warmup": opts.warmup,
            "windows": opts.windows,
            "window_steps": opts.window_steps,
        }
        spec_path = folder / f"{variant}-spec.json"
        spec_path.write_text(json.dumps(spec))
        started = time.perf_counter()
        result = run_child(["--worker", str(spec_path)], env, folder / f"{variant}-result.json")
        rows[variant] = summarize(result, time.perf_counter() - started, peak)
        print(f"{device}: {variant} done: {rows[variant]['tokens_per_s']} tokens/s", flush=True)
    ratio = rows["mat"]["tokens_per_s"] / max(rows["plain"]["tokens_per_s"], 1e-9)
    memory_ratio = rows["mat"]["memory_mib"] / max(rows["plain"]["memory_mib"], 1e-9)
    cpu_ratio = rows["mat"]["tokens_per_cpu_s"] / max(rows["plain"]["tokens_per_cpu_s"], 1e-9)
    print_table(device, rows, ratio, memory_ratio)
    print(
        f"mat/plain tokens per process-CPU-second = {cpu_ratio:.2f} (steadier than wall time on a shared box)"
    )
    return {
        "device": device,
        "batch": batch,
        "seq": seq,
        "threads": opts.threads if device == "cpu" else None,
        "peak_flops": peak,
        "variants": rows,
        "tokens_per_s_ratio": round(ratio, 3),
        "tokens_per_cpu_s_ratio": round(cpu_ratio, 3),
        "memory_ratio": round(memory_ratio, 3),
        "target_ratio": TARGET_RATIO[device],
        "target_met": target_met(device, ratio, memory_ratio),
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="cpu (tiny Llama) or cuda (Llama-3.2-1B shape); default cuda if available, else cpu",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads on CPU (default 1)")
    parser.add_argument("--batch", type=int, default=None, help="override the shape's batch size")
    parser.add_argument("--seq", type=int, default=None, help="override the shape's max_length")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (>= 1)")
    parser.add_argument("--windows", type=int, default=5, help="timed windows (median reported)")
    parser.add_argument("--window-steps", type=int, default=4, help="steps per timed window")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="keep generated files here (default: temp)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON summary here")
    parser.add_argument("--worker", type=Path, nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--peak-worker", type=Path, nargs=1, help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.warmup < 1:
        parser.error("--warmup must be at least 1 (the first step's time has no start mark)")
    return opts


def cuda_present() -> bool:
    """Whether torch sees a CUDA device (imports torch)."""
    import torch

    return bool(torch.cuda.is_available())


def main(argv: list[str]) -> int:
    """Run the comparison on the chosen device and print the JSON summary last."""
    opts = parse_args(argv)
    if opts.worker:
        run_worker(*opts.worker)
        return 0
    if opts.peak_worker:
        run_peak_worker(opts.peak_worker[0])
        return 0
    has_cuda = cuda_present()
    device = opts.device or ("cuda" if has_cuda else "cpu")
    summary: dict[str, Any] = {"benchmark": "finetune_throughput"}
    with tempfile.TemporaryDirectory(prefix="mat-ft-bench-") as tmp:
        workdir = opts.workdir or Path(tmp)
        if device == "cuda" and not has_cuda:
            print("no CUDA: GPU part skipped")
            summary["cuda"] = "skipped: no CUDA"
        else:
            summary[device] = run_device(device, opts, workdir)
            if device == "cpu" and not has_cuda:
                print("no CUDA: GPU part skipped")
                summary["cuda"] = "skipped: no CUDA"
    line = json.dumps(summary)
    if opts.json:
        opts.json.write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main(sys.argv[1:]))
