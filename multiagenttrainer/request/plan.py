"""The plan: every decision the Task agent took with its reason, and the refusals; plan.json and plan.md.

The plan is written when the Task agent has planned, again when it has reviewed the data, and in any
case when the request is refused, so plan.md always says why the request went on or stopped.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from multiagenttrainer.atomic import write_bytes_atomically, write_json_atomically
from multiagenttrainer.request.schema import RequestSpec

PLAN_JSON = "plan.json"
PLAN_MD = "plan.md"


@dataclass
class Decision:
    """One thing the Task agent decided, and why."""

    topic: str
    decision: str
    reason: str


@dataclass
class Candidate:
    """A model of the catalog as the Task agent judged it: size, estimated memory, and whether it fits."""

    name: str
    model_id: str
    params: int
    use_4bit: bool
    memory_gb: float
    memory_basis: str  # how the estimate was made
    fits: bool
    reason: str


@dataclass
class Plan:
    """What the Model and Server agents will do, decided from the request, the catalog and the machine."""

    request_id: str
    spec: RequestSpec
    candidates: list[Candidate] = field(default_factory=list)
    trial_candidates: list[str] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    measurements: dict[str, Any] = field(default_factory=dict)

    def decide(self, topic: str, decision: str, reason: str) -> None:
        self.decisions.append(Decision(topic, decision, reason))

    def refuse(self, reason: str) -> None:
        self.refusals.append(reason)
        self.decisions.append(Decision("refusal", "refuse", reason))

    def candidate(self, name: str) -> Candidate:
        return next(c for c in self.candidates if c.name == name)

    @property
    def refused(self) -> bool:
        return bool(self.refusals)

    def to_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "outcome": "refused" if self.refused else "accepted",
            "request": self.spec.to_yaml_dict(),
            "candidates": [asdict(c) for c in self.candidates],
            "trial_candidates": self.trial_candidates,
            "decisions": [asdict(d) for d in self.decisions],
            "refusals": self.refusals,
            "measurements": self.measurements,
        }


def write_plan(folder: Path, plan: Plan) -> None:
    """plan.json and plan.md in the request folder."""
    write_json_atomically(folder / PLAN_JSON, plan.to_dict())
    write_bytes_atomically(folder / PLAN_MD, render_plan(plan).encode("utf-8"))


def render_plan(plan: Plan) -> str:
    """plan.md: the request, the outcome, the candidates and every decision with its reason."""
    spec = plan.spec
    lines = [f"# Plan for request {plan.request_id}", "", f"Task: `{spec.task}`"]
    if spec.description:
        lines += ["", spec.description]
    if plan.refused:
        lines += ["", "## Refused", ""] + [f"- {reason}" for reason in plan.refusals]
    else:
        chosen = ", ".join(plan.trial_candidates) or "(none yet)"
        lines += ["", "## Accepted", "", f"Candidates to try: {chosen}"]
    lines += [
        "",
        "## Candidates",
        "",
        "| model | parameters | memory (est.) | fits | why |",
        "|---|---|---|---|---|",
    ]
    for c in plan.candidates:
        lines.append(
            f"| {c.name} (`{c.model_id}`) | {c.params:,} | {c.memory_gb:.3g} GB ({c.memory_basis}) "
            f"| {'yes' if c.fits else 'no'} | {c.reason} |"
        )
    lines += ["", "## Decisions", "", "| topic | decision | reason |", "|---|---|---|"]
    lines += [f"| {d.topic} | {cell(d.decision)} | {cell(d.reason)} |" for d in plan.decisions]
    if plan.measurements:
        lines += ["", "## Measured on this machine", ""]
        lines += [f"- {key}: {value}" for key, value in sorted(plan.measurements.items())]
    return "\n".join(lines) + "\n"


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")
