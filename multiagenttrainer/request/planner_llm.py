"""The planner LLM: a command (or preset) that turns free text into a request and checks the policy.

    request.planner_command: preset:claude            # or any command line with {prompt} / {prompt_file}

The command runs like an agent command (agents/command.py): `bash -c`, its own process group and scope,
stdin closed, at most `request.planner_timeout` seconds; its standard output is the answer (standard
error goes to a log beside the prompt). Answers are YAML, alone or in one ```yaml fenced block.

- Free text -> a request: the answer is validated exactly like a request file (exit 2 on problems,
  naming the saved answer's lines).
- Policy: the answer must be `decision: allow|refuse` and `reasons: [...]` (at least one reason to
  refuse) and nothing else. Anything else (a failing command, prose, a missing or unknown decision) is
  a PlannerError: an unreadable answer never approves a request.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import yaml

from multiagenttrainer.agents.command import read_bounded, run_in_group, substitute
from multiagenttrainer.config.yaml_input import parse_yaml_with_lines
from multiagenttrainer.errors import ConfigError, PlannerError
from multiagenttrainer.request.schema import TASKS, RequestSpec, parse_request_text

PRESET_PREFIX = "preset:"
PLANNER_PRESETS: dict[str, str] = {
    "claude": "claude -p {prompt} --output-format text",
    "codex": "codex exec --sandbox read-only {prompt}",
}
KILL_GRACE_S = 5.0
FENCE = re.compile(r"```(?:ya?ml)?[ \t]*\n(.*?)```", re.DOTALL)
TEXT_HEADER = "mat request: turn a description into a request"
POLICY_HEADER = "mat request: check a request against the policy"
MAX_ANSWER_CHARS = 200_000


def planner_line(command: str) -> str:
    """The command line to run: `preset:NAME` expands to PLANNER_PRESETS[NAME]."""
    text = command.strip()
    if not text.startswith(PRESET_PREFIX):
        return text
    preset = text[len(PRESET_PREFIX) :].strip()
    if preset not in PLANNER_PRESETS:
        valid = ", ".join(PRESET_PREFIX + name for name in PLANNER_PRESETS)
        raise ConfigError(
            f"request.planner_command: unknown preset {preset!r}; use one of {valid} or a command"
        )
    return PLANNER_PRESETS[preset]


def ask(command: str, prompt: str, folder: Path, label: str, timeout_s: float) -> str:
    """Run the planner on `prompt` (saved as <folder>/<label>.md) and return what it printed."""
    folder.mkdir(parents=True, exist_ok=True)
    prompt_file = folder / f"{label}.md"
    prompt_file.write_text(prompt, encoding="utf-8")
    stderr_log = folder / f"{label}.stderr.log"
    # A newline, not `;`, closes the group: a command ending in a # comment must not swallow it.
    line = f"{{ {substitute(planner_line(command), prompt, prompt_file)}\n}} 2>{quote(stderr_log)}"
    with tempfile.TemporaryFile() as output:
        run = run_in_group(line, folder, dict(os.environ), output, timeout_s, KILL_GRACE_S)
        answer = read_bounded(output)
    (folder / f"{label}.answer.txt").write_text(answer, encoding="utf-8")
    if run.timed_out:
        raise PlannerError(
            f"the planner command ran past request.planner_timeout ({timeout_s:g} s) and was stopped"
        )
    if run.exit_code != 0:
        raise PlannerError(
            f"the planner command exited with code {run.exit_code}; its error output is in {stderr_log}; "
            "fix request.planner_command"
        )
    return answer[:MAX_ANSWER_CHARS]


def quote(path: Path) -> str:
    return "'" + str(path).replace("'", "'\\''") + "'"


def yaml_of(answer: str) -> str:
    """The YAML in an answer: its first fenced block, else all of it."""
    fenced = FENCE.search(answer)
    return fenced.group(1) if fenced else answer


# --------------------------------------------------------------------------- free text -> request


def text_prompt(text: str, source_names: list[str]) -> str:
    """What the planner is asked to turn `text` into."""
    sources = ", ".join(source_names) or "(none configured)"
    return f"""{TEXT_HEADER}

You turn the description of a model someone needs into a MultiAgentTrainer request. Answer with YAML
only, in this shape; leave out every key the description does not give a value for:

task: code-completion          # one of: {", ".join(TASKS)}
description: one line saying what the model is for
data:
  sources: [name]              # configured sources: {sources}
  repos: [owner/repo]          # other repositories to learn from
requirements:
  quality: {{max_eval_loss: 2.0, max_perplexity: 8.0, min_improvement_pct: 5}}
  size: {{max_params: 1000000000, max_gpu_memory_gb: 24}}
  speed: {{latency_tokens: 32, p95_latency_ms: 500, min_tokens_per_s: 20}}
  budget: {{max_wall_time_s: 3600, max_gpu_hours: 1, max_bedrock_usd: 0}}
allowed_licenses: [MIT, Apache-2.0]

The description:
<<<
{text}
>>>
"""


def request_from_text(
    command: str, text: str, source_names: list[str], folder: Path, timeout_s: float
) -> tuple[RequestSpec, str]:
    """The planner's request for `text`, validated like a file (its answer saved as request.yaml)."""
    answer = yaml_of(ask(command, text_prompt(text, source_names), folder / "planner", "request", timeout_s))
    saved = folder / "request.yaml"
    saved.write_text(answer, encoding="utf-8")
    try:
        return parse_request_text(answer, str(saved)), answer
    except ConfigError as exc:
        raise ConfigError([f"the planner's request is not valid: {p}" for p in exc.problems]) from None


# --------------------------------------------------------------------------- the policy


def policy_prompt(spec: RequestSpec, rules: list[str]) -> str:
    """What the planner is asked when it checks the request against the policy."""
    listed = "\n".join(f"{number}. {rule}" for number, rule in enumerate(rules, start=1))
    request = yaml.safe_dump(spec.to_yaml_dict(), sort_keys=False)
    return f"""{POLICY_HEADER}

Check the request below against the policy. Refuse it if it breaks any rule. Answer with YAML only,
exactly these two keys:

decision: allow                # or: refuse
reasons: []                    # to refuse: one line per rule broken, naming the rule

The policy:
{listed}

The request:
{request}"""


def parse_policy_answer(answer: str) -> tuple[bool, list[str]]:
    """(allowed, reasons) from a policy answer; PlannerError for anything but the exact shape."""
    try:  # the config's bounded reader: an answer is untrusted (alias bombs, depth, size)
        data: dict[str, Any] = parse_yaml_with_lines(yaml_of(answer), "<planner answer>")[0]
    except ConfigError as exc:
        raise policy_error(f"not a YAML mapping: {exc.problems[0]}") from None
    if set(data) != {"decision", "reasons"}:
        raise policy_error("expected exactly the keys `decision` and `reasons`")
    decision, reasons = data["decision"], data["reasons"]
    if decision not in ("allow", "refuse"):
        raise policy_error(f"decision must be allow or refuse, not {str(decision)[:40]!r}")
    if not isinstance(reasons, list) or not all(isinstance(r, str) and r.strip() for r in reasons):
        raise policy_error("reasons must be a list of lines of text")
    if decision == "refuse" and not reasons:
        raise policy_error("a refusal must give at least one reason")
    return decision == "allow", [" ".join(r.split()) for r in reasons]


def policy_error(problem: str) -> PlannerError:
    return PlannerError(
        f"the planner's policy answer is not valid ({problem}); the request was not approved; "
        "check request.planner_command"
    )


def check_policy(
    command: str, spec: RequestSpec, rules: list[str], folder: Path, timeout_s: float
) -> tuple[bool, list[str]]:
    """Ask the planner whether the request breaks a rule: (allowed, reasons)."""
    answer = ask(command, policy_prompt(spec, rules), folder / "planner", "policy", timeout_s)
    return parse_policy_answer(answer)
