"""DCP's failures reach the user as errors the session reports (workbench/engine/actions/sharded_snapshot.py).

torch.distributed.checkpoint raises CheckpointException, a BaseException: `except Exception` let it through,
and a resume whose model no longer fit ended the session as a "vram-bench internal error"."""

from __future__ import annotations

import pytest
from torch.distributed.checkpoint.api import CheckpointException

from workbench.engine.actions.sharded_snapshot import _checkpoint_call


def fails_on_ranks() -> None:
    raise CheckpointException("plan", {2: (OSError("No space left on device"), None),
                                       0: (RuntimeError("Missing key in checkpoint state_dict: model/model.c.weight."), None),
                                       1: (RuntimeError("Missing key in checkpoint state_dict: model/model.c.weight."), None)})


def test_a_checkpoint_failure_is_an_exception_naming_each_ranks_failure_once():
    with pytest.raises(RuntimeError) as raised:
        _checkpoint_call(fails_on_ranks)
    assert isinstance(raised.value, Exception)  # what the session's handlers catch
    assert str(raised.value) == ("torch.distributed.checkpoint failed (ranks 0, 1: RuntimeError: Missing key in checkpoint "
                                 "state_dict: model/model.c.weight.; rank 2: OSError: No space left on device)")


def test_what_succeeds_is_returned_as_it_is():
    assert _checkpoint_call(lambda a, b=0: a + b, 2, b=3) == 5
