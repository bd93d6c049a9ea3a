"""Read a child process's output to the end after a test has read some of it line by line.

`Popen.communicate()` reads the pipes' file descriptors directly, so whatever `proc.stdout.readline()` had
already buffered past the last line it returned is lost to it. How much that is depends on how the child
batches its writes (the headless stream prints steps in batches), so a test mixing the two passes or fails
with the batching. `finish` reads the rest through the same file objects instead.
"""

from __future__ import annotations

import subprocess
import threading


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """Wait up to `timeout` s for the process to end; (the rest of stdout, the rest of stderr), each read through
    the file object the test already read from. Both pipes are drained at once, so a child filling one while the
    test waits on the other cannot deadlock. On timeout the child is killed and `subprocess.TimeoutExpired` raised."""
    if proc.stdin is not None:
        proc.stdin.close()  # as communicate() does: a child reading commands sees the end of its input
    rest: dict[str, str] = {}

    def drain(name: str) -> None:
        stream = getattr(proc, name)
        rest[name] = stream.read() if stream is not None else ""

    readers = [threading.Thread(target=drain, args=(name,), daemon=True) for name in ("stdout", "stderr")]
    for reader in readers:
        reader.start()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    for reader in readers:
        reader.join(10)  # the pipes close when the child exits, unless a grandchild inherited them
    return rest.get("stdout", ""), rest.get("stderr", "")
