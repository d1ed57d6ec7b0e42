"""Score a checkpoint apart from the training run that wrote it. A script: mat runs it, never imports it.

    python -I score_checkpoint.py <spec.json> <model_dir>

It needs only the standard library, numpy and torch, so it also runs in an autoresearch workspace's own
environment. Two processes, so that no code of the experiment runs where the loss is computed:

    scorer (this process)                      model host (`--host`, started by the scorer)
    reads spec.json, deletes it                imports <model_dir>/train.py as a module named `train`
    starts the host                            (so training under `if __name__ == "__main__":` does not
    loads the base commit's prepare.py,        run), calls build_model(), loads <model_dir>/checkpoint.pt
    one module per scoring split               with weights_only=True, moves it to CUDA when there is one
    evaluate_bpb(proxy, ...) for each split:   answers each batch of input tokens with the model's logits;
      proxy(x) sends x, gets the logits        never sees targets, the spec or the data paths
      the base code computes the loss
    causality check on the first batch
    writes the result JSON named by the spec

spec.json: {"call": "builtin" | "autoresearch", "prepare": path of the base prepare.py copy,
            "splits": {name: data directory holding val.bin, or null for prepare.py's own},
            "batch_size": int, "result": path, "seed": int}
result:    {"ok": true, "device": ..., "scores": {name: bpb}, "causality": {...}, "seconds": ...}
           or {"ok": false, "error": "..."}

The causality check sends the first batch again with every byte from a random cut onwards replaced and
the rows shuffled: an honest language model's logits before the cut do not change. A model that reads
later bytes of its input (no causal mask) would score far too well; this check catches it.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import json
import math
import os
import struct
import subprocess
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

FRAME = struct.Struct("<cQ")  # kind, payload length
SHAPE = struct.Struct("<III")
TOLERANCE = {"cpu": (1e-3, 1e-3), "cuda": (5e-2, 2e-2)}  # (absolute, relative to the largest logit)


class ScoringError(Exception):
    """A problem with the model or checkpoint under test, reported as the result's error."""


# ---------------------------------------------------------------- frames over pipes


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_exact(fd: int, size: int) -> bytes:
    chunks: list[bytes] = []
    while size:
        chunk = os.read(fd, min(size, 1 << 22))
        if not chunk:
            raise EOFError("the other process closed the pipe")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def send(fd: int, kind: bytes, payload: bytes = b"") -> None:
    write_all(fd, FRAME.pack(kind, len(payload)) + payload)


def receive(fd: int) -> tuple[bytes, bytes]:
    kind, size = FRAME.unpack(read_exact(fd, FRAME.size))
    return kind, read_exact(fd, size)


# ---------------------------------------------------------------- the model host


def load_model(model_dir: Path) -> tuple[Any, str]:
    """train.build_model() with the checkpoint's weights, in eval mode on CUDA or the CPU."""
    import torch

    os.chdir(model_dir)
    sys.path.insert(0, str(model_dir))
    sys.argv = [str(model_dir / "train.py")]
    spec = importlib.util.spec_from_file_location("train", model_dir / "train.py")
    if spec is None or spec.loader is None:
        raise ScoringError("train.py cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules["train"] = module
    spec.loader.exec_module(module)
    build = getattr(module, "build_model", None)
    if not callable(build):
        raise ScoringError("train.py has no build_model() function, which the harness builds the model with")
    model = build()
    if not isinstance(model, torch.nn.Module):
        raise ScoringError(f"build_model() returned {type(model).__name__}, not a torch.nn.Module")
    state = torch.load(model_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
    weights = state.get("model") if isinstance(state, dict) else None
    if not isinstance(weights, dict):
        raise ScoringError(
            "checkpoint.pt holds no {'model': state_dict}: save it with save_checkpoint(model)"
        )
    try:
        model.load_state_dict(weights)
    except RuntimeError as exc:
        raise ScoringError(f"the checkpoint does not fit the model build_model() makes: {exc}") from exc
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return model.to(device).eval(), device


def model_logits(model: Any, inputs: Any, device: str) -> Any:
    """The model's logits for a batch of inputs, as float32 on the CPU, checked to be (B, T, vocab)."""
    import torch

    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        out = model(inputs.to(device))
    if isinstance(out, tuple | list) and out:
        out = out[0]
    if not isinstance(out, torch.Tensor) or out.dim() != 3 or tuple(out.shape[:2]) != tuple(inputs.shape):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ScoringError(f"model(x) must return logits of shape (batch, seq, vocab); it returned {shape}")
    return out.float().cpu().contiguous()


def host_main(model_dir: Path, inbox: int, outbox: int) -> None:
    """Load the model, say so, then answer input batches with logits until told to quit."""
    import numpy as np
    import torch

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1") or "1")))
    try:
        model, device = load_model(model_dir)
    except BaseException as exc:  # the experiment's code may raise anything, SystemExit included
        traceback.print_exc()
        send(outbox, b"E", describe(exc).encode("utf-8", "replace"))
        return
    send(outbox, b"R", device.encode())
    while True:
        kind, payload = receive(inbox)
        if kind != b"X":
            return
        batch, seq, _ = SHAPE.unpack_from(payload)
        tokens = np.frombuffer(payload, dtype=np.int64, offset=SHAPE.size).reshape(batch, seq)
        try:
            logits = model_logits(model, torch.from_numpy(tokens.copy()), device)
        except BaseException as exc:
            traceback.print_exc()
            send(outbox, b"E", describe(exc).encode("utf-8", "replace"))
            return
        send(outbox, b"L", SHAPE.pack(*logits.shape) + logits.numpy().tobytes())


def describe(exc: BaseException) -> str:
    """One line for an exception: its type and message."""
    if isinstance(exc, SystemExit):
        return f"train.py exited while being imported (code {exc.code}); keep training under __main__"
    text = " ".join(str(exc).split())
    return text if isinstance(exc, ScoringError) else f"{type(exc).__name__}: {text}"[:2000]


# ---------------------------------------------------------------- the scorer


class Host:
    """The model host process, seen from the scorer: send inputs, get logits."""

    def __init__(self, model_dir: Path) -> None:
        to_host_read, self.to_host = os.pipe()
        self.from_host, from_host_write = os.pipe()
        env = {k: v for k, v in os.environ.items() if not k.startswith("MAT_")}
        command = [sys.executable, "-I", __file__, "--host", str(model_dir), str(to_host_read)]
        self.process = subprocess.Popen(
            [*command, str(from_host_write)],
            pass_fds=(to_host_read, from_host_write),
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=model_dir,
        )
        os.close(to_host_read)
        os.close(from_host_write)
        self.device = ""

    def wait_ready(self) -> str:
        kind, payload = self.answer()
        self.device = payload.decode()
        return self.device

    def answer(self) -> tuple[bytes, bytes]:
        try:
            kind, payload = receive(self.from_host)
        except EOFError:
            raise ScoringError(
                f"the process loading train.py's model exited (code {self.process.wait()}); see the log"
            ) from None
        if kind == b"E":
            raise ScoringError(f"train.py's model could not be scored: {payload.decode('utf-8', 'replace')}")
        return kind, payload

    def logits(self, inputs: Any) -> Any:
        import numpy as np
        import torch

        tokens = inputs.detach().to("cpu", torch.int64).contiguous()
        send(self.to_host, b"X", SHAPE.pack(*tokens.shape, 0) + tokens.numpy().tobytes())
        _, payload = self.answer()
        shape = SHAPE.unpack_from(payload)
        if tuple(shape[:2]) != tuple(tokens.shape) or len(payload) != SHAPE.size + 4 * math.prod(shape):
            raise ScoringError(f"the model process answered {tuple(tokens.shape)} inputs with {shape} logits")
        values = np.frombuffer(payload, dtype=np.float32, offset=SHAPE.size).reshape(shape)
        return torch.from_numpy(values.copy())

    def close(self) -> None:
        with contextlib.suppress(OSError):
            send(self.to_host, b"Q")
        os.close(self.to_host)
        os.close(self.from_host)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def proxy_model(host: Host) -> Any:
    """A torch module whose forward asks the host for logits, so evaluate_bpb(proxy, ...) scores the host's.

    Called as model(x) it returns the logits; as model(x, y, reduction=...) (autoresearch's form) it
    returns the cross-entropy computed here, from those logits.
    """
    import torch
    import torch.nn.functional as F

    class HostModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(1), requires_grad=False)  # evaluate_bpb's device
            self.first: tuple[Any, Any] | None = None

        def forward(self, x: Any, targets: Any = None, reduction: str = "mean") -> Any:
            logits = host.logits(x)
            if self.first is None:
                self.first = (x.detach().cpu().clone(), logits.clone())
            logits = logits.to(x.device)
            if targets is None:
                return logits
            flat = logits.reshape(-1, logits.size(-1))
            return F.cross_entropy(flat, targets.reshape(-1), ignore_index=-1, reduction=reduction)

    return HostModel()


def load_prepare(path: Path, name: str, data_dir: str | None) -> ModuleType:
    """A fresh module from the base prepare.py copy; DATA_DIR points at `data_dir` when given."""
    loader = importlib.machinery.SourceFileLoader(f"mat_base_prepare_{name}", str(path))  # any file name
    module = ModuleType(loader.name)
    module.__file__ = str(path)
    loader.exec_module(module)
    if data_dir is not None:
        setattr(module, "DATA_DIR", Path(data_dir))  # noqa: B010 (a module attribute mypy cannot know)
    return module


def evaluate(call: str, prepare: ModuleType, model: Any, batch_size: int) -> float:
    """The base evaluate_bpb, called the way its workspace kind defines it."""
    if call == "autoresearch":
        return float(prepare.evaluate_bpb(model, prepare.Tokenizer.from_directory(), batch_size))
    return float(prepare.evaluate_bpb(model, batch_size))


def causality(host: Host, first: tuple[Any, Any], seed: int) -> dict[str, Any]:
    """Send the first batch again with its tail replaced (rows shuffled); the logits before the cut must not
    change. Returns the cut, the largest change and whether it is within tolerance."""
    import torch

    inputs, logits = first
    batch, seq = inputs.shape
    if seq < 2:
        return {"checked": False, "passed": True}
    generator = torch.Generator().manual_seed(seed)
    cut = int(torch.randint(1, seq, (1,), generator=generator))
    changed = inputs.clone()
    shift = 1 + int(torch.randint(0, 7, (1,), generator=generator))
    changed[:, cut:] = (inputs[:, cut:] + shift) % logits.size(-1)
    order = torch.randperm(batch, generator=generator)
    again = host.logits(changed[order])[torch.argsort(order)]
    difference = float((again[:, :cut] - logits[:, :cut]).abs().max())
    absolute, relative = TOLERANCE.get(host.device, TOLERANCE["cuda"])
    tolerance = absolute + relative * float(logits[:, :cut].abs().max())
    passed = math.isfinite(difference) and difference <= tolerance
    return {
        "checked": True,
        "cut": cut,
        "max_difference": difference,
        "tolerance": tolerance,
        "passed": passed,
    }


def score(spec: dict[str, Any], model_dir: Path) -> dict[str, Any]:
    """Start the host, score every split with the base evaluator, check causality; the result dict."""
    started = time.monotonic()
    host = Host(model_dir)
    try:
        modules = {
            name: load_prepare(Path(spec["prepare"]), name, data_dir)
            for name, data_dir in spec["splits"].items()
        }
        device = host.wait_ready()
        proxy = proxy_model(host)
        batch_size = int(spec["batch_size"])
        scores = {name: evaluate(spec["call"], module, proxy, batch_size) for name, module in modules.items()}
        if proxy.first is None:
            raise ScoringError("the evaluation never called the model")
        check = causality(host, proxy.first, int(spec["seed"]))
    finally:
        host.close()
    return {
        "ok": True,
        "device": device,
        "scores": scores,
        "causality": check,
        "seconds": round(time.monotonic() - started, 3),
    }


def scorer_main(spec_path: Path, model_dir: Path) -> int:
    """Read and delete the spec, score, write the result; 0 when scored (whatever the scores), else 1."""
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    spec_path.unlink()
    try:
        result = score(spec, model_dir)
    except BaseException as exc:
        traceback.print_exc()
        result = {"ok": False, "error": describe(exc)}
    partial = Path(spec["result"] + ".tmp")
    partial.write_text(json.dumps(result), encoding="utf-8")
    os.replace(partial, spec["result"])
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    if sys.argv[1] == "--host":
        host_main(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
        sys.stdout.flush()
        os._exit(0)  # whatever train.py left running (threads, atexit hooks) must not keep the host alive
    sys.exit(scorer_main(Path(sys.argv[1]), Path(sys.argv[2]).resolve()))
