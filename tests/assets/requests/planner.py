#!/usr/bin/env python3
"""A scripted planner LLM for the `mat request` tests: reads the prompt file, answers like a model would.

- "turn a description into a request": picks the task, source, licenses and memory limit out of the
  description with fixed phrases, and answers with a sentence and a ```yaml block;
- "check a request against the policy": refuses a request whose description mentions malware;
  with PLANNER_BROKEN=1 in the environment it answers prose instead of the YAML asked for.
"""

import os
import re
import sys


def request_yaml(description: str) -> str:
    task = "code-completion" if "code completion" in description else "causal-lm"
    lines = [f"task: {task}", f"description: {description.splitlines()[0][:120]}"]
    source = re.search(r"on the (\w+) source", description)
    if source:
        lines += ["data:", f"  sources: [{source.group(1)}]"]
    memory = re.search(r"fits in ([\d.]+) GB", description)
    if memory:
        lines += ["requirements:", "  size:", f"    max_gpu_memory_gb: {memory.group(1)}"]
    licenses = re.search(r"licensed (.+?) only", description)
    if licenses:
        lines.append(f"allowed_licenses: [{', '.join(licenses.group(1).split(' or '))}]")
    return "\n".join(lines) + "\n"


def policy_answer(prompt: str) -> str:
    if os.environ.get("PLANNER_BROKEN") == "1":
        return "Looks fine to me!"
    if "malware" in prompt.split("The request:", 1)[-1].lower():
        return "decision: refuse\nreasons:\n  - 'rule 1: the model is meant to write malware'\n"
    return "decision: allow\nreasons: []\n"


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as handle:
        prompt = handle.read()
    if prompt.startswith("mat request: check a request against the policy"):
        print(policy_answer(prompt))
        return 0
    description = prompt.split("<<<\n", 1)[1].rsplit("\n>>>", 1)[0]
    print("Here is the request:\n\n```yaml\n" + request_yaml(description) + "```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
