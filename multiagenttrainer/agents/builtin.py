"""The built-in agent: a seeded coordinate search over the hyperparameter constants of train.py.

It needs no LLM and no network, and it is the default when no `training.agent_command` is set. Each
call changes one constant by one step (see `search_space`) and describes it as `LEARNING_RATE 3e-3 ->
6e-3`. Everything it knows comes from train.py and the run's history, whose descriptions it parses
back into moves, so a resumed run (or a run another agent contributed to) continues the same search.

How the next move is chosen, in order of preference:
    1. keep going: the last experiment improved by moving X one way, so move X further that way
    2. turn around: the last experiment moved X one way and was discarded, so try the other way
       (not after one of the measured first moves of 4., whose other direction did worse)
    3. the constants whose moves gained most in the past, in the direction that gained
    4. the first moves measured most likely to help (search_space.FIRST_MOVES), in their order
    5. constants not tried yet, in tier order, tie-broken (and given a first direction) by the seed
    6. anything else not yet tried from the current best train.py
Coarse steps come before finer ones; a move already tried from the current best (or that crashed,
or that would undo a kept change) is never proposed again.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from multiagenttrainer.agents.base import AgentOutcome, AgentRequest
from multiagenttrainer.agents.hyperparameter_edits import (
    Constant,
    Number,
    Value,
    describe_change,
    format_value,
    parse_constants,
    parse_value_text,
    replace_literal,
)
from multiagenttrainer.agents.search_space import (
    FIRST_MOVES,
    Assignment,
    RuleEntry,
    rule_for,
    violated_constraints,
)
from multiagenttrainer.history import ExperimentResult

log = logging.getLogger(__name__)

LEVELS = (0, 1, 2)  # step refinements: x2, x sqrt 2, x 2**0.25 for a scaled constant
_MOVE = re.compile(r"([A-Z][A-Z0-9_]*) (\S.*?) -> (\S.*?)(?=, [A-Z][A-Z0-9_]* |; |$)")


@dataclass(frozen=True)
class Coordinate:
    """One number the search moves: a constant, or one element of a tuple constant."""

    name: str
    index: int | None = None

    @property
    def label(self) -> str:
        return self.name if self.index is None else f"{self.name}[{self.index}]"


@dataclass(frozen=True)
class Move:
    """A coordinate changed from one value to another."""

    coordinate: Coordinate
    old: Number
    new: Number

    @property
    def direction(self) -> int:
        return 1 if self.new > self.old else -1


@dataclass(frozen=True)
class Trial:
    """A finished experiment as the search sees it: its moves and how it compared to the best before it."""

    moves: tuple[Move, ...]
    status: str
    gain: float | None  # best val_bpb before it minus its val_bpb: positive = better; None if unknown


@dataclass(frozen=True)
class Candidate:
    """A move the search could make now, with its rank (lower is better)."""

    move: Move
    level: int
    rank: tuple[float, ...]
    reason: str


@dataclass(frozen=True)
class Draw:
    """The seeded random choices for one coordinate: its place among equals and its first direction."""

    position: float
    first_direction: int


@dataclass
class SearchMemory:
    """What the history says about the current best train.py and about each coordinate."""

    trials: list[Trial] = field(default_factory=list)
    tried_from_base: set[tuple[Coordinate, Number]] = field(default_factory=set)
    tried_ever: set[tuple[Coordinate, Number]] = field(default_factory=set)
    crashed: set[tuple[Coordinate, Number]] = field(default_factory=set)
    gains: dict[tuple[Coordinate, int], float] = field(default_factory=dict)
    momentum: Move | None = None  # the last experiment, when it was kept
    turned_down: Move | None = None  # the last experiment, when it was discarded


# ---------------------------------------------------------------- coordinates of a train.py


def coordinates_of(constants: dict[str, Constant]) -> dict[Coordinate, Number]:
    """Every number the search could move, with its current value (tuples give one per element)."""
    values: dict[Coordinate, Number] = {}
    for name, constant in constants.items():
        if isinstance(constant.value, tuple):
            for index, item in enumerate(constant.value):
                values[Coordinate(name, index)] = item
        else:
            values[Coordinate(name)] = constant.value
    return values


def assignment_with(constants: dict[str, Constant], context: Assignment, move: Move) -> Assignment:
    """All constant values (prepare.py's context first) after applying `move`."""
    values: Assignment = {**context, **{name: c.value for name, c in constants.items()}}
    values[move.coordinate.name] = value_after(constants[move.coordinate.name].value, move)
    return values


def value_after(value: Value, move: Move) -> Value:
    """The constant's new value: the number itself, or the tuple with one element replaced."""
    if isinstance(value, tuple) and move.coordinate.index is not None:
        items = list(value)
        items[move.coordinate.index] = move.new
        return tuple(items)
    return move.new


# ---------------------------------------------------------------- reading the history


def moves_in(description: str) -> list[Move]:
    """The moves a description such as `LEARNING_RATE 3e-3 -> 6e-3, N_LAYER 2 -> 3` names."""
    moves: list[Move] = []
    for name, old_text, new_text in _MOVE.findall(description):
        old, new = parse_value_text(old_text), parse_value_text(new_text)
        if isinstance(old, tuple) and isinstance(new, tuple) and len(old) == len(new):
            moves += [
                Move(Coordinate(name, i), a, b)
                for i, (a, b) in enumerate(zip(old, new, strict=True))
                if a != b
            ]
        elif isinstance(old, int | float) and isinstance(new, int | float) and old != new:
            moves.append(Move(Coordinate(name), old, new))
    return moves


def trials_from(history: Iterable[ExperimentResult]) -> list[Trial]:
    """Each experiment's moves and its gain over the best kept val_bpb before it."""
    trials: list[Trial] = []
    best: float | None = None
    for result in sorted(history, key=lambda r: r.experiment_id):
        gain = best - result.val_bpb if best is not None and result.val_bpb is not None else None
        trials.append(Trial(tuple(moves_in(result.description)), result.status, gain))
        if result.status == "keep" and result.val_bpb is not None:
            best = result.val_bpb if best is None else min(best, result.val_bpb)
    return trials


def remember(trials: list[Trial], current: dict[Coordinate, Number]) -> SearchMemory:
    """Summarise the trials: what was tried from the current best, what gained, what crashed."""
    memory = SearchMemory(trials=trials)
    last_keep = max((i for i, t in enumerate(trials) if t.status == "keep"), default=-1)
    for position, trial in enumerate(trials):
        for move in trial.moves:
            key = (move.coordinate, move.new)
            memory.tried_ever.add(key)
            if position > last_keep:
                memory.tried_from_base.add(key)
            if trial.status == "crash":
                memory.crashed.add(key)
            if trial.status == "keep" and current.get(move.coordinate) == move.new:
                memory.tried_from_base.add((move.coordinate, move.old))  # going back would undo a win
            if trial.status == "keep" and trial.gain is not None and trial.gain > 0:
                slot = (move.coordinate, move.direction)
                memory.gains[slot] = max(memory.gains.get(slot, 0.0), trial.gain)
    if trials and len(trials[-1].moves) == 1:
        last = trials[-1]
        memory.momentum = last.moves[0] if last.status == "keep" else None
        memory.turned_down = last.moves[0] if last.status == "discard" else None
    return memory


# ---------------------------------------------------------------- ranking candidate moves


def preference(
    coordinate: Coordinate, direction: int, memory: SearchMemory, draws: dict[Coordinate, Draw]
) -> tuple[int, float, str]:
    """(group, -gain, reason) for moving `coordinate` in `direction`; see the module docstring."""
    momentum, turned = memory.momentum, memory.turned_down
    if momentum is not None and momentum.coordinate == coordinate and momentum.direction == direction:
        return 0, 0.0, f"the last change to {coordinate.label} in this direction improved val_bpb"
    turn_around = turned is not None and turned.coordinate == coordinate and turned.direction == -direction
    if turn_around and turned is not None and not is_first_move(turned):  # a first move's other way did worse
        return 1, 0.0, f"the other direction for {coordinate.label} did not improve val_bpb"
    gain = memory.gains.get((coordinate, direction), 0.0)
    if gain > 0:
        return 2, -gain, f"moving {coordinate.label} this way gained {gain:.6f} before"
    touched = any(c == coordinate for c, _ in memory.tried_ever)
    prior = FIRST_MOVES.get(coordinate.label)
    if not touched and prior is not None and prior[1] == direction:
        return 3, float(prior[0]), f"{coordinate.label} this way is among the first moves most likely to help"
    if not touched:
        group = 4 if direction == draws[coordinate].first_direction else 5
        return group, 0.0, f"{coordinate.label} has not been tried yet"
    return 6, 0.0, f"{coordinate.label} not yet tried this way from the current best"


def is_first_move(move: Move) -> bool:
    """Whether `move` is one of FIRST_MOVES, in its direction."""
    prior = FIRST_MOVES.get(move.coordinate.label)
    return prior is not None and prior[1] == move.direction


def candidates(
    constants: dict[str, Constant],
    context: Assignment,
    memory: SearchMemory,
    rng: random.Random,
) -> list[Candidate]:
    """Every allowed move from the current train.py, ranked."""
    current = coordinates_of(constants)
    draws = {c: Draw(rng.random(), rng.choice((1, -1))) for c in sorted(current, key=lambda c: c.label)}
    found: list[Candidate] = []
    for coordinate, value in current.items():
        row = rule_for(coordinate.name, value)
        if row is None:
            continue
        for level in LEVELS:
            for direction in (1, -1):
                candidate = make_candidate(coordinate, value, direction, level, row, memory, draws)
                if candidate is not None and not violated_constraints(
                    assignment_with(constants, context, candidate.move)
                ):
                    found.append(candidate)
    return sorted(found, key=lambda c: c.rank)


def make_candidate(
    coordinate: Coordinate,
    value: Number,
    direction: int,
    level: int,
    row: RuleEntry,
    memory: SearchMemory,
    draws: dict[Coordinate, Draw],
) -> Candidate | None:
    """The ranked move one step from `value`, or None when the step is impossible or already tried."""
    new = row.rule.neighbor(value, direction, level)
    if new is None or new == value:
        return None
    key = (coordinate, new)
    if key in memory.tried_from_base or key in memory.crashed:
        return None
    group, gain_rank, reason = preference(coordinate, direction, memory, draws)
    stale = 1 if key in memory.tried_ever else 0  # tried from an older best: less promising
    rank = (level + stale, group, gain_rank, row.tier, draws[coordinate].position, -direction)
    return Candidate(Move(coordinate, value, new), level, rank, reason)


# ---------------------------------------------------------------- the agent


def read_context(workspace: Path) -> Assignment:
    """Constants of prepare.py (MAX_SEQ_LEN, ...) that constraints refer to; empty if unreadable."""
    try:
        constants = parse_constants((workspace / "prepare.py").read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return {}
    return {name: constant.value for name, constant in constants.items()}


def apply_move(source: str, constants: dict[str, Constant], move: Move) -> tuple[str, str]:
    """(new train.py source, one-line description) for `move`."""
    constant = constants[move.coordinate.name]
    new_text = format_value(value_after(constant.value, move), constant.text)
    return replace_literal(source, constant, new_text), describe_change(
        constant.name, constant.text, new_text
    )


class BuiltinSearchAgent:
    """Changes one hyperparameter constant of train.py per experiment; deterministic for a seed."""

    name = "builtin"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def choose(self, source: str, workspace: Path, history: list[ExperimentResult]) -> Candidate | None:
        """The best-ranked move for this train.py and history, or None when no move is left."""
        constants = parse_constants(source)
        memory = remember(trials_from(history), coordinates_of(constants))
        ranked = candidates(constants, read_context(workspace), memory, random.Random(self.seed))
        return ranked[0] if ranked else None

    def propose(self, request: AgentRequest) -> AgentOutcome:
        """Rewrite one constant of `request.workspace/train.py`; no other file is touched."""
        train = request.workspace / "train.py"
        try:
            source = train.read_bytes().decode("utf-8")  # bytes: keep the file's line endings
            chosen = self.choose(source, request.workspace, request.history)
        except (OSError, UnicodeDecodeError, SyntaxError) as exc:
            return AgentOutcome("no change", log=f"cannot read the constants of {train}: {exc}", exit_code=1)
        if chosen is None:
            return AgentOutcome("no change", log="every move from the current train.py has been tried")
        constants = parse_constants(source)
        updated, description = apply_move(source, constants, chosen.move)
        train.write_bytes(updated.encode("utf-8"))
        note = f"{description}: {chosen.reason} (step level {chosen.level}, seed {self.seed})"
        log.info("built-in agent, experiment %d: %s", request.experiment_id, note)
        return AgentOutcome(description, log=note + "\n")
