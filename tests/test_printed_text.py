"""A progress bar's line reaches the log as a terminal shows it (workbench/engine/printed_text.py).

pytorch-cifar's `progress_bar` writes `\\r`, backspaces and the bar, then flushes: every `print` event carried the
control characters, which the app drew as garbage.
"""

from __future__ import annotations

from conftest import TRAIN_PY, is_event
from workbench.engine.printed_text import as_a_terminal_shows, is_only_control


def test_carriage_returns_overwrite_and_backspaces_move_back() -> None:
    assert as_a_terminal_shows("plain line") == "plain line"
    assert as_a_terminal_shows("\r [=====>....] 5/10") == " [=====>....] 5/10"
    assert as_a_terminal_shows("abc\rxy") == "xyc", "a terminal overwrites, it does not clear the line"
    assert as_a_terminal_shows("loss 0.5\b\b\b0.25") == "loss 0.25"
    assert as_a_terminal_shows("\b\bx") == "x", "no further back than the line's start"
    assert is_only_control("\r") and is_only_control("\b\b\r") and not is_only_control("") and not is_only_control("\rx")


BAR = TRAIN_PY.replace("def step(state, bench):\n", """def step(state, bench):
    import sys
    sys.stdout.write("\\r" + " Step: 1ms" + "\\b" * 3 + "2ms | Loss: 1.0")
    sys.stdout.flush()
    sys.stdout.write("\\r")
    sys.stdout.flush()
""", 1)


def test_a_bar_a_step_draws_is_one_readable_print_event_a_flush(start_session) -> None:
    assert "\\b" in BAR
    live = start_session({"train.py": BAR})
    printed = live.wait_for(is_event("print", stream="stdout"), timeout=30)
    assert printed.text == " Step: 2ms | Loss: 1.0", repr(printed.text)
    live.events.steps(2)
    texts = [e.text for e in live.events.of("print")]
    assert texts and all(t == " Step: 2ms | Loss: 1.0" for t in texts), texts  # no event for a lone "\r"
