"""Reading an event log (`events*.jsonl`) that a running session may still be writing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def logged_events(path: Path) -> list[dict[str, Any]]:
    """The whole lines written so far. The writer appends its batches through a buffer, so a file read mid-batch can
    end in part of a line; that part is left for the next read (once the writer is done, every line is whole)."""
    text = path.read_text()
    whole = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in whole.splitlines() if line.strip()]
