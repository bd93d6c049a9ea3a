"""Under torchrun, what one process does after a given step, every rank does at the boundary after that step of
rank 0: `--eval-every`'s evaluation, `--snapshot-every`'s snapshot, and the end at `--max-steps` (headless).

The ranks must do these at one boundary (evaluate()'s collectives pair with each other's; a snapshot gathers every
rank's loader places, and a sharded one has every rank write its shard), and only once every rank is known not to
have failed the step before it (a rank whose step failed never joins them). Queued by rank 0 as a command, the
evaluation ran at whatever turn the doorbell could agree on: after steps 22, 46 and 65 for `--eval-every 20` (a
transformers port under DDP), so its figures lined up with no single-process run's.

The turn is worked out from an exchange that every rank collected alike: rank 0's step and state when it posted its
row, and the turn it was posted at. A running rank 0 takes one step a turn, so the boundary after its next step
that is due is known in advance; at that turn every rank exchanges at once (a failure of that step comes in it and
pauses every rank first), and then each does what rank 0's step, as its row of that exchange says, is due for. The
numbers come from the rows, never from a rank's own state, so every rank plans the same turn and does the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field

EVALUATE, SNAPSHOT, END = "evaluate", "snapshot", "end"  # in the order they run at one boundary


@dataclass
class PlannedTurns:
    """The boundary at which every rank next does what is due after a step of rank 0 (None: none planned)."""

    every: dict[str, int] = field(default_factory=dict)  # EVALUATE / SNAPSHOT -> after every how many steps
    last_step: int | None = None  # --max-steps, where the run ends (headless); None: it pauses there, or no limit
    turn: int | None = None
    done: dict[str, int] = field(default_factory=dict)  # rank 0's step each was last done at: a turn reached while
    # paused does not do it twice

    def plan(self, running: bool, step: int, posted_turn: int, now: int, again: bool = False) -> None:
        """After an exchange is collected at turn `now`: rank 0's `running` and `step` as it posted its row at
        `posted_turn`. A plan still ahead stands unless `again` (every rank resumed at this turn: a turn planned
        before the pause counted steps the pause did not take); a paused rank 0 plans nothing, and a turn planned
        before it paused does nothing unless rank 0's step is then due (`due_after`)."""
        if not running or (self.turn is not None and self.turn >= now and not again):
            return
        targets = [(step // n + 1) * n for n in self.every.values()]  # each one's next multiple
        if self.last_step is not None and self.last_step > step:
            targets.append(self.last_step)
        if targets:
            self.turn = posted_turn + (min(targets) - step)  # rank 0 takes one step a turn after `posted_turn`'s boundary

    def after_one_step(self, turn: int) -> None:
        """A `step` sent while paused runs after this turn's boundary: the next boundary looks at its step."""
        if self.every or self.last_step is not None:
            self.turn = turn + 1

    def due(self, turn: int) -> bool:
        return self.turn is not None and self.turn == turn

    def next_turn_is_due(self, turn: int) -> bool:
        """At the boundary after this turn's step: the last step of --max-steps holds for it."""
        return self.turn is not None and self.turn == turn + 1

    def due_after(self, step: int, turn: int) -> list[str]:
        """At the planned `turn`, from rank 0's row of its exchange: what its step is due for, in order. A plan its
        exchange made for a later turn (a `resume` it carried) stands."""
        if self.turn == turn:
            self.turn = None
        kinds = [kind for kind, n in self.every.items() if step % n == 0 and self.done.get(kind) != step]
        for kind in kinds:
            self.done[kind] = step
        if self.last_step is not None and step >= self.last_step:
            kinds.append(END)
        return kinds
