"""Whether a step's exception came out of a DataLoader: its worker processes died under it.

A signal meant for the whole job (torchrun's SIGTERM, which it sends to every process of a rank's group) also
reaches the DataLoader's workers; those this process forked wait for it (forked_children.py), others (a
`spawn` context) die, and the step that asks them for its next batch then fails ("DataLoader worker ... exited unexpectedly", or a reset connection while a
batch's shared memory is handed over). That is the stop, not the user's code or a dead process group.
"""

from __future__ import annotations

import os
import traceback

_DATA_LOADER = os.path.join("torch", "utils", "data") + os.sep


def raised_in_data_loader(exc: BaseException) -> bool:
    """True if any frame of the exception's traceback is in torch.utils.data (the DataLoader's iterator)."""
    return any(_DATA_LOADER in frame.filename for frame in traceback.extract_tb(exc.__traceback__))
