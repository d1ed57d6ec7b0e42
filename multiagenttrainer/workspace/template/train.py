"""A small byte-level GPT trained for a fixed time budget. This is the file to edit.

Run: `python train.py > run.log 2>&1`. It trains for TIME_BUDGET seconds (from prepare.py), or exactly
MAT_FIXED_STEPS steps when that environment variable is set, saves the weights (save_checkpoint), then
prints the `---` summary block. Everything below is fair game: the model, the optimizer, the schedule
and the hyperparameters. Keep three things: `build_model()` returns the untrained model, training runs
only under `if __name__ == "__main__":`, and the trained model goes through `save_checkpoint`: the
harness rebuilds the model with `build_model()`, loads the checkpoint and scores it itself.
"""

from __future__ import annotations

import math
import resource
import sys
import time
from typing import NoReturn

import torch
import torch.nn as nn
import torch.nn.functional as F
from prepare import (
    MAX_SEQ_LEN,
    TIME_BUDGET,
    VOCAB_SIZE,
    cpu_threads,
    evaluate_bpb,
    fixed_steps,
    get_batch,
    pick_device,
    save_checkpoint,
)

START_TIME = time.perf_counter()

# ---------------------------------------------------------------- hyperparameters
N_LAYER = 2  # transformer blocks
N_HEAD = 4  # attention heads per block (N_EMBD must divide by it)
N_EMBD = 128  # width of the residual stream
SEQ_LEN = 128  # training context in bytes; evaluation uses MAX_SEQ_LEN, so shorter leaves positions untrained
BATCH_SIZE = 16  # sequences per optimizer step
LEARNING_RATE = 3e-3  # peak AdamW learning rate
WEIGHT_DECAY = 0.1  # AdamW decoupled weight decay, applied to matrices only
ADAM_BETAS = (0.9, 0.95)  # AdamW moment decay rates
WARMUP_STEPS = 20  # optimizer steps of linear warm-up from 0 to LEARNING_RATE
WARMDOWN_RATIO = 0.4  # last share of the run (time or steps) where the LR decays linearly
FINAL_LR_FRAC = 0.1  # LR at the end of the warm-down, as a fraction of LEARNING_RATE
DROPOUT = 0.0  # dropout probability on attention and MLP outputs
GRAD_CLIP = 1.0  # max global gradient norm (0 disables clipping)
MLP_RATIO = 4  # hidden width of the MLP as a multiple of N_EMBD
SEED = 1337  # seeds the weights, dropout and batch sampling
EVAL_BATCH_SIZE = 32  # windows per forward pass during evaluation (speed only, not the score)
H100_BF16_PEAK_FLOPS = 989.5e12  # MFU reference on CUDA, as in autoresearch


# ---------------------------------------------------------------- model
class CausalSelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(N_EMBD, 3 * N_EMBD, bias=False)
        self.proj = nn.Linear(N_EMBD, N_EMBD, bias=False)
        self.dropout = nn.Dropout(DROPOUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (t.view(batch, seq, N_HEAD, width // N_HEAD).transpose(1, 2) for t in (q, k, v))
        drop = DROPOUT if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop)
        return self.dropout(self.proj(y.transpose(1, 2).reshape(batch, seq, width)))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(N_EMBD, MLP_RATIO * N_EMBD, bias=False)
        self.proj = nn.Linear(MLP_RATIO * N_EMBD, N_EMBD, bias=False)
        self.dropout = nn.Dropout(DROPOUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(N_EMBD, bias=False)
        self.attn = CausalSelfAttention()
        self.ln2 = nn.LayerNorm(N_EMBD, bias=False)
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB_SIZE, N_EMBD)
        self.wpe = nn.Embedding(MAX_SEQ_LEN, N_EMBD)
        self.drop = nn.Dropout(DROPOUT)
        self.blocks = nn.ModuleList(Block() for _ in range(N_LAYER))
        self.ln_f = nn.LayerNorm(N_EMBD, bias=False)
        self.head = nn.Linear(N_EMBD, VOCAB_SIZE, bias=False)
        self.head.weight = self.wte.weight  # tied input and output embeddings
        self.apply(self._init_weights)
        for name, param in self.named_parameters():
            if name.endswith("proj.weight"):  # scaled init of residual projections (GPT-2)
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * N_LAYER))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def build_model() -> GPT:
    """The untrained model; the harness calls this to rebuild the model it loads the checkpoint into."""
    return GPT()


# ---------------------------------------------------------------- training helpers
def make_optimizer(model: nn.Module, device: str) -> torch.optim.Optimizer:
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": matrices, "weight_decay": WEIGHT_DECAY}, {"params": others, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=LEARNING_RATE, betas=ADAM_BETAS, fused=device == "cuda")


def lr_multiplier(step: int, progress: float) -> float:
    """LR factor: linear warm-up over WARMUP_STEPS, flat, linear warm-down over the last WARMDOWN_RATIO."""
    if step < WARMUP_STEPS:
        return (step + 1) / WARMUP_STEPS
    if WARMDOWN_RATIO <= 0 or progress < 1 - WARMDOWN_RATIO:
        return 1.0
    done = min(1.0, (progress - (1 - WARMDOWN_RATIO)) / WARMDOWN_RATIO)
    return 1.0 - done * (1.0 - FINAL_LR_FRAC)


def peak_memory_mb(device: str) -> float:
    """Peak CUDA memory allocated on CUDA; on CPU the process's peak resident memory (ru_maxrss)."""
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 1024**2
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 1024**2 if sys.platform == "darwin" else rss / 1024  # bytes on macOS, KiB on Linux


def flops_per_token(num_params: int) -> float:
    """Training FLOPs per token: 6 per weight plus causal attention (forward + backward)."""
    weights = num_params - MAX_SEQ_LEN * N_EMBD  # the position table is a lookup, not a matmul
    return 6 * weights + 6 * N_LAYER * N_EMBD * SEQ_LEN


def fail(message: str) -> NoReturn:
    """Print the line the harness looks for on a broken run and exit with status 1."""
    print(f"FAIL: {message}", flush=True)
    sys.exit(1)


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, lr: float, generator: torch.Generator, device: str
) -> float:
    """One optimizer step on a fresh batch; returns the loss in nats per byte."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    x, y = get_batch("train", BATCH_SIZE, SEQ_LEN, device, generator)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        logits = model(x)
    loss = F.cross_entropy(logits.float().reshape(-1, VOCAB_SIZE), y.reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if GRAD_CLIP > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    optimizer.step()
    return loss.item()  # .item() waits for the GPU, so step times are real


def run_progress(step: int, training_seconds: float, steps_wanted: int | None) -> float:
    """Share of the run done: steps over MAT_FIXED_STEPS, or training time over TIME_BUDGET."""
    if steps_wanted is None:
        return training_seconds / TIME_BUDGET
    return step / steps_wanted if steps_wanted > 0 else 1.0


def train(model: nn.Module, device: str, steps_wanted: int | None) -> tuple[int, float]:
    """Train until the step count or the time budget is used up; returns (steps, training seconds)."""
    optimizer = make_optimizer(model, device)
    generator = torch.Generator().manual_seed(SEED)
    step, training_seconds, last_print = 0, 0.0, -math.inf
    while True:
        progress = run_progress(step, training_seconds, steps_wanted)
        if progress >= 1:
            return step, training_seconds
        step_start = time.perf_counter()
        lr = LEARNING_RATE * lr_multiplier(step, progress)
        loss = train_step(model, optimizer, lr, generator, device)
        if not math.isfinite(loss) or loss > 100:
            fail(f"loss is {loss} at step {step}")
        dt = time.perf_counter() - step_start
        training_seconds += dt
        step += 1
        if training_seconds - last_print >= 2.0:
            last_print = training_seconds
            print(
                f"step {step:05d} ({100 * progress:.1f}%) | loss: {loss:.4f} | lr: {lr:.2e} "
                f"| dt: {1000 * dt:.0f}ms | tok/sec: {BATCH_SIZE * SEQ_LEN / dt:,.0f}",
                flush=True,
            )


def print_summary(val_bpb: float, steps: int, training_seconds: float, num_params: int, device: str) -> None:
    """The `---` block the harness parses; keys and formats follow autoresearch."""
    total_tokens = steps * BATCH_SIZE * SEQ_LEN
    mfu = 0.0
    if device == "cuda" and training_seconds > 0:
        mfu = 100 * flops_per_token(num_params) * total_tokens / training_seconds / H100_BF16_PEAK_FLOPS
    print("---")
    print(f"val_bpb:          {val_bpb:.6f}")
    print(f"training_seconds: {training_seconds:.1f}")
    print(f"total_seconds:    {time.perf_counter() - START_TIME:.1f}")
    print(f"peak_vram_mb:     {peak_memory_mb(device):.1f}")
    print(f"mfu_percent:      {mfu:.2f}")
    print(f"total_tokens_M:   {total_tokens / 1e6:.1f}")
    print(f"num_steps:        {steps}")
    print(f"num_params_M:     {num_params / 1e6:.1f}")
    print(f"depth:            {N_LAYER}")


# ---------------------------------------------------------------- main
def main() -> None:
    if not 1 <= SEQ_LEN <= MAX_SEQ_LEN:
        fail(f"SEQ_LEN must be between 1 and MAX_SEQ_LEN={MAX_SEQ_LEN}, got {SEQ_LEN}")
    device = pick_device()
    torch.set_num_threads(cpu_threads())
    torch.manual_seed(SEED)
    if device == "cpu":
        torch.use_deterministic_algorithms(True)  # fixed-step runs repeat exactly on CPU
    model = build_model().to(device)
    num_params = sum(p.numel() for p in model.parameters())
    steps_wanted = fixed_steps()
    budget = f"{steps_wanted} fixed steps" if steps_wanted is not None else f"{TIME_BUDGET} s"
    print(
        f"device: {device} | threads: {torch.get_num_threads()} | params: {num_params / 1e6:.2f}M | {budget}"
    )
    steps, training_seconds = train(model, device, steps_wanted)
    save_checkpoint(model)
    eval_start = time.perf_counter()
    val_bpb = evaluate_bpb(model, EVAL_BATCH_SIZE)
    print(f"eval: {time.perf_counter() - eval_start:.1f}s", flush=True)
    if not math.isfinite(val_bpb):
        fail(f"val_bpb is {val_bpb}")
    print_summary(val_bpb, steps, training_seconds, num_params, device)


if __name__ == "__main__":
    main()
