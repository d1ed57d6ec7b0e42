"""
Test fixture: karpathy/autoresearch's train.py, shrunk to a tiny GPT that trains on a CPU in seconds.

Like the real one it imports the data loader, tokenizer and evaluate_bpb from prepare.py, trains for
TIME_BUDGET seconds and prints the `---` summary block. MAT_FIXED_STEPS=N trains exactly N steps instead.
"""

import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from prepare import MAX_SEQ_LEN, TIME_BUDGET, Tokenizer, evaluate_bpb, get_device, make_dataloader

t_start = time.time()

# ---------------------------------------------------------------------------
# Hyperparameters (edit these directly)
# ---------------------------------------------------------------------------

DEPTH = 2  # number of transformer layers
N_EMBD = 64  # model width
N_HEAD = 4  # attention heads
DEVICE_BATCH_SIZE = 8  # sequences per step
LEARNING_RATE = 3e-3  # AdamW learning rate
EVAL_BATCH_SIZE = 8  # sequences per evaluation batch
SEED = 42


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(N_EMBD)
        self.qkv = nn.Linear(N_EMBD, 3 * N_EMBD, bias=False)
        self.proj = nn.Linear(N_EMBD, N_EMBD, bias=False)
        self.ln2 = nn.LayerNorm(N_EMBD)
        self.mlp = nn.Sequential(nn.Linear(N_EMBD, 4 * N_EMBD), nn.GELU(), nn.Linear(4 * N_EMBD, N_EMBD))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, N_HEAD, c // N_HEAD).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.vocab_size = vocab_size
        self.wte = nn.Embedding(vocab_size, N_EMBD)
        self.wpe = nn.Embedding(MAX_SEQ_LEN, N_EMBD)
        self.blocks = nn.ModuleList(Block() for _ in range(DEPTH))
        self.ln_f = nn.LayerNorm(N_EMBD)
        self.head = nn.Linear(N_EMBD, vocab_size, bias=False)

    def forward(self, idx, targets=None, reduction="mean"):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, self.vocab_size), targets.reshape(-1), reduction=reduction)


def main():
    torch.manual_seed(SEED)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1") or "1"))
    fixed = os.environ.get("MAT_FIXED_STEPS", "").strip()
    steps_wanted = int(fixed) if fixed else None
    device = get_device()
    tokenizer = Tokenizer.from_directory()
    model = GPT(tokenizer.get_vocab_size()).to(device)
    num_params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    loader = make_dataloader(tokenizer, DEVICE_BATCH_SIZE, MAX_SEQ_LEN, "train")

    step, training_seconds = 0, 0.0
    while (steps_wanted is None and training_seconds < TIME_BUDGET) or (
        steps_wanted is not None and step < steps_wanted
    ):
        t0 = time.time()
        x, y, epoch = next(loader)
        loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_value = loss.item()
        if not math.isfinite(loss_value) or loss_value > 100:
            print("FAIL")
            raise SystemExit(1)
        training_seconds += time.time() - t0
        step += 1
        print(f"\rstep {step:05d} | loss: {loss_value:.6f} | epoch: {epoch}", end="", flush=True)
    print()

    val_bpb = evaluate_bpb(model, tokenizer, EVAL_BATCH_SIZE)
    total_tokens = step * DEVICE_BATCH_SIZE * MAX_SEQ_LEN
    print("---")
    print(f"val_bpb:          {val_bpb:.6f}")
    print(f"training_seconds: {training_seconds:.1f}")
    print(f"total_seconds:    {time.time() - t_start:.1f}")
    print(f"peak_vram_mb:     {0.0:.1f}")
    print(f"mfu_percent:      {0.0:.2f}")
    print(f"total_tokens_M:   {total_tokens / 1e6:.1f}")
    print(f"num_steps:        {step}")
    print(f"num_params_M:     {num_params / 1e6:.1f}")
    print(f"depth:            {DEPTH}")


if __name__ == "__main__":
    main()
