"""What the final snapshot of a quit (SIGTERM, SIGHUP, a dropped link) really did, said once after exit.

Never a claim that did not happen: a failed final snapshot names the last good one and how
far behind it is (and the exit status is non-zero); a run that trained nothing writes none,
because a snapshot of the untrained model would later be resumed as if it were trained.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FinalSnapshot:
    outcome: str  # "written", "up to date", "failed", "nothing trained"
    step: int
    path: str | None = None  # the file written, or the one that already holds this step
    error: str | None = None
    last_good_path: str | None = None
    last_good_step: int | None = None

    @property
    def ok(self) -> bool:
        return self.outcome != "failed"

    def sentence(self) -> str:
        if self.outcome == "written":
            return f"final snapshot of step {self.step} written to {self.path}"
        if self.outcome == "up to date":
            return f"no final snapshot needed: step {self.step} is already in {self.path}"
        if self.outcome == "nothing trained":
            return f"no final snapshot: no step ran in this session (step {self.step}), so there is nothing new to keep"
        if self.last_good_path is not None and self.last_good_step is not None:
            behind = self.step - self.last_good_step
            last = f"the last good snapshot is {self.last_good_path} (step {self.last_good_step}, {behind} steps behind)"
        else:
            last = "this run has no good snapshot"
        return f"the final snapshot of step {self.step} FAILED ({self.error}); {last}"
