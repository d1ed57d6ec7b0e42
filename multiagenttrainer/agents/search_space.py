"""What the built-in agent may change in train.py, and by how much: step rules and constraints.

Each UPPER_CASE constant gets a step rule from RULES by name (first match wins, and the rule must
accept the current value). A rule gives the neighbour of a value in a direction (+1 up, -1 down) at a
refinement level: level 0 is the coarse step (x2 for a learning rate), level 1 a finer one (x sqrt 2).
Constants no rule accepts, and those in the skip list, are left alone.

    learning rates, weight decay      multiply / divide by 2
    integer sizes (width, batch, ...) next power of two up / down
    layer counts, small integers      +/- 1
    ratios and fractions in [0, 1]    +/- 0.1
    Adam betas                        halve / double the distance to 1
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from multiagenttrainer.agents.hyperparameter_edits import Number, Value, round_significant

# Seeds, evaluation settings and speed-measurement constants change the score's meaning, not the model.
SKIPPED = re.compile(
    r"^(SEED|.*_SEED|EVAL_.*|.*FLOPS.*|DEVICE_BATCH_SIZE|TIME_BUDGET|MAX_SEQ_LEN|VOCAB_SIZE|.*_THREADS)$"
)
MIN_HEAD_WIDTH = 8  # below this many dimensions per attention head a model is not worth training


class StepRule(Protocol):
    """Gives the next value of a constant in one direction, or None when there is none."""

    def neighbor(self, value: Number, direction: int, level: int) -> Number | None: ...


@dataclass(frozen=True)
class Scale:
    """Multiply (up) or divide (down) by `factor`, its square root at level 1, and so on."""

    factor: float = 2.0
    from_zero: Number | None = None  # the value to try going up from 0 (0 cannot be multiplied)

    def neighbor(self, value: Number, direction: int, level: int) -> Number | None:
        if value == 0:
            return self.from_zero if direction > 0 and level == 0 else None
        moved = value * self.factor ** (direction / 2**level)
        new: Number = round(moved) if isinstance(value, int) else round_significant(moved, 3)
        return new if new != value and new > 0 else None


@dataclass(frozen=True)
class PowerOfTwo:
    """The next power of two above or below; sizes only move in powers of two, so no finer levels."""

    minimum: int = 1

    def neighbor(self, value: Number, direction: int, level: int) -> Number | None:
        if level > 0 or not isinstance(value, int) or value < 1:
            return None
        exponent = math.log2(value)
        target = math.floor(exponent) + 1 if direction > 0 else math.ceil(exponent) - 1
        new = 2 ** int(target)
        return new if new >= self.minimum else None


@dataclass(frozen=True)
class Increment:
    """Add or subtract `step` (integers such as the number of layers)."""

    step: int = 1
    minimum: int = 1

    def neighbor(self, value: Number, direction: int, level: int) -> Number | None:
        if level > 0 or not isinstance(value, int):
            return None
        new = value + direction * self.step
        return new if new >= self.minimum else None


@dataclass(frozen=True)
class Fraction:
    """Add or subtract `step` (halved per level) while staying within [0, 1]."""

    step: float = 0.1

    def neighbor(self, value: Number, direction: int, level: int) -> Number | None:
        new = round(value + direction * self.step / 2**level, 3)
        return new if 0.0 <= new <= 1.0 and new != value else None


@dataclass(frozen=True)
class Beta:
    """Halve (up) or double (down) the distance to 1 of a moment-decay rate such as Adam's beta2."""

    def neighbor(self, value: Number, direction: int, level: int) -> Number | None:
        gap = (1.0 - value) / 2 ** (direction / 2**level)
        new = round(1.0 - gap, 4)
        return new if 0.0 < new < 1.0 and new != value else None


def is_fraction(value: Number) -> bool:
    return isinstance(value, float) and 0.0 <= value <= 1.0


def is_positive(value: Number) -> bool:
    return value >= 0


def is_int(value: Number) -> bool:
    return isinstance(value, int)


@dataclass(frozen=True)
class RuleEntry:
    """A row of RULES: names it matches, values it accepts, the step rule, and a search priority tier."""

    pattern: re.Pattern[str]
    accepts: Callable[[Number], bool]
    rule: StepRule
    tier: int  # lower tiers are tried first among constants that have not been tried yet


def entry(pattern: str, accepts: Callable[[Number], bool], rule: StepRule, tier: int) -> RuleEntry:
    return RuleEntry(re.compile(pattern), accepts, rule, tier)


# Tier 0: what usually matters most under a fixed time budget (step size, batch, schedule).
RULES: list[RuleEntry] = [
    entry(r"(^|_)(FRAC|RATIO|DROPOUT)$|DROPOUT", is_fraction, Fraction(0.1), 1),
    entry(r"BETA", is_fraction, Beta(), 2),
    entry(r"(^|_)LR$|LEARNING_RATE|_LR_", is_positive, Scale(2.0), 0),
    entry(r"WEIGHT_DECAY", is_positive, Scale(2.0, from_zero=0.01), 1),
    entry(r"GRAD_CLIP|CLIP", is_positive, Scale(2.0, from_zero=1.0), 2),
    entry(r"WARMUP|_STEPS$", is_int, Scale(2.0, from_zero=10), 0),
    entry(r"N_LAYER|DEPTH|LAYERS", is_int, Increment(1), 1),
    entry(r"BATCH", is_int, PowerOfTwo(1), 0),
    entry(r"N_HEAD|HEADS|EMBD|DIM|WIDTH|SEQ_LEN|ASPECT_RATIO", is_int, PowerOfTwo(1), 1),
    entry(r"MLP_RATIO|_MULT", is_int, Increment(1), 2),
]

# The first moves to try, best first: label -> (order, direction). These are the coarse moves that lowered
# val_bpb most, each on its own from the template's defaults, at the quickstart's budget of 150 steps
# (`python benchmarks/builtin_agent.py --first-moves --fixed-steps 150`), among the moves that keep the
# work per step the same; their other direction did worse there, so it is not tried right after. A bigger
# batch or a wider MLP won too, but by spending more time per step: that slows every later experiment and
# does not carry over to a budget in seconds.
FIRST_MOVES: dict[str, tuple[int, int]] = {
    "ADAM_BETAS[0]": (0, -1),  # beta1 0.9 -> 0.8: -0.048 val_bpb (0.9 -> 0.95: +0.35)
    "N_HEAD": (1, 1),  # 4 -> 8 heads at the same width: -0.010 (4 -> 2: +0.034)
}

# Constants no rule names: a float is scaled, a power of two stays one, another integer moves by 1.
FALLBACK_RULES: list[RuleEntry] = [
    entry(r".", lambda v: isinstance(v, float) and v > 0, Scale(2.0), 3),
    entry(r".", lambda v: is_int(v) and v > 1 and (int(v) & (int(v) - 1)) == 0, PowerOfTwo(1), 3),
    entry(r".", lambda v: is_int(v) and v >= 1, Increment(1), 3),
]


def rule_for(name: str, value: Number) -> RuleEntry | None:
    """The first RULES row (then fallback row) whose pattern matches `name` and accepts `value`."""
    if SKIPPED.match(name) or isinstance(value, bool):
        return None
    named = [row for row in RULES if row.pattern.search(name)]
    rows = named if named else FALLBACK_RULES
    return next((row for row in rows if row.accepts(value)), None)


# ---------------------------------------------------------------- constraints


Assignment = dict[str, Value]
Constraint = Callable[[Assignment], bool]


def needs(*names: str) -> Callable[[Callable[..., bool]], Constraint]:
    """Turn a check over named numbers into a Constraint that passes when a name is absent."""

    def wrap(check: Callable[..., bool]) -> Constraint:
        def constraint(values: Assignment) -> bool:
            numbers = [values.get(name) for name in names]
            if any(not isinstance(number, int | float) for number in numbers):
                return True
            return check(*numbers)

        return constraint

    return wrap


@needs("N_EMBD", "N_HEAD")
def heads_divide_width(width: int, heads: int) -> bool:
    return heads >= 1 and width % heads == 0 and width // heads >= MIN_HEAD_WIDTH


@needs("SEQ_LEN", "MAX_SEQ_LEN")
def sequence_fits(seq_len: int, max_seq_len: int) -> bool:
    return seq_len <= max_seq_len


@needs("TOTAL_BATCH_SIZE", "DEVICE_BATCH_SIZE", "MAX_SEQ_LEN")
def whole_accumulation_steps(total: int, device_batch: int, max_seq_len: int) -> bool:
    return total % (device_batch * max_seq_len) == 0


@needs("HEAD_DIM")
def even_head_dim(head_dim: int) -> bool:
    return head_dim >= MIN_HEAD_WIDTH and head_dim % 2 == 0  # rotary embeddings split heads in halves


CONSTRAINTS: dict[str, Constraint] = {
    "N_EMBD divisible by N_HEAD, heads at least 8 wide": heads_divide_width,
    "SEQ_LEN at most prepare.py's MAX_SEQ_LEN": sequence_fits,
    "TOTAL_BATCH_SIZE a multiple of DEVICE_BATCH_SIZE x MAX_SEQ_LEN": whole_accumulation_steps,
    "HEAD_DIM even and at least 8": even_head_dim,
}


def violated_constraints(values: Assignment) -> list[str]:
    """Descriptions of the constraints `values` breaks (empty when it is valid)."""
    return [description for description, check in CONSTRAINTS.items() if not check(values)]
