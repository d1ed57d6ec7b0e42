"""The program.md mat writes into a real autoresearch workspace: the protocol, with the workspace as it is.

autoresearch's own program.md describes a machine set up by hand: data in ~/.cache/autoresearch, "run
`uv run prepare.py`" (which downloads ClimbMix shards) when it is missing, a 5-minute budget and
`uv run train.py`. None of that holds in a workspace mat prepared, and an agent that follows it mixes
downloaded web text into the user's corpus. So, unless autoresearch.program_md names a file of the user's,
mat replaces it with this text: the real paths, the budget mat set, the exact command mat runs, and
autoresearch's rules (edit only train.py, no new packages, the simplicity criterion, results.tsv).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

PROGRAM_MD = """\
# autoresearch (workspace prepared by mat)

This is an experiment to have the LLM do its own research: change `train.py` so that `val_bpb` goes down.
mat cloned {repo} (branch `{branch}`, commit {commit}) and prepared this workspace; this file describes
it as it is and replaces the repository's own program.md, whose set-up steps (data in
`~/.cache/autoresearch`, running `prepare.py` to download it, a 5-minute budget) do not apply here.

## The workspace

- Data: `{data_dir}` holds {train_shards} training shard(s) made from your corpus and the pinned
  validation shard `{val_filename}`. They are fixed inputs: mat checks and restores them before every
  training run, so files added there are removed and never trained on.
- Tokenizer: `{tokenizer_dir}` (`tokenizer.pkl`, `token_bytes.pt`), trained on this corpus; fixed too.
- Downloads are disabled: the download functions of `prepare.py` raise. Do not run `prepare.py`; there is
  nothing to download and nothing to prepare.
- Budget: `TIME_BUDGET = {train_time}` seconds of training per run (set in `prepare.py` by mat). A run that
  takes much longer than that (about twice the budget) is killed and counted as a crash.
- The command mat runs, in this directory: `{command} > run.log 2>&1`. Send all output to `run.log`;
  do not pipe it through `tee`.

## Rules

- Edit only `train.py`: the model, the optimizer, the hyperparameters, the training loop are all fair game.
- `prepare.py` is fixed: it holds the data loader, the tokenizer and `evaluate_bpb`, the metric. mat
  reverts edits to any file other than `train.py` and notes them in the report.
- Do not install or add packages; use what the workspace already imports.
- A run prints a summary block after a `---` line; `val_bpb` there is the result (lower is better). No
  `val_bpb` in `run.log` means the run crashed: read the end of the log.
- Simplicity: a tiny gain that adds ugly complexity is not worth it; removing code for an equal or better
  result is a win.
- Log every run in `results.tsv` (tab-separated, not committed):
  `commit	val_bpb	memory_gb	status	description`, with status `keep`, `discard` or `crash`. Keep the
  commit if `val_bpb` improved, otherwise reset to the previous one.
"""


@dataclass(frozen=True)
class WorkspaceFacts:
    """What program.md says about a prepared workspace."""

    repo: str
    branch: str
    commit: str
    data_dir: Path
    val_filename: str
    train_shards: int
    tokenizer_dir: Path
    train_time_s: int
    train_command: list[str]


def render_program_md(facts: WorkspaceFacts) -> str:
    """program.md for the workspace `facts` describe."""
    return PROGRAM_MD.format(
        repo=facts.repo,
        branch=facts.branch,
        commit=facts.commit[:12],
        data_dir=facts.data_dir,
        train_shards=facts.train_shards,
        val_filename=facts.val_filename,
        tokenizer_dir=facts.tokenizer_dir,
        train_time=facts.train_time_s,
        command=shlex.join(facts.train_command),
    )
