"""vram-bench's syntax trees are made one thread at a time (workbench/engine/hotswap/syntax_trees.py).

The race is real on CPython 3.11: a garbage collection in the middle of `ast.parse` runs a finalizer that lets
another thread parse, and the interpreter-wide depth counter comes out wrong (`SystemError: AST constructor
recursion depth mismatch`). The full suite met it once, between the reload thread and the training thread. Here a
third thread keeps finalizers that yield pending while two threads parse, as those two did.
"""

from __future__ import annotations

import ast
import gc
import threading
import time
import traceback
from collections.abc import Callable

from workbench.engine.hotswap import syntax_trees
from workbench.engine.hotswap.syntax_trees import format_traceback, parse

SOURCE = "\n".join(f"def f{i}(a, b):\n    return [x * (a + b) for x in range({i}) if x % 3]\n" for i in range(60))


class _Yields:
    """Garbage whose finalizer lets another thread run, as any Python code in a finalizer may."""

    def __del__(self) -> None:
        time.sleep(0)


def _errors_converting_on_two_threads(first: Callable[[], object], second: Callable[[], object],
                                     rounds: int = 25) -> tuple[list[BaseException], list[BaseException]]:
    """What each thread's conversions raised."""
    stop = threading.Event()
    errors: tuple[list[BaseException], list[BaseException]] = ([], [])

    def litter() -> None:
        while not stop.is_set():
            garbage = _Yields()
            garbage.cycle = garbage  # type: ignore[attr-defined]  # only the collector frees it, mid-parse
            del garbage
            time.sleep(0.0002)

    def convert_often(convert: Callable[[], object], raised: list[BaseException]) -> None:
        try:
            for _ in range(rounds):
                convert()
        except Exception as exc:  # noqa: BLE001 - what the test counts
            raised.append(exc)

    threshold = gc.get_threshold()
    gc.set_threshold(20, 1, 1)  # collections often, so some land inside a parse
    littering = threading.Thread(target=litter)
    converting = [threading.Thread(target=convert_often, args=(convert, raised))
                  for convert, raised in zip((first, second), errors)]
    try:
        littering.start()
        for thread in converting:
            thread.start()
        for thread in converting:
            thread.join(60)
    finally:
        stop.set()
        littering.join(10)
        gc.set_threshold(*threshold)
    assert not any(thread.is_alive() for thread in converting), "the parses did not finish in 60 s"
    return errors


class _CountingAst:
    """The `ast` module as syntax_trees sees it, counting the SystemErrors its parses meet."""

    def __init__(self) -> None:
        self.met = 0

    def parse(self, source: str, filename: str) -> ast.Module:
        try:
            return ast.parse(source, filename)
        except SystemError:
            self.met += 1
            raise


def _parsing() -> object:
    return parse(SOURCE, "<race>")


def test_parses_on_two_threads_take_turns(monkeypatch):
    counting = _CountingAst()
    monkeypatch.setattr(syntax_trees, "ast", counting)
    assert _errors_converting_on_two_threads(_parsing, _parsing) == ([], [])
    assert counting.met == 0


def _formatting_a_traceback() -> Callable[[], object]:
    def fails() -> int:
        values = {"a": [1]}
        return values["a"][0] + values["b"][0] * len(values) - sum(x for x in range(3))

    try:
        fails()
    except KeyError as exc:
        caught = traceback.TracebackException.from_exception(exc)
    return lambda: [format_traceback(caught) for _ in range(20)]


def test_a_parse_and_a_traceback_formatted_on_another_thread_take_turns(monkeypatch):
    """CPython 3.11 parses a traceback's line to underline its expression: the training thread formatting the user's
    traceback made the reload thread's parse fail."""
    counting = _CountingAst()
    monkeypatch.setattr(syntax_trees, "ast", counting)
    assert _errors_converting_on_two_threads(_parsing, _formatting_a_traceback()) == ([], [])
    assert counting.met == 0


def test_a_syntax_error_is_still_raised():
    try:
        parse("def broken(:\n", "broken.py")
    except SyntaxError as exc:
        assert exc.filename == "broken.py" and exc.lineno == 1
    else:
        raise AssertionError("no SyntaxError")
