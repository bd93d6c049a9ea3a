"""The turn every rank does what is due after a step of rank 0 (--eval-every, --snapshot-every, the end at
--max-steps), worked out from the rows of an exchange (pure logic; the ranks themselves: tests/test_distributed.py's
eval_every and snapshot_every tests)."""

from __future__ import annotations

from workbench.engine.planned_turns import END, EVALUATE, SNAPSHOT, PlannedTurns


def test_the_turn_is_the_boundary_after_rank_0s_next_multiple_and_a_plan_ahead_stands() -> None:
    turns = PlannedTurns(every={EVALUATE: 5})
    turns.plan(running=True, step=3, posted_turn=10, now=11)  # step 4 runs after boundary 10, step 5 after 11
    assert turns.turn == 12 and turns.due(12) and not turns.due(11)
    turns.plan(running=True, step=4, posted_turn=11, now=12)  # a later exchange: the plan ahead stands
    assert turns.turn == 12
    assert turns.due_after(5, 12) == [EVALUATE] and turns.turn is None
    turns.plan(running=True, step=5, posted_turn=12, now=12)  # the planned turn's own exchange plans the next
    assert turns.turn == 17


def test_the_nearest_of_several_is_planned_and_each_due_one_runs_in_order_the_end_last() -> None:
    turns = PlannedTurns(every={EVALUATE: 4, SNAPSHOT: 6}, last_step=12)
    turns.plan(running=True, step=0, posted_turn=1, now=1)
    assert turns.turn == 5  # step 4: the evaluation's
    assert turns.due_after(4, 5) == [EVALUATE]
    turns.plan(running=True, step=4, posted_turn=5, now=5)
    assert turns.turn == 7 and turns.due_after(6, 7) == [SNAPSHOT]
    turns.plan(running=True, step=10, posted_turn=11, now=11)
    assert turns.turn == 13 and turns.due_after(12, 13) == [EVALUATE, SNAPSHOT, END]
    alone = PlannedTurns(last_step=7)  # --max-steps alone: its end is planned too
    alone.plan(running=True, step=2, posted_turn=3, now=3)
    assert alone.turn == 8 and alone.due_after(7, 8) == [END]


def test_a_paused_rank_0_plans_nothing_and_a_stale_turn_does_nothing_twice() -> None:
    turns = PlannedTurns(every={EVALUATE: 5})
    turns.plan(running=False, step=3, posted_turn=10, now=11)
    assert turns.turn is None
    turns.plan(running=True, step=5, posted_turn=10, now=10)
    assert turns.due_after(5, 10) == [EVALUATE]
    turns.turn = 15  # a plan made before a pause, reached while paused at step 5: already evaluated there
    assert turns.due(15) and turns.due_after(5, 15) == [] and turns.turn is None
    assert turns.due_after(7, 16) == [], "a step that is no multiple"


def test_a_resume_plans_again_from_where_rank_0_stands_and_a_single_step_is_looked_at_next_turn() -> None:
    turns = PlannedTurns(every={EVALUATE: 5})
    turns.plan(running=True, step=1, posted_turn=10, now=10)
    assert turns.turn == 14
    turns.plan(running=True, step=2, posted_turn=30, now=30, again=True)  # paused in between: no steps were taken
    assert turns.turn == 33
    turns.after_one_step(40)
    assert turns.due(41) and turns.next_turn_is_due(40)
    off = PlannedTurns()
    off.plan(running=True, step=4, posted_turn=1, now=1)
    off.after_one_step(3)
    assert off.turn is None and off.due_after(5, 4) == []


def test_a_resume_in_the_planned_turns_own_exchange_keeps_the_plan_it_made() -> None:
    """Paused at step 23 with a turn planned (before the pause) for the boundary now, and resumed in this turn's
    exchange: the resume plans the next turn for step 24, which the stale turn's end must not wipe (24 was skipped)."""
    turns = PlannedTurns(every={EVALUATE: 3})
    turns.turn = 29
    turns.plan(running=True, step=23, posted_turn=29, now=29, again=True)  # the resume, in turn 29's exchange
    assert turns.turn == 30
    assert turns.due_after(23, 29) == [] and turns.turn == 30
