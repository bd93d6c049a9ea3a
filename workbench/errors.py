"""Errors meant for the user: one sentence saying what happened and what to do."""

from __future__ import annotations

from pathlib import Path


class UserError(Exception):
    """An error the CLI prints as one line (no traceback unless --debug) and exits 2 on."""

    def __init__(self, message: str, *, file: Path | str | None = None, line: int | None = None, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.file = str(file) if file is not None else None
        self.line = line
        self.hint = hint

    def location(self) -> str:
        if self.file is None:
            return ""
        return f"{self.file}:{self.line}" if self.line else self.file

    def __str__(self) -> str:
        where = self.location()
        text = f"{where}: {self.message}" if where else self.message
        return f"{text} {self.hint}".strip()


class ContractError(UserError):
    """The project file breaks the setup/step contract (README: "The user contract")."""
