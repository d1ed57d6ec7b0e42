"""BuiltinSearchAgent: parsing and rewriting constants, constraints, seeds, and use of the history.

The search itself is exercised against a synthetic val_bpb (a bowl over a few constants) so a whole
8-experiment loop takes milliseconds; benchmarks/builtin_agent.py measures it with real training.
"""

from __future__ import annotations

import difflib
import math
import random
from pathlib import Path

import pytest

from multiagenttrainer.agents import BuiltinSearchAgent
from multiagenttrainer.agents.builtin import candidates, coordinates_of, moves_in, remember, trials_from
from multiagenttrainer.agents.hyperparameter_edits import format_value, parse_constants, replace_literal
from multiagenttrainer.agents.search_space import violated_constraints
from multiagenttrainer.history import ExperimentResult
from tests.agents.helpers import request_for, result


def files_of(workspace: Path) -> dict[str, bytes]:
    return {str(p.relative_to(workspace)): p.read_bytes() for p in workspace.rglob("*") if p.is_file()}


def set_constants(workspace: Path, **values: str) -> None:
    """Rewrite constants of the workspace's train.py (values given as source text)."""
    train = workspace / "train.py"
    source = train.read_text()
    for name, text in values.items():
        source = replace_literal(source, parse_constants(source)[name], text)
    train.write_text(source)


def propose(workspace: Path, history: list[ExperimentResult], seed: int = 0) -> str:
    return BuiltinSearchAgent(seed).propose(request_for(workspace, len(history), history)).description


# ---------------------------------------------------------------- constants


def test_constants_of_the_template_are_found_with_their_literal_text(workspace: Path) -> None:
    constants = parse_constants((workspace / "train.py").read_text())
    assert constants["LEARNING_RATE"].value == 3e-3 and constants["LEARNING_RATE"].text == "3e-3"
    assert constants["ADAM_BETAS"].value == (0.9, 0.95)
    assert constants["N_LAYER"].value == 2 and isinstance(constants["N_LAYER"].value, int)
    assert "START_TIME" not in constants  # a call, not a literal


def test_rewriting_changes_only_the_literal_and_keeps_the_comment(workspace: Path) -> None:
    before = (workspace / "train.py").read_text()
    description = propose(
        workspace, [result(0, "keep", 3.0, "baseline"), result(1, "discard", 3.1, "N_LAYER 2 -> 3")]
    )
    after = (workspace / "train.py").read_text()
    changed = [line for line in difflib.ndiff(before.splitlines(), after.splitlines()) if line[:1] in "+-"]
    assert len(changed) == 2, changed
    name, old, _, new = description.split()
    assert changed[0] == f"- {[ln for ln in before.splitlines() if ln.startswith(name + ' = ')][0]}"
    assert changed[1] == changed[0].replace(f"{name} = {old}", f"{name} = {new}", 1).replace("- ", "+ ", 1)
    assert "#" in changed[1]


def test_windows_line_endings_are_kept(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "train.py").write_bytes(b"LEARNING_RATE = 3e-3  # lr\r\nN_LAYER = 2\r\nprint(1)\r\n")
    propose(workspace, [result(0, "keep", 3.0, "baseline")])
    data = (workspace / "train.py").read_bytes()
    assert data.count(b"\r\n") == 3 and b"\n" not in data.replace(b"\r\n", b"")


@pytest.mark.parametrize(
    ("value", "like", "expected"),
    [
        (6e-3, "3e-3", "6e-3"),
        (1.5e-3, "3e-3", "1.5e-3"),
        (0.012, "3e-3", "1.2e-2"),
        (0.5, "0.4", "0.5"),
        (2.0, "1.0", "2.0"),
        (2**18, "2**19", "2**18"),
        (32, "16", "32"),
        (32_768, "65_536", "32_768"),
        ((0.9, 0.975), "(0.9, 0.95)", "(0.9, 0.975)"),
    ],
)
def test_new_values_are_written_in_the_style_of_the_old_literal(
    value: float, like: str, expected: str
) -> None:
    assert format_value(value, like) == expected


def test_descriptions_parse_back_into_moves() -> None:
    moves = moves_in("LEARNING_RATE 3e-3 -> 6e-3, ADAM_BETAS (0.9, 0.95) -> (0.9, 0.975)")
    assert [(m.coordinate.label, m.old, m.new) for m in moves] == [
        ("LEARNING_RATE", 3e-3, 6e-3),
        ("ADAM_BETAS[1]", 0.95, 0.975),
    ]
    assert moves_in("remove the layer norm") == []


# ---------------------------------------------------------------- what may change


def all_candidates(
    workspace: Path, history: list[ExperimentResult], seed: int = 0
) -> list[tuple[str, float]]:
    source = (workspace / "train.py").read_text()
    constants = parse_constants(source)
    prepare = {n: c.value for n, c in parse_constants((workspace / "prepare.py").read_text()).items()}
    memory = remember(trials_from(history), coordinates_of(constants))
    return [
        (c.move.coordinate.label, c.move.new)
        for c in candidates(constants, prepare, memory, random.Random(seed))
    ]


def test_constraints_and_the_skip_list_limit_the_moves(workspace: Path) -> None:
    set_constants(workspace, N_EMBD="32", N_HEAD="4")
    moves = all_candidates(workspace, [result(0, "keep", 3.0, "baseline")])
    assert ("N_HEAD", 2) in moves and ("N_EMBD", 64) in moves
    assert ("N_HEAD", 8) not in moves  # 32 / 8 = 4 dimensions per head
    assert ("N_EMBD", 16) not in moves
    assert ("SEQ_LEN", 256) not in moves  # prepare.py: MAX_SEQ_LEN = 128
    assert ("SEQ_LEN", 64) in moves
    skipped = {"SEED", "EVAL_BATCH_SIZE", "H100_BF16_PEAK_FLOPS"}
    assert not skipped & {label for label, _ in moves}
    assert ("DROPOUT", 0.1) in moves and ("FINAL_LR_FRAC", 0.0) in moves
    assert all(0 < value < 1 for label, value in moves if label.startswith("ADAM_BETAS"))


def test_sizes_stay_powers_of_two_and_every_proposal_is_valid(workspace: Path) -> None:
    set_constants(workspace, N_EMBD="96", BATCH_SIZE="12")
    moves = all_candidates(workspace, [result(0, "keep", 3.0, "baseline")])
    assert {v for label, v in moves if label == "N_EMBD"} == {128, 64}
    assert {v for label, v in moves if label == "BATCH_SIZE"} == {16, 8}
    source = (workspace / "train.py").read_text()
    for label, value in moves:
        values = {n: c.value for n, c in parse_constants(source).items()} | {"MAX_SEQ_LEN": 128}
        if "[" not in label:
            values[label] = value
        assert violated_constraints(values) == [], (label, value)


def test_only_train_py_is_touched(workspace: Path) -> None:
    history = [result(0, "keep", 3.0, "baseline")]
    for experiment in range(1, 6):
        before = files_of(workspace)
        description = propose(workspace, history)
        after = files_of(workspace)
        assert {name for name in after if after[name] != before.get(name)} == {"train.py"}
        assert set(after) == set(before)
        history.append(result(experiment, "discard", 3.1, description))
        (workspace / "train.py").write_bytes(before["train.py"])  # what the loop does on discard


# ---------------------------------------------------------------- using the history


def test_after_an_improvement_it_goes_further_the_same_way(workspace: Path) -> None:
    set_constants(workspace, LEARNING_RATE="6e-3")
    history = [result(0, "keep", 3.0, "baseline"), result(1, "keep", 2.9, "LEARNING_RATE 3e-3 -> 6e-3")]
    assert propose(workspace, history) == "LEARNING_RATE 6e-3 -> 1.2e-2"


def test_after_a_discard_it_tries_the_other_way(workspace: Path) -> None:
    history = [result(0, "keep", 3.0, "baseline"), result(1, "discard", 3.1, "LEARNING_RATE 3e-3 -> 6e-3")]
    assert propose(workspace, history) == "LEARNING_RATE 3e-3 -> 1.5e-3"


def test_it_prefers_the_parameter_with_the_largest_past_gain(workspace: Path) -> None:
    set_constants(workspace, N_LAYER="3", LEARNING_RATE="6e-3")
    history = [
        result(0, "keep", 3.0, "baseline"),
        result(1, "keep", 2.8, "N_LAYER 2 -> 3"),
        result(2, "keep", 2.79, "LEARNING_RATE 3e-3 -> 6e-3"),
        result(3, "discard", 2.85, "LEARNING_RATE 6e-3 -> 1.2e-2"),
    ]
    assert propose(workspace, history) == "N_LAYER 3 -> 4"


def test_it_never_repeats_a_move_from_the_same_base_nor_undoes_a_kept_one(workspace: Path) -> None:
    set_constants(workspace, LEARNING_RATE="6e-3")
    history = [
        result(0, "keep", 3.0, "baseline"),
        result(1, "keep", 2.9, "LEARNING_RATE 3e-3 -> 6e-3"),
        result(2, "discard", 2.95, "LEARNING_RATE 6e-3 -> 1.2e-2"),
    ]
    moves = all_candidates(workspace, history)
    assert ("LEARNING_RATE", 1.2e-2) not in moves and ("LEARNING_RATE", 3e-3) not in moves
    assert ("LEARNING_RATE", 8.49e-3) in moves  # the finer step is still open


def test_a_value_that_crashed_is_not_tried_again_from_a_later_base(workspace: Path) -> None:
    set_constants(workspace, LEARNING_RATE="6e-3")
    history = [
        result(0, "keep", 3.0, "baseline"),
        result(1, "crash", None, "N_LAYER 2 -> 3"),
        result(2, "keep", 2.9, "LEARNING_RATE 3e-3 -> 6e-3"),
    ]
    assert ("N_LAYER", 3) not in all_candidates(workspace, history)
    history[1] = result(1, "discard", 3.2, "N_LAYER 2 -> 3")
    assert ("N_LAYER", 3) in all_candidates(workspace, history)  # only a crash rules it out for good


# ---------------------------------------------------------------- seeds and the search as a whole

OPTIMUM = {"LEARNING_RATE": 1.2e-2, "BATCH_SIZE": 8, "WARMUP_STEPS": 5, "N_LAYER": 3, "WEIGHT_DECAY": 0.1}


def synthetic_val_bpb(source: str) -> float:
    """A bowl in log space around OPTIMUM: each factor of 2 away from the optimum costs 0.05 bpb."""
    constants = parse_constants(source)
    return 2.0 + sum(0.05 * math.log2(constants[n].value / best) ** 2 for n, best in OPTIMUM.items())


def search_loop(workspace: Path, seed: int, experiments: int = 8) -> list[ExperimentResult]:
    """The harness loop in miniature: propose, score, keep or put train.py back."""
    train = workspace / "train.py"
    best_source = train.read_text()
    history = [result(0, "keep", synthetic_val_bpb(best_source), "baseline")]
    for experiment in range(1, experiments):
        description = propose(workspace, history, seed)
        val = synthetic_val_bpb(train.read_text())
        best = min(r.val_bpb for r in history if r.status == "keep" and r.val_bpb is not None)
        if val < best:
            history.append(result(experiment, "keep", val, description))
            best_source = train.read_text()
        else:
            history.append(result(experiment, "discard", val, description))
            train.write_text(best_source)
    return history


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_every_seed_starts_with_the_measured_first_moves(workspace: Path, seed: int) -> None:
    """FIRST_MOVES: beta1 down, then more heads; a first move that lost is not turned around."""
    template = (workspace / "train.py").read_text()
    baseline = [result(0, "keep", 3.0, "baseline")]
    assert propose(workspace, baseline, seed) == "ADAM_BETAS (0.9, 0.95) -> (0.8, 0.95)"
    (workspace / "train.py").write_text(template)
    lost = [*baseline, result(1, "discard", 3.1, "ADAM_BETAS (0.9, 0.95) -> (0.8, 0.95)")]
    assert propose(workspace, lost, seed) == "N_HEAD 4 -> 8"  # not beta1 0.9 -> 0.95
    (workspace / "train.py").write_text(template)
    set_constants(workspace, ADAM_BETAS="(0.8, 0.95)")  # the kept train.py
    won = [*baseline, result(1, "keep", 2.9, "ADAM_BETAS (0.9, 0.95) -> (0.8, 0.95)")]
    assert propose(workspace, won, seed) == "ADAM_BETAS (0.8, 0.95) -> (0.6, 0.95)"  # keep going


def test_the_same_seed_gives_the_same_search_and_other_seeds_differ(workspace: Path, tmp_path: Path) -> None:
    template = (workspace / "train.py").read_text()
    sequences = []
    for seed in (0, 0, 1, 2, 3):
        (workspace / "train.py").write_text(template)
        sequences.append(tuple(r.description for r in search_loop(workspace, seed, experiments=14)))
    assert sequences[0] == sequences[1]
    assert len(set(sequences[1:])) > 1  # after the measured first moves (FIRST_MOVES), the seed decides


def test_the_search_keeps_improvements_for_most_seeds(workspace: Path) -> None:
    template = (workspace / "train.py").read_text()
    improved = 0
    for seed in range(10):
        (workspace / "train.py").write_text(template)
        history = search_loop(workspace, seed)
        if any(r.status == "keep" for r in history[1:]):
            improved += 1
    assert improved >= 8
