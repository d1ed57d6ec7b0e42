"""
Test fixture: karpathy/autoresearch's prepare.py, shrunk to run on a CPU with no network.

It keeps the parts of the real file that mat's corpus injection depends on, with the same names,
paths and line forms: CACHE_DIR / DATA_DIR / TOKENIZER_DIR, the pinned VAL_FILENAME, MAX_SEQ_LEN,
TIME_BUDGET, EVAL_TOKENS, VOCAB_SIZE, train_tokenizer() (needs >= 2 parquet files, skipped when both
tokenizer files exist, writes tokenizer.pkl and token_bytes.pt), the parquet `text` dataloader with
BOS-aligned best-fit packing, and evaluate_bpb.

What differs from the real file: the download step writes ClimbMix-like shards made up on the spot
(there is no network in tests), a tiny byte-level BPE trained with numpy instead of rustbpe + tiktoken
(not installed here), small constants, and the device is "cuda" only when one is available.

Data and tokenizer are stored in ~/.cache/autoresearch/.
"""

import math
import os
import pickle
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import torch

# ---------------------------------------------------------------------------
# Constants (fixed, do not modify)
# ---------------------------------------------------------------------------

MAX_SEQ_LEN = 256  # context length
TIME_BUDGET = 300  # training time budget in seconds (5 minutes)
EVAL_TOKENS = 8 * 4096  # number of tokens for val eval

# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------

CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "autoresearch")
DATA_DIR = os.path.join(CACHE_DIR, "data")
TOKENIZER_DIR = os.path.join(CACHE_DIR, "tokenizer")
MAX_SHARD = 6542  # the last datashard is shard_06542.parquet
VAL_SHARD = MAX_SHARD  # pinned validation shard (shard_06542)
VAL_FILENAME = f"shard_{VAL_SHARD:05d}.parquet"
VOCAB_SIZE = 320

SPECIAL_TOKENS = [f"<|reserved_{i}|>" for i in range(4)]
BOS_TOKEN = "<|reserved_0|>"

TOKENIZER_MAX_CHARS = 200_000  # the numpy BPE trainer is slow; the real one reads up to 1e9 chars
PAIR_BASE = 1024  # > any token id, so a pair (a, b) packs into one integer a * PAIR_BASE + b

# ---------------------------------------------------------------------------
# Data download (the real one fetches ClimbMix shards from Hugging Face)
# ---------------------------------------------------------------------------


def download_single_shard(index):
    """Write shard `index` into DATA_DIR: made-up ClimbMix text, as if it had been downloaded."""
    import pyarrow as pa

    os.makedirs(DATA_DIR, exist_ok=True)
    path = os.path.join(DATA_DIR, f"shard_{index:05d}.parquet")
    if os.path.exists(path):
        return True
    rows = [f"CLIMBMIX downloaded document {index}.{n}: " + "web text " * 40 for n in range(200)]
    pq.write_table(pa.table({"text": rows}), path + ".tmp")
    os.rename(path + ".tmp", path)
    print(f"Downloaded {os.path.basename(path)}")
    return True


def download_data(num_shards, download_workers=8):
    """Download the first `num_shards` training shards and the pinned val shard."""
    ids = list(range(min(num_shards, MAX_SHARD)))
    if VAL_SHARD not in ids:
        ids.append(VAL_SHARD)
    ok = sum(download_single_shard(i) for i in ids)
    print(f"Data: {ok}/{len(ids)} shards ready at {DATA_DIR}")


# ---------------------------------------------------------------------------
# Tokenizer training
# ---------------------------------------------------------------------------


def list_parquet_files():
    """Return sorted list of parquet file paths in the data directory."""
    files = sorted(f for f in os.listdir(DATA_DIR) if f.endswith(".parquet") and not f.endswith(".tmp"))
    return [os.path.join(DATA_DIR, f) for f in files]


def text_iterator(max_chars=TOKENIZER_MAX_CHARS, doc_cap=10_000):
    """Yield documents from training split (all shards except pinned val shard)."""
    parquet_paths = [p for p in list_parquet_files() if not p.endswith(VAL_FILENAME)]
    nchars = 0
    for filepath in parquet_paths:
        pf = pq.ParquetFile(filepath)
        for rg_idx in range(pf.num_row_groups):
            rg = pf.read_row_group(rg_idx)
            for text in rg.column("text").to_pylist():
                doc = text[:doc_cap] if len(text) > doc_cap else text
                nchars += len(doc)
                yield doc
                if nchars >= max_chars:
                    return


def merge_pair(ids, pair, new_id):
    """Replace each non-overlapping occurrence of `pair` in `ids` (left to right) by `new_id`."""
    a, b = pair
    hits = np.flatnonzero((ids[:-1] == a) & (ids[1:] == b))
    if a == b and len(hits) > 1:  # in "aaa" only the first "aa" merges
        kept, last = [], -2
        for hit in hits.tolist():
            if hit > last + 1:
                kept.append(hit)
                last = hit
        hits = np.array(kept, dtype=np.int64)
    if len(hits) == 0:
        return ids
    merged = ids.copy()
    merged[hits] = new_id
    keep = np.ones(len(ids), dtype=bool)
    keep[hits + 1] = False
    return merged[keep]


def learn_merges(text, num_merges):
    """Byte-pair merges, most frequent pair first, learned from `text`."""
    ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)
    merges = []
    for new_id in range(256, 256 + num_merges):
        if len(ids) < 2:
            break
        counts = np.bincount(ids[:-1] * PAIR_BASE + ids[1:])
        best = int(counts.argmax())
        if counts[best] < 2:
            break
        pair = divmod(best, PAIR_BASE)
        merges.append(pair)
        ids = merge_pair(ids, pair, new_id)
    return merges


class ByteBPE:
    """The fixture's stand-in for the tiktoken Encoding: byte-level BPE plus special tokens."""

    def __init__(self, merges, special_tokens):
        self.merges = [tuple(pair) for pair in merges]
        self.special_tokens = dict(special_tokens)
        self.n_vocab = 256 + len(self.merges) + len(self.special_tokens)
        self._bytes = [bytes([i]) for i in range(256)]
        for a, b in self.merges:
            self._bytes.append(self._bytes[a] + self._bytes[b])

    def encode_ordinary(self, text):
        ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)
        for offset, pair in enumerate(self.merges):
            if len(ids) < 2:
                break
            ids = merge_pair(ids, pair, 256 + offset)
        return ids.tolist()

    def token_bytes(self, token_id):
        return self._bytes[token_id] if token_id < len(self._bytes) else b""

    def decode(self, ids):
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", errors="replace")


def train_tokenizer():
    """Train the fixture's BPE tokenizer, save it as tokenizer.pkl and token_bytes.pt."""
    tokenizer_pkl = os.path.join(TOKENIZER_DIR, "tokenizer.pkl")
    token_bytes_path = os.path.join(TOKENIZER_DIR, "token_bytes.pt")

    if os.path.exists(tokenizer_pkl) and os.path.exists(token_bytes_path):
        print(f"Tokenizer: already trained at {TOKENIZER_DIR}")
        return

    os.makedirs(TOKENIZER_DIR, exist_ok=True)

    parquet_files = list_parquet_files()
    if len(parquet_files) < 2:
        print("Tokenizer: need at least 2 data shards (1 train + 1 val). Download more data first.")
        sys.exit(1)

    print("Tokenizer: training BPE tokenizer...")
    t0 = time.time()
    merges = learn_merges("\n".join(text_iterator()), VOCAB_SIZE - 256 - len(SPECIAL_TOKENS))
    special_tokens = {name: 256 + len(merges) + i for i, name in enumerate(SPECIAL_TOKENS)}
    with open(tokenizer_pkl, "wb") as f:
        pickle.dump({"merges": merges, "special_tokens": special_tokens}, f)
    print(f"Tokenizer: trained in {time.time() - t0:.1f}s, saved to {tokenizer_pkl}")

    enc = ByteBPE(merges, special_tokens)
    token_bytes_list = [len(enc.token_bytes(i)) for i in range(enc.n_vocab)]  # 0 for special tokens
    torch.save(torch.tensor(token_bytes_list, dtype=torch.int32), token_bytes_path)
    print(f"Tokenizer: saved token_bytes to {token_bytes_path}")

    test = "Hello world! Numbers: 123. Unicode: 你好"
    decoded = enc.decode(enc.encode_ordinary(test))
    assert decoded == test, f"Tokenizer roundtrip failed: {test!r} -> {decoded!r}"
    print(f"Tokenizer: sanity check passed (vocab_size={enc.n_vocab})")


# ---------------------------------------------------------------------------
# Runtime utilities (imported by train.py)
# ---------------------------------------------------------------------------


class Tokenizer:
    """Minimal tokenizer wrapper. Training is handled above."""

    def __init__(self, enc):
        self.enc = enc
        self.bos_token_id = enc.special_tokens[BOS_TOKEN]

    @classmethod
    def from_directory(cls, tokenizer_dir=TOKENIZER_DIR):
        with open(os.path.join(tokenizer_dir, "tokenizer.pkl"), "rb") as f:
            saved = pickle.load(f)
        return cls(ByteBPE(saved["merges"], saved["special_tokens"]))

    def get_vocab_size(self):
        return self.enc.n_vocab

    def get_bos_token_id(self):
        return self.bos_token_id

    def encode(self, text, prepend=None):
        if isinstance(text, str):
            rows = [self.enc.encode_ordinary(text)]
        elif isinstance(text, list):
            rows = [self.enc.encode_ordinary(t) for t in text]
        else:
            raise ValueError(f"Invalid input type: {type(text)}")
        if prepend is not None:
            rows = [[prepend, *row] for row in rows]
        return rows[0] if isinstance(text, str) else rows

    def decode(self, ids):
        return self.enc.decode(ids)


def get_device():
    return "cuda" if torch.cuda.is_available() else "cpu"


def get_token_bytes(device="cpu"):
    path = os.path.join(TOKENIZER_DIR, "token_bytes.pt")
    with open(path, "rb") as f:
        return torch.load(f, map_location=device)


def _document_batches(split, tokenizer_batch_size=128):
    """Infinite iterator over document batches from parquet files."""
    parquet_paths = list_parquet_files()
    assert len(parquet_paths) > 0, "No parquet files found. Run prepare.py first."
    val_path = os.path.join(DATA_DIR, VAL_FILENAME)
    if split == "train":
        parquet_paths = [p for p in parquet_paths if p != val_path]
        assert len(parquet_paths) > 0, "No training shards found."
    else:
        parquet_paths = [val_path]
    epoch = 1
    while True:
        for filepath in parquet_paths:
            pf = pq.ParquetFile(filepath)
            for rg_idx in range(pf.num_row_groups):
                rg = pf.read_row_group(rg_idx)
                batch = rg.column("text").to_pylist()
                for i in range(0, len(batch), tokenizer_batch_size):
                    yield batch[i : i + tokenizer_batch_size], epoch
        epoch += 1


def make_dataloader(tokenizer, B, T, split, buffer_size=64):
    """
    BOS-aligned dataloader with best-fit packing, as in the real prepare.py.
    Every row starts with BOS; when no document fits the space left, the shortest is cropped.
    """
    assert split in ["train", "val"]
    row_capacity = T + 1
    batches = _document_batches(split)
    bos_token = tokenizer.get_bos_token_id()
    doc_buffer = []
    epoch = 1
    device = get_device()

    def refill_buffer():
        nonlocal epoch
        doc_batch, epoch = next(batches)
        doc_buffer.extend(tokenizer.encode(doc_batch, prepend=bos_token))

    row_buffer = torch.empty((B, row_capacity), dtype=torch.long)
    while True:
        for row_idx in range(B):
            pos = 0
            while pos < row_capacity:
                while len(doc_buffer) < buffer_size:
                    refill_buffer()
                remaining = row_capacity - pos
                best_idx, best_len = -1, 0
                for i, doc in enumerate(doc_buffer):
                    if best_len < len(doc) <= remaining:
                        best_idx, best_len = i, len(doc)
                if best_idx >= 0:
                    doc = doc_buffer.pop(best_idx)
                    row_buffer[row_idx, pos : pos + len(doc)] = torch.tensor(doc, dtype=torch.long)
                    pos += len(doc)
                else:
                    shortest_idx = min(range(len(doc_buffer)), key=lambda i: len(doc_buffer[i]))
                    doc = doc_buffer.pop(shortest_idx)
                    row_buffer[row_idx, pos : pos + remaining] = torch.tensor(
                        doc[:remaining], dtype=torch.long
                    )
                    pos += remaining
        inputs = row_buffer[:, :-1].clone().to(device)  # contiguous, like the real loader's buffers
        targets = row_buffer[:, 1:].clone().to(device)
        yield inputs, targets, epoch


# ---------------------------------------------------------------------------
# Evaluation (DO NOT CHANGE — this is the fixed metric)
# ---------------------------------------------------------------------------


@torch.no_grad()
def evaluate_bpb(model, tokenizer, batch_size):
    """
    Bits per byte (BPB): vocab size-independent evaluation metric.
    Sums per-token cross-entropy (in nats) and target byte lengths; special tokens (0 bytes) are excluded.
    """
    token_bytes = get_token_bytes(device=get_device())
    val_loader = make_dataloader(tokenizer, batch_size, MAX_SEQ_LEN, "val")
    steps = max(1, EVAL_TOKENS // (batch_size * MAX_SEQ_LEN))
    total_nats = 0.0
    total_bytes = 0
    for _ in range(steps):
        x, y, _ = next(val_loader)
        loss_flat = model(x, y, reduction="none").view(-1)
        y_flat = y.view(-1)
        nbytes = token_bytes[y_flat]
        mask = nbytes > 0
        total_nats += (loss_flat * mask).sum().item()
        total_bytes += nbytes.sum().item()
    return total_nats / (math.log(2) * total_bytes)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Prepare data and tokenizer for autoresearch")
    parser.add_argument("--num-shards", type=int, default=10, help="training shards to download")
    args = parser.parse_args()
    print(f"Cache directory: {CACHE_DIR}")
    download_data(args.num_shards)
    train_tokenizer()
    print("Done! Ready to train.")
