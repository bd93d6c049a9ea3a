"""`vram-bench ls | attach | stop`: the sessions of this user on this machine, from any terminal.

They find sessions in the runtime folder (workbench/protocol/registry.py), clean up the
sockets of dead ones (and say so), and speak to live ones over their socket.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path

from workbench.errors import UserError
from workbench.protocol import registry
from workbench.protocol.client import SessionClient, SessionGone
from workbench.protocol.wire import ClientHello, WireError

STOP_TIMEOUT = 600.0  # a final snapshot of a large model takes a while


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def live_entries() -> list[registry.SessionEntry]:
    """Live sessions; a dead one's socket is removed, with a line saying so."""
    live = []
    for entry in registry.entries():
        if registry.stale(entry):
            registry.remove(entry)
            say(f"vram-bench: session {entry.name} is gone (killed? its pid {entry.facts.pid if entry.facts else '?'} "
                f"does not run); its socket was removed. Its log: {entry.log_file}")
        else:
            live.append(entry)
    return live


def pick(name: str | None) -> registry.SessionEntry:
    """NAME's session; with no NAME, the only one, or the one of the current folder."""
    live = live_entries()
    if name is not None:
        for entry in live:
            if entry.name == name:
                return entry
        known = ", ".join(e.name for e in live) or "none is running"
        raise UserError(f"no session named {name!r} (sessions: {known}).", hint="vram-bench ls lists them.")
    if not live:
        raise UserError("no session is running.", hint="Start one with: vram-bench run train.py")
    if len(live) == 1:
        return live[0]
    here = Path.cwd().resolve()
    for entry in live:
        if entry.facts is not None and (here == Path(entry.facts.project) or Path(entry.facts.project) in here.parents):
            return entry
    names = "\n".join(f"  {e.name:<16} {e.facts.project if e.facts else ''}" for e in live)
    raise UserError(f"{len(live)} sessions are running; name one:\n{names}", hint="e.g. vram-bench attach " + live[0].name)


# ls ----------------------------------------------------------------------------------------
def ls_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="vram-bench ls", description="The sessions of this user on this machine.")
    parser.parse_args(argv)
    rows = [("NAME", "PID", "STATE", "STEP", "CODE", "DEVICE", "UP", "CLIENTS", "PROJECT")]
    for entry in live_entries():
        facts = entry.facts
        state, step, code, clients = "?", "?", "?", "?"
        try:
            with SessionClient(entry.socket, ClientHello(client="ls", history="none"), timeout=2.0) as client:
                status = client.hello.get("status", {})
                state = str(status.get("state", "?"))
                step, code = str(status.get("step", "?")), f"v{status.get('code_version', '?')}"
                clients = str(max(0, int(status.get("clients", 1)) - 1))  # not counting ls itself
        except (SessionGone, WireError, OSError):
            state = "busy"  # alive, but it did not answer in time
        project = facts.entry if facts else "?"
        home = str(Path.home())
        if project.startswith(home + os.sep):
            project = "~" + project[len(home):]
        rows.append((entry.name, str(facts.pid) if facts else "?", state, step, code, facts.device if facts else "?",
                     registry.uptime(facts) if facts else "?", clients, project))
    others = registry.elsewhere()
    if len(rows) == 1:
        print("no sessions on this machine" + ("" if others else " (start one with: vram-bench run train.py)"))
    else:
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        for row in rows:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])
    if others:  # this folder is shared with other machines: their sessions are reached there
        print("on other machines sharing this sessions folder (attach there):")
        for entry in others:
            if (facts := entry.facts) is None:
                continue  # elsewhere() holds only entries whose facts name another host
            print(f"  {entry.name}  on {facts.host} (pid {facts.pid}, up {registry.uptime(facts)})  {facts.entry}")
    return 0


# stop --------------------------------------------------------------------------------------
def stop_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="vram-bench stop", description="Write a final snapshot, then end the session.")
    parser.add_argument("name", nargs="?", help="the session (default: the only one, or this folder's)")
    parser.add_argument("--no-snapshot", action="store_true", help="end it without a final snapshot")
    args = parser.parse_args(argv)
    try:
        entry = pick(args.name)
    except UserError as exc:
        say(f"vram-bench: error: {exc}")
        return 2
    if entry.facts is None:
        say(f"vram-bench: error: session {entry.name} has no facts file; cannot tell its pid")
        return 2
    code = 1
    ended = False
    try:
        client = SessionClient(entry.socket, ClientHello(client="stop", history="none"))
    except (SessionGone, WireError) as exc:
        say(f"vram-bench: error: {exc}")
        return 1
    with client:
        if args.no_snapshot:
            client.send_line("quit")
        else:
            os.kill(entry.facts.pid, signal.SIGTERM)  # the session's own meaning: final snapshot, clean exit
        say(f"vram-bench: stopping session {entry.name} (pid {entry.facts.pid})...")
        for message in client.messages():
            kind = message.get("event")
            if kind == "snapshot":
                say(f"vram-bench: final snapshot: {message.get('path')}")
            elif kind == "error" and message.get("where") in ("snapshot", "final snapshot"):
                say(f"vram-bench: error: {message.get('message')}")
            elif kind == "exit":
                ended = True
                code = int(message.get("code", 0) or 0)
                say(f"vram-bench: session {entry.name} ended ({message.get('reason', 'quit')}, exit code {code})")
    deadline = time.monotonic() + 10.0
    while registry.pid_alive(entry.facts.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not ended:  # the socket closed first (a forced exit): the run's own log has the last word
        logged = _logged_exit(Path(str(client.hello.get("session", {}).get("run_dir", ""))))
        if logged is not None:
            code = int(logged.get("code", 1) or 0)
            say(f"vram-bench: session {entry.name} ended ({logged.get('reason', 'quit')}, exit code {code})")
        else:
            say(f"vram-bench: session {entry.name} closed its socket without an exit event; its log: {entry.log_file}")
    return code


def _logged_exit(run_dir: Path) -> dict | None:
    """The `exit` event in a run folder's events.jsonl, if it got there."""
    import json

    try:
        lines = (run_dir / "events.jsonl").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines[-50:]):
        if line.startswith('{"event":"exit"'):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


# attach ------------------------------------------------------------------------------------
def attach_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="vram-bench attach", description="Open a running session: the app, or its JSON lines.")
    parser.add_argument("name", nargs="?", help="the session (default: the only one, or this folder's)")
    parser.add_argument("--json", action="store_true", help="the headless protocol over the session: events out, commands in")
    parser.add_argument("--history", choices=("screen", "full", "none"), default="none",
                        help="--json: replay history in the hello line (default none)")
    parser.add_argument("--no-mouse", action="store_true", help="keyboard only, no mouse capture")
    parser.add_argument("--theme", metavar="NAME", help="the app's theme for this attach")
    parser.add_argument("--socket", type=Path, metavar="PATH",
                        help="attach through this socket (one forwarded with ssh -L from another machine)")
    args = parser.parse_args(argv)
    try:
        entry = registry.SessionEntry(args.socket.stem, args.socket, None) if args.socket else pick(args.name)
    except UserError as exc:
        say(f"vram-bench: error: {exc}")
        return 2
    if args.json:
        return attach_json(entry, args.history)
    from workbench.frontends.attach import attach_app

    try:
        return attach_app(entry, theme=args.theme, mouse=not args.no_mouse)
    except UserError as exc:
        say(f"vram-bench: error: {exc}")
        return 2


def attach_json(entry: registry.SessionEntry, history: str) -> int:
    """Lines out as the session sends them (the hello first); stdin lines in as commands. The session's exit code."""
    try:
        client = SessionClient(entry.socket, ClientHello(client="attach --json", history=history))
    except (SessionGone, WireError) as exc:
        say(f"vram-bench: error: {exc}")
        return 1
    out = sys.stdout.buffer
    code = None

    def forward_commands() -> None:
        from workbench.protocol.lines import read_lines

        for line in read_lines(sys.stdin.fileno()):
            if line.text.strip():
                try:
                    client.send_line(line.text)
                except SessionGone:
                    return

    threading.Thread(target=forward_commands, name="vram-bench-attach-stdin", daemon=True).start()
    try:
        import json

        out.write(json.dumps(client.hello, separators=(",", ":")).encode() + b"\n")
        out.flush()
        for line in client.raw_lines():
            out.write(line + b"\n")
            out.flush()
            if line.startswith(b'{"event":"exit"'):
                code = int(json.loads(line).get("code", 0) or 0)
    except KeyboardInterrupt:
        return 0  # detached: the session goes on
    except BrokenPipeError:
        return 0
    finally:
        client.close()
    if code is None:
        say(f"vram-bench: session {entry.name} closed its socket without an exit event (killed?). Its log: {entry.log_file}")
        return 1
    return code
