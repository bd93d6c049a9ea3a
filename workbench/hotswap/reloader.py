"""Code versions: what source is live for each file, and the history to roll back through.

`prepare` runs on the reload thread, `commit` on the training thread; the small
bookkeeping they share is guarded by a lock.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from workbench.hotswap.patches import apply_all
from workbench.hotswap.planner import ChangeSet, ReloadError, plan_reload
from workbench.project import Project


@dataclass(frozen=True)
class AppliedVersion:
    version: int
    path: Path
    changed: tuple[str, ...]
    previous_source: str
    source: str
    applied_at: float


class Reloader:
    """Turns saved files into change sets and applies them, keeping every applied version."""

    def __init__(self, project: Project, required: dict[str, tuple[str, ...]]) -> None:
        self.project = project
        self.required = required
        self.version = 0
        self._applied: dict[Path, str] = {}
        self._prepared: dict[Path, str] = {}
        self._history: list[AppliedVersion] = []
        self._lock = threading.Lock()

    def track_loaded_modules(self) -> None:
        """Remember the source of every project module imported so far (the diff base)."""
        for path in self.project.modules():
            with self._lock:
                if path in self._applied:
                    continue
            try:
                source = path.read_text(encoding="utf-8")
            except OSError:
                continue
            with self._lock:
                self._applied.setdefault(path, source)

    @property
    def history(self) -> list[AppliedVersion]:
        with self._lock:
            return list(self._history)

    def tracked_files(self) -> list[Path]:
        self.track_loaded_modules()
        with self._lock:
            return sorted(self._applied)

    def prepare(self, path: Path, detected_at: float | None = None) -> ChangeSet | None:
        """Plan the patches for a saved file; None when its code did not change."""
        self.track_loaded_modules()
        path = path.resolve()
        module = self.project.modules().get(path)
        with self._lock:
            base = self._prepared.get(path, self._applied.get(path))
        if module is None or base is None:
            if not path.exists():
                return None
            return ChangeSet(
                path=path,
                module=None,
                base_source="",
                new_source="",
                notes=[f"{self.project.relative(path)} is not imported by the session: nothing to patch"],
                detected_at=detected_at or time.monotonic(),
            )
        try:
            source = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            missing = ReloadError(f"{path.name} was deleted; the old code keeps running. Restore the file to go on.")
            missing.source = ""  # editors that save by rename delete the file for a moment
            raise missing from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ReloadError(f"cannot read {path.name}: {exc}") from None
        if source == base:
            return None
        try:
            changeset = plan_reload(module, path, base, source, required=self._required_for(path))
        except ReloadError as exc:
            exc.source = source
            raise
        finally:
            # Planning runs the file's imports: a module it imported for the first time is tracked
            # now, before the user can edit it, so its first edit has a base to diff against.
            self.track_loaded_modules()
        changeset.detected_at = detected_at or time.monotonic()
        with self._lock:
            self._prepared[path] = source
        return changeset

    def prepare_rollback(self) -> ChangeSet:
        """Plan going back to the code before the last applied version."""
        with self._lock:
            if not self._history:
                raise ReloadError("nothing to roll back: no reload has been applied yet")
            last = self._history[-1]
            current = self._applied[last.path]
        module = self.project.modules().get(last.path)
        if module is None:
            raise ReloadError(f"{last.path.name} is no longer imported; cannot roll back")
        required = self.required if last.path == self.project.entry else None
        changeset = plan_reload(module, last.path, current, last.previous_source, required=required)
        changeset.rollback_of = last.version
        changeset.detected_at = time.monotonic()
        return changeset

    def commit(self, changeset: ChangeSet) -> int:
        """Apply on the training thread; all or nothing. Returns the code version now live."""
        path = changeset.path
        if changeset.module is None:
            return self.version
        with self._lock:
            applied = self._applied.get(path)
        if applied is not None and applied != changeset.base_source:
            # An earlier change to this file failed after this one was planned: plan again from what is live.
            fresh = plan_reload(changeset.module, path, applied, changeset.new_source, required=self._required_for(path))
            fresh.detected_at, fresh.rollback_of = changeset.detected_at, changeset.rollback_of
            changeset.patches, changeset.changed, changeset.notes = fresh.patches, fresh.changed, fresh.notes
        try:
            apply_all(changeset.patches)
        except BaseException:
            with self._lock:
                self._prepared[path] = self._applied.get(path, "")
            raise
        with self._lock:
            previous = self._applied.get(path, "")
            self._applied[path] = changeset.new_source
            self._prepared[path] = changeset.new_source
            if changeset.changed:
                self.version += 1
                if changeset.rollback_of is not None:
                    self._history.pop()
                else:
                    self._history.append(
                        AppliedVersion(
                            self.version, path, tuple(changeset.changed), previous, changeset.new_source, time.time()
                        )
                    )
            return self.version

    def _required_for(self, path: Path) -> dict[str, tuple[str, ...]] | None:
        return self.required if path == self.project.entry else None

    def forget_prepared(self, path: Path) -> None:
        """A planned change was dropped: the next save diffs against what is live again."""
        with self._lock:
            if path in self._applied:
                self._prepared[path] = self._applied[path]
