"""The turn every rank runs `--eval-every`'s evaluation at, worked out from the rows of an exchange (pure logic; the
ranks themselves: tests/test_distributed.py's eval_every tests)."""

from __future__ import annotations

from workbench.engine.evaluation_turns import EvaluationTurns


def test_the_turn_is_the_boundary_after_rank_0s_next_multiple_and_a_plan_ahead_stands() -> None:
    turns = EvaluationTurns(every=5)
    turns.plan(running=True, step=3, posted_turn=10, now=11)  # step 4 runs after boundary 10, step 5 after 11
    assert turns.turn == 12 and turns.due(12) and not turns.due(11)
    turns.plan(running=True, step=4, posted_turn=11, now=12)  # a later exchange: the plan ahead stands
    assert turns.turn == 12
    assert turns.runs(5, 12) and turns.turn is None
    turns.plan(running=True, step=5, posted_turn=12, now=12)  # the evaluation's own exchange plans the next
    assert turns.turn == 17


def test_a_paused_rank_0_plans_nothing_and_a_stale_turn_runs_nothing_twice() -> None:
    turns = EvaluationTurns(every=5)
    turns.plan(running=False, step=3, posted_turn=10, now=11)
    assert turns.turn is None
    turns.plan(running=True, step=5, posted_turn=10, now=10)
    assert turns.runs(5, 10)
    turns.turn = 15  # a plan made before a pause, reached while paused at step 5: already evaluated there
    assert turns.due(15) and not turns.runs(5, 15) and turns.turn is None
    assert not turns.runs(7, 16), "a step that is no multiple"


def test_a_resume_plans_again_from_where_rank_0_stands_and_a_single_step_is_looked_at_next_turn() -> None:
    turns = EvaluationTurns(every=5)
    turns.plan(running=True, step=1, posted_turn=10, now=10)
    assert turns.turn == 14
    turns.plan(running=True, step=2, posted_turn=30, now=30, again=True)  # paused in between: no steps were taken
    assert turns.turn == 33
    turns.after_one_step(40)
    assert turns.due(41)
    assert EvaluationTurns(every=None).turn is None
    off = EvaluationTurns(every=None)
    off.plan(running=True, step=4, posted_turn=1, now=1)
    off.after_one_step(3)
    assert off.turn is None and not off.runs(5, 4)


def test_a_resume_in_the_planned_turns_own_exchange_keeps_the_plan_it_made() -> None:
    """Paused at step 23 with a turn planned (before the pause) for the boundary now, and resumed in this turn's
    exchange: the resume plans the next turn for step 24, which the stale turn's end must not wipe (24 was skipped)."""
    turns = EvaluationTurns(every=3)
    turns.turn = 29
    turns.plan(running=True, step=23, posted_turn=29, now=29, again=True)  # the resume, in turn 29's exchange
    assert turns.turn == 30
    assert not turns.runs(23, 29) and turns.turn == 30
