"""The event bus: a lingering reader gets steps in batches, anything else at once; an event's JSON is made once."""

from __future__ import annotations

import json
import threading
import time

from workbench.protocol.eventbus import EventBus
from workbench.protocol.events import Error, Exit, Memory, Paused, Step


def _step(n: int) -> Step:
    return Step(step=n, loss=1.0 / n, ms=0.1)


def test_a_lingering_reader_wakes_once_for_a_burst_of_steps() -> None:
    bus = EventBus()
    sub = bus.subscribe()
    batches: list[int] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            got = sub.wait(timeout=0.05, linger=0.5)
            if got:
                batches.append(len(got))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    for n in range(1, 2001):
        bus.publish(_step(n))
    deadline = time.monotonic() + 10
    while sum(batches) < 2000 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    reader.join(5)
    assert sum(batches) == 2000  # nothing lost
    assert len(batches) <= 5, batches  # one wakeup per burst, not one per step


def test_a_reader_without_linger_still_gets_each_event_as_it_comes() -> None:
    bus = EventBus()
    sub = bus.subscribe()
    bus.publish(_step(1))
    started = time.monotonic()
    assert [e.step for e in sub.wait(timeout=5)] == [1]  # type: ignore[attr-defined]
    assert time.monotonic() - started < 1.0


def test_anything_but_routine_telemetry_ends_the_linger_at_once() -> None:
    bus = EventBus()
    sub = bus.subscribe()
    bus.publish(_step(1))
    bus.publish(Memory(rss_bytes=1, rss_anon_bytes=1, rss_file_bytes=0, system_total_bytes=2, system_available_bytes=1))
    threading.Timer(0.2, lambda: bus.publish(Paused(reason="user", step=1))).start()
    started = time.monotonic()
    got = sub.wait(timeout=5, linger=30.0)
    waited = time.monotonic() - started
    assert waited < 10.0, "the pause waited for the whole linger"
    assert [type(e).__name__ for e in got] == ["Step", "Memory", "Paused"]


def test_a_queue_that_starts_with_an_error_is_not_held_back() -> None:
    bus = EventBus()
    sub = bus.subscribe()
    bus.publish(Error(where="step", message="boom"))
    bus.publish(_step(1))
    started = time.monotonic()
    got = sub.wait(timeout=5, linger=30.0)
    assert time.monotonic() - started < 10.0
    assert len(got) == 2


def test_only_steps_queued_wait_out_the_linger() -> None:
    bus = EventBus()
    sub = bus.subscribe()
    bus.publish(_step(1))
    started = time.monotonic()
    got = sub.wait(timeout=5, linger=0.3)
    assert time.monotonic() - started >= 0.25  # held back for more steps
    assert len(got) == 1


def test_an_events_json_is_made_once_and_matches_its_dict() -> None:
    step = Step(step=3, loss=float("nan"), ms=1.5, scalars={"lr": 0.1}, rank=1)
    first = step.to_json()
    assert step.to_json() is first  # every reader writes the same text
    assert json.loads(first) == step.to_dict()
    assert json.loads(first)["loss"] == "nan"
    a, b = Step(step=1, loss=0.5, ms=1.0, time=10.0), Step(step=1, loss=0.5, ms=1.0, time=10.0)
    a.to_json()
    assert a == b  # the kept text is not a field: equality and the schema are unchanged
    assert "_json" not in a.to_dict()


def _memory() -> Memory:
    return Memory(rss_bytes=1, rss_anon_bytes=1, rss_file_bytes=0, system_total_bytes=2, system_available_bytes=1)


def test_an_engines_bus_delivers_nothing_after_the_exit() -> None:
    # The sampler can publish a memory sample while the session winds down: no reader may see it after `exit`.
    bus = EventBus(ends_at_exit=True)
    reader = bus.subscribe()
    bus.publish(_step(1))
    bus.publish(Exit(reason="max steps", step=1))
    bus.publish(_memory())
    bus.publish(Exit(reason="stuck", step=1, code=3))  # a forced exit racing the worker's: one exit only
    assert [type(e).__name__ for e in reader.drain()] == ["Step", "Exit"]


def test_a_clients_bus_goes_on_after_the_exit() -> None:
    # The app's own bus says why a key did nothing once the session ended: that error comes after the exit.
    bus = EventBus()
    reader = bus.subscribe()
    bus.publish(Exit(reason="quit", step=1))
    bus.publish(Error(where="session", message="not sent (pause): the session ended"))
    assert [type(e).__name__ for e in reader.drain()] == ["Exit", "Error"]


def test_racing_exits_from_many_threads_publish_exactly_one() -> None:
    bus = EventBus(ends_at_exit=True)
    reader = bus.subscribe()
    start = threading.Barrier(8)

    def publish(n: int) -> None:
        start.wait()
        bus.publish(Exit(reason=f"thread {n}", step=n))

    threads = [threading.Thread(target=publish, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(reader.drain()) == 1


def _switches() -> int:
    """The calling thread's voluntary context switches so far: each time it slept and was woken (Linux)."""
    with open("/proc/thread-self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("voluntary_ctxt_switches"))


def test_while_steps_flow_a_lingering_reader_sleeps_once_a_batch() -> None:
    """It woke for the first step after each batch and then lingered: two wakeups a batch. Each wakeup of a thread
    beside training cost a 2-rank run steps (bench/RESULTS.md, eleventh sitting)."""
    bus = EventBus()
    sub = bus.subscribe()
    stop = threading.Event()

    def publish() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            bus.publish(_step(n))
            time.sleep(0.002)

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    try:
        sub.wait(timeout=1.0, linger=0.05)  # the first batch: steps are flowing from here on
        before, batches = _switches(), 0
        for _ in range(20):
            assert sub.wait(timeout=1.0, linger=0.05), "steps flow: every batch has some"
            batches += 1
        per_batch = (_switches() - before) / batches
    finally:
        stop.set()
        publisher.join()
    assert per_batch < 1.5, per_batch
    bus.publish(Error(where="step", message="boom"))  # and anything else still arrives at once
    started = time.monotonic()
    assert any(isinstance(e, Error) for e in sub.wait(timeout=1.0, linger=5.0))
    assert time.monotonic() - started < 1.0
