"""The open-source fine-tuning backend: transformers + PEFT LoRA + TRL SFTTrainer, run in this process.

The corpus becomes `text` records (continued pretraining: the loss covers every token). A job loads
the base model from a hub id or a local folder, trains a LoRA adapter, and writes the adapter and
tokenizer to `<output_dir>/<job-id>/`, checkpoints to `<output_dir>/<job-id>/checkpoints`. Restarting
a job id resumes from its last checkpoint. Progress and status live in the JobStore record; a
`CANCEL` marker file in the job folder stops training at the next step.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import xxhash

from multiagenttrainer.atomic import write_atomically
from multiagenttrainer.clock import now_iso
from multiagenttrainer.config import OpenSourceConfig
from multiagenttrainer.corpus.records import corpus_file, iter_training_records
from multiagenttrainer.errors import BackendError, ConfigError, CorpusError
from multiagenttrainer.finetune.base import (
    DEFAULT_TARGET,
    FineTuner,
    JobRecord,
    JobStatus,
    JobStore,
    PreparedDataset,
    safe_name,
)
from multiagenttrainer.processes import pid_alive

CANCEL_MARKER = "CANCEL"
CHECKPOINTS_DIR = "checkpoints"
PROGRESS_SAVE_INTERVAL_S = 1.0


# --------------------------------------------------------------------------- QLoRA gate


def check_4bit_supported(cfg: OpenSourceConfig) -> None:
    """ConfigError when use_4bit is set without bitsandbytes or CUDA; call before loading any model."""
    if not cfg.use_4bit:
        return
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigError(
            "finetuner.opensource.use_4bit: QLoRA needs the 'bitsandbytes' package, which is not installed; "
            "install it on a CUDA machine or set use_4bit: false"
        )
    if not cuda_available():
        raise ConfigError(
            "finetuner.opensource.use_4bit: QLoRA needs an NVIDIA GPU with CUDA and none is visible on this "
            "machine; set use_4bit: false here (keep it true only for targets that run on a GPU)"
        )


def cuda_available() -> bool:
    """Whether torch sees a CUDA device."""
    import torch

    return bool(torch.cuda.is_available())


# --------------------------------------------------------------------------- dataset


def read_corpus_records(corpus_path: Path) -> list[dict[str, Any]]:
    """The records of corpus.jsonl (given, in a corpus folder, beside corpus.txt) or of a plain text file."""
    return list(iter_training_records(corpus_path))


def split_texts(records: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """Train and validation texts; records without text are dropped, split defaults to train."""
    train: list[str] = []
    val: list[str] = []
    for record in records:
        text = record.get("text")
        if not isinstance(text, str) or not text.strip():
            continue
        (val if record.get("split") == "val" else train).append(text)
    return train, val


def write_text_jsonl(path: Path, texts: list[str]) -> None:
    """Write `{"text": ...}` lines, atomically."""

    def write(handle: IO[bytes]) -> None:
        for text in texts:
            handle.write((json.dumps({"text": text}, ensure_ascii=False) + "\n").encode("utf-8"))

    write_atomically(path, write)


def read_text_jsonl(path: Path) -> list[str]:
    """The `text` values of a prepared JSONL file (empty when the file does not exist)."""
    if not path.is_file():
        return []
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line)["text"] for line in handle if line.strip()]


# --------------------------------------------------------------------------- evaluation


def evaluate_loss(model: Any, tokenizer: Any, texts: list[str], max_length: int) -> float:
    """Mean next-token loss over the texts, concatenated with EOS and cut into max_length blocks."""
    import torch

    blocks = pack_token_blocks(tokenizer, texts, max_length)
    if not blocks:
        raise BackendError("cannot evaluate: the validation texts produce fewer than 2 tokens")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total_loss, total_tokens = 0.0, 0
    with torch.no_grad():
        for block in blocks:  # blocks differ in length only for the last one; one at a time keeps it exact
            ids = torch.tensor([block], device=device)
            loss = model(input_ids=ids, labels=ids).loss
            predicted = len(block) - 1
            total_loss += float(loss) * predicted
            total_tokens += predicted
    if was_training:
        model.train()
    return total_loss / total_tokens


def pack_token_blocks(tokenizer: Any, texts: list[str], max_length: int) -> list[list[int]]:
    """Token ids of the texts (each ending in EOS) cut into max_length blocks of at least 2 tokens."""
    ids: list[int] = []
    eos = tokenizer.eos_token_id
    for text in texts:
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        if eos is not None:
            ids.append(eos)
    blocks = [ids[i : i + max_length] for i in range(0, len(ids), max_length)]
    return [block for block in blocks if len(block) >= 2]


def perplexity(loss: float) -> float:
    """exp(loss), capped so JSON never holds infinity."""
    return math.exp(min(loss, 50.0))


# --------------------------------------------------------------------------- the backend


class OpenSourceFineTuner(FineTuner):
    """LoRA (or QLoRA on CUDA) fine-tuning with TRL's SFTTrainer, blocking in this process."""

    backend = "opensource"

    def __init__(self, cfg: OpenSourceConfig, store: JobStore, target: str = DEFAULT_TARGET) -> None:
        super().__init__(store, target)
        self.cfg = cfg
        self.output_dir = Path(cfg.output_dir)

    def describe(self) -> str:
        """One line: backend, model and the settings that matter."""
        cfg = self.cfg
        mode = "QLoRA 4-bit" if cfg.use_4bit else "LoRA"
        steps = f"max_steps={cfg.max_steps}" if cfg.max_steps > 0 else f"epochs={cfg.num_epochs:g}"
        return (
            f"opensource {mode} on {cfg.model_id} (r={cfg.lora_r}, alpha={cfg.lora_alpha}, {steps}, "
            f"batch={cfg.batch_size}x{cfg.gradient_accumulation_steps}, max_length={cfg.max_length}, "
            f"lr={cfg.learning_rate:g}) -> {self.output_dir}"
        )

    def job_dir(self, job_id: str) -> Path:
        """Where a job's adapter, tokenizer, checkpoints and cancel marker live."""
        return self.output_dir / safe_name(job_id)

    def prepare_dataset(self, corpus_path: Path) -> PreparedDataset:
        """Write train.jsonl / val.jsonl of `text` records under <output_dir>/datasets/<corpus hash>/."""
        source = corpus_file(corpus_path)
        train, val = split_texts(read_corpus_records(source))
        if not train:
            raise CorpusError(f"{source} has no training text; check the sources and run `mat ingest` again")
        digest = xxhash.xxh64(source.read_bytes()).hexdigest()
        folder = self.output_dir / "datasets" / digest
        write_text_jsonl(folder / "train.jsonl", train)
        write_text_jsonl(folder / "val.jsonl", val)
        return PreparedDataset(
            location=str(folder),
            train_records=len(train),
            val_records=len(val),
            details={"format": "text", "corpus": str(source), "train_chars": sum(map(len, train))},
        )

    def start_job(self, dataset: PreparedDataset, job_name: str, job_id: str | None = None) -> JobRecord:
        """Train a LoRA adapter and block until done; a known job_id resumes from its last checkpoint."""
        check_4bit_supported(self.cfg)
        record = self._record_for(dataset, job_name, job_id)
        self.job_dir(record.id).joinpath(CANCEL_MARKER).unlink(missing_ok=True)
        record.status, record.started_at, record.finished_at = "running", now_iso(), None
        record.error, record.pid = None, os.getpid()
        self.store.save(record)
        try:
            outcome = run_training(self, record, dataset)
        except BackendError as exc:
            return self._finish(record, "failed", str(exc), exc)
        except Exception as exc:  # a third-party failure: translated at this boundary
            message = f"job {record.id}: training failed: {type(exc).__name__}: {exc}"
            return self._finish(record, "failed", message, BackendError(message))
        return self._finish(record, outcome, None, None)

    def get_status(self, job_id: str) -> JobRecord:
        """The job's record from the store."""
        return self.store.get(job_id)

    def cancel_job(self, job_id: str) -> JobRecord:
        """Write the cancel marker: a running job stops at its next step, other unfinished jobs end now."""
        record = self.store.get(job_id)
        if record.finished:
            return record
        marker = self.job_dir(record.id) / CANCEL_MARKER
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(now_iso(), encoding="utf-8")
        if record.status == "running" and process_alive(record.pid):
            return record
        record.status, record.finished_at = "cancelled", now_iso()
        return self.store.save(record)

    def _record_for(self, dataset: PreparedDataset, job_name: str, job_id: str | None) -> JobRecord:
        """The existing record for job_id (a restart) or a new pending one."""
        if job_id is not None:
            existing = [r for r in self.store.all() if r.id == job_id and r.target == self.target]
            if existing:
                refuse_if_running_elsewhere(existing[0])
                existing[0].dataset = dataset_summary(dataset)
                return existing[0]
        new_id = job_id or new_job_id(job_name)
        record = JobRecord(
            id=new_id,
            backend=self.backend,
            target=self.target,
            model=self.cfg.model_id,
            status="pending",
            name=job_name,
            output_path=str(self.job_dir(new_id)),
            dataset=dataset_summary(dataset),
        )
        return self.store.save(record)

    def _finish(
        self, record: JobRecord, status: JobStatus, error: str | None, exc: BackendError | None
    ) -> JobRecord:
        """Save the final status (re-reading progress written meanwhile); raise exc for failures."""
        latest = self.store.get(record.id)
        latest.status = status
        latest.error, latest.finished_at, latest.pid = error, now_iso(), None
        latest.metrics = {**latest.metrics, **record.metrics}
        self.store.save(latest)
        if exc is not None:
            raise exc
        return latest


def dataset_summary(dataset: PreparedDataset) -> dict[str, Any]:
    """What a job record keeps about its dataset."""
    return {key: getattr(dataset, key) for key in ("location", "train_records", "val_records")}


def refuse_if_running_elsewhere(record: JobRecord) -> None:
    """BackendError when another live process is training this job (both would write its checkpoints)."""
    if record.status == "running" and record.pid != os.getpid() and process_alive(record.pid):
        raise BackendError(
            f"job {record.id} is already running in process {record.pid}; wait for it or "
            f"`mat finetune cancel {record.id}` first"
        )


def new_job_id(job_name: str) -> str:
    """A unique, file-safe job id: the name, a UTC timestamp and a short random suffix."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return f"{safe_name(job_name or 'job')}-{stamp}-{uuid.uuid4().hex[:6]}"


def process_alive(pid: int | None) -> bool:
    """Whether a process with this id exists."""
    return pid_alive(pid or 0)


def cancel_requested(job_dir: Path) -> bool:
    """Whether cancel_job has left its marker in the job folder."""
    return (job_dir / CANCEL_MARKER).exists()


# --------------------------------------------------------------------------- training (heavy imports inside)


def run_training(tuner: OpenSourceFineTuner, record: JobRecord, dataset: PreparedDataset) -> JobStatus:
    """Load, measure, train, measure, save; returns "completed" or "cancelled"."""
    from datasets import Dataset
    from trl.trainer.sft_trainer import SFTTrainer

    cfg, job_dir = tuner.cfg, tuner.job_dir(record.id)
    train_texts = read_text_jsonl(Path(dataset.location) / "train.jsonl")
    val_texts = read_text_jsonl(Path(dataset.location) / "val.jsonl")
    if not train_texts:
        raise BackendError(
            f"job {record.id}: no train.jsonl records in {dataset.location}; prepare the dataset again"
        )
    tokenizer, model = load_base(cfg)
    check_one_sequence(tokenizer, train_texts, record.id)
    args = build_sft_config(cfg, job_dir / CHECKPOINTS_DIR, has_eval=bool(val_texts))
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list([{"text": t} for t in train_texts]),
        eval_dataset=Dataset.from_list([{"text": t} for t in val_texts]) if val_texts else None,
        processing_class=tokenizer,
        peft_config=build_lora_config(cfg),
        callbacks=[make_job_callback_class()(tuner.store, record, job_dir, args)],
    )
    checkpoint = last_checkpoint(job_dir / CHECKPOINTS_DIR)
    record.metrics["resumed_from"] = Path(checkpoint).name if checkpoint else None
    if val_texts and "eval_loss_before" not in record.metrics:
        record_eval(record, "before", evaluate_loss(trainer.model, tokenizer, val_texts, cfg.max_length))
    trainer.train(resume_from_checkpoint=checkpoint)
    if cancel_requested(job_dir):
        return "cancelled"
    if val_texts:
        record_eval(record, "after", evaluate_loss(trainer.model, tokenizer, val_texts, cfg.max_length))
    trainer.save_model(str(job_dir))
    tokenizer.save_pretrained(str(job_dir))
    return "completed"


def check_one_sequence(tokenizer: Any, texts: list[str], job_id: str) -> None:
    """BackendError when the training text is too small for one sequence (2 tokens: an input and its next)."""
    tokens = 0
    eos = 0 if tokenizer.eos_token_id is None else 1  # each text ends with EOS when there is one
    for text in texts:
        tokens += len(tokenizer(text, add_special_tokens=False)["input_ids"]) + eos
        if tokens >= 2:
            return
    raise BackendError(
        f"job {job_id}: the training text is too small for one training sequence: it makes {tokens} "
        "tokens and a sequence needs 2 (an input and the token after it); add text to the corpus"
    )


def last_checkpoint(checkpoints: Path) -> str | None:
    """The newest complete checkpoint folder of a job, or None before its first save."""
    from transformers.trainer_utils import get_last_checkpoint

    if not checkpoints.is_dir():
        return None
    found: str | None = get_last_checkpoint(str(checkpoints))  # type: ignore[no-untyped-call]
    return found


def load_base(cfg: OpenSourceConfig) -> tuple[Any, Any]:
    """Tokenizer and causal LM from cfg.model_id (hub id or local folder); BackendError naming the fix."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    on_cuda = cuda_available()
    kwargs: dict[str, Any] = {"dtype": torch.bfloat16 if on_cuda else torch.float32}
    if flash_attention_available():
        kwargs["attn_implementation"] = "flash_attention_2"  # lets packing skip padding (build_sft_config)
    if cfg.use_4bit:
        kwargs["quantization_config"] = build_4bit_config()
    try:
        tokenizer = AutoTokenizer.from_pretrained(cfg.model_id)
        model = AutoModelForCausalLM.from_pretrained(cfg.model_id, **kwargs)
    except (OSError, ValueError) as exc:
        raise BackendError(
            f"cannot load model {cfg.model_id!r}: {first_line(exc)}; set finetuner.opensource.model_id to a "
            "local model folder or a hub id you can download (`hf auth login` for gated models)"
        ) from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if cfg.use_4bit:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model)  # type: ignore[no-untyped-call]
    return tokenizer, model


def flash_attention_available() -> bool:
    """Whether FlashAttention 2 can run here (CUDA and the flash_attn package)."""
    return cuda_available() and importlib.util.find_spec("flash_attn") is not None


def build_4bit_config() -> Any:
    """NF4 double-quant settings for QLoRA, computing in bf16."""
    import torch
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(  # type: ignore[no-untyped-call]
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )


def build_lora_config(cfg: OpenSourceConfig) -> Any:
    """The PEFT LoRA settings from the config."""
    from peft import LoraConfig

    return LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=cfg.target_modules,
        task_type="CAUSAL_LM",
    )


def build_sft_config(cfg: OpenSourceConfig, checkpoints: Path, has_eval: bool) -> Any:
    """SFTConfig for continued pretraining: packing, explicit precision, CUDA extras when present."""
    from trl.trainer.sft_config import SFTConfig

    on_cuda = cuda_available()
    # "bfd" packs without padding, which is only correct when FlashAttention honours sequence boundaries;
    # with sdpa/eager attention it lets packed sequences attend to each other, so fall back to "wrapped".
    packing_strategy = "bfd" if flash_attention_available() else "wrapped"
    return SFTConfig(
        output_dir=str(checkpoints),
        max_length=cfg.max_length,
        per_device_train_batch_size=cfg.batch_size,
        per_device_eval_batch_size=cfg.batch_size,
        num_train_epochs=cfg.num_epochs,
        max_steps=cfg.max_steps,
        learning_rate=cfg.learning_rate,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        save_steps=cfg.save_steps,
        save_total_limit=2,
        eval_strategy="steps" if has_eval else "no",
        eval_steps=cfg.eval_steps,
        logging_steps=1,
        report_to="none",
        packing=True,
        packing_strategy=packing_strategy,
        use_cpu=not on_cuda,
        bf16=on_cuda,
        activation_checkpointing=on_cuda,  # saves GPU memory; pointless for small CPU runs
        use_liger_kernel=on_cuda and importlib.util.find_spec("liger_kernel") is not None,
        disable_tqdm=True,
    )


def record_eval(record: JobRecord, when: str, loss: float) -> None:
    """Store eval loss and perplexity for `before` or `after` training."""
    record.metrics[f"eval_loss_{when}"] = loss
    record.metrics[f"perplexity_{when}"] = perplexity(loss)


def first_line(exc: BaseException) -> str:
    """The first line of an exception message, for one-line errors."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def make_job_callback_class() -> type:
    """The TrainerCallback subclass, built lazily so importing this module does not import transformers."""
    from transformers import TrainerCallback

    class _JobCallback(TrainerCallback):
        """Writes progress into the job record and stops training when the cancel marker appears."""

        def __init__(self, store: JobStore, record: JobRecord, job_dir: Path, args: Any) -> None:
            self.store, self.record, self.job_dir = store, record, job_dir
            self.tokens_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
            self.tokens_per_step *= args.max_length or 0
            self.started = time.monotonic()
            self.first_step: int | None = None
            self.last_saved = 0.0
            self.loss: float | None = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.started = time.monotonic()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if logs and "loss" in logs:
                self.loss = float(logs["loss"])
            if logs and "eval_loss" in logs:
                self.record.metrics["eval_loss_last"] = float(logs["eval_loss"])

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.first_step is None:
                self.first_step = state.global_step - 1
            if cancel_requested(self.job_dir):
                control.should_training_stop = True
                control.should_save = True  # keep the work so far: a restart resumes from here
            now = time.monotonic()
            if now - self.last_saved >= PROGRESS_SAVE_INTERVAL_S or state.global_step >= state.max_steps:
                self.save_progress(state)
                self.last_saved = now

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.save_progress(state)

        def save_progress(self, state: Any) -> None:
            steps_here = state.global_step - (self.first_step or 0)
            elapsed = max(time.monotonic() - self.started, 1e-9)
            per_step = elapsed / steps_here if steps_here > 0 else None
            self.record.progress = {
                "step": state.global_step,
                "total_steps": state.max_steps,
                "loss": self.loss,
                "tokens_per_s": round(steps_here * self.tokens_per_step / elapsed, 1),
                "eta_s": round(per_step * (state.max_steps - state.global_step), 1) if per_step else None,
            }
            self.store.save(self.record)

    return _JobCallback
