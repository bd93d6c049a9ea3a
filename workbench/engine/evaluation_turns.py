"""`--eval-every N` under torchrun: every rank runs evaluate() after step N, 2N, ..., as one process does.

The ranks must run evaluate() at one boundary (its collectives pair with each other's), and only once every rank
is known not to have failed the step before it (a rank whose step failed never joins them). Queued by rank 0 as a
command, the evaluation ran at whatever turn the doorbell could agree on: after steps 22, 46 and 65 for
`--eval-every 20` (a transformers port under DDP), so its figures lined up with no single-process run's.

Now the turn is worked out from an exchange that every rank collected alike: rank 0's step and state when it
posted its row, and the turn it was posted at. A running rank 0 takes one step a turn, so the boundary after its
next multiple of N is known in advance; at that turn every rank exchanges at once (a failure of that step comes
in it and pauses every rank first) and then evaluates. The numbers come from the rows, never from a rank's own
state, so every rank plans the same turn.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EvaluationTurns:
    """The boundary at which every rank next runs the `--eval-every` evaluation (None: none planned)."""

    every: int | None
    turn: int | None = None

    evaluated: int | None = None  # rank 0's step at the last one: a turn reached while paused does not run it again

    def plan(self, running: bool, step: int, posted_turn: int, now: int, again: bool = False) -> None:
        """After an exchange is collected at turn `now`: rank 0's `running` and `step` as it posted its row at
        `posted_turn`. A plan still ahead stands unless `again` (every rank resumed at this turn: a turn planned
        before the pause counted steps the pause did not take); a paused rank 0 plans nothing, and a turn planned
        before it paused comes to nothing unless rank 0's step is then due (`runs`)."""
        if not self.every or not running or (self.turn is not None and self.turn >= now and not again):
            return
        due = (step // self.every + 1) * self.every  # the step after which it runs, the next multiple of N
        self.turn = posted_turn + (due - step)  # rank 0 takes one step a turn after `posted_turn`'s boundary

    def after_one_step(self, turn: int) -> None:
        """A `step` sent while paused runs after this turn's boundary: the next boundary looks at its step."""
        if self.every:
            self.turn = turn + 1

    def due(self, turn: int) -> bool:
        return self.turn is not None and self.turn == turn

    def runs(self, step: int, turn: int) -> bool:
        """At the planned `turn`, from rank 0's row of its exchange: whether its step is one to evaluate after. A plan
        its exchange made for a later turn (a `resume` it carried) stands."""
        if self.turn == turn:
            self.turn = None
        if not self.every or step % self.every or step == self.evaluated:
            return False
        self.evaluated = step
        return True

    def next_turn_is_due(self, turn: int) -> bool:
        """At the boundary after this turn's step: the last step of --max-steps waits for it."""
        return self.turn is not None and self.turn == turn + 1
