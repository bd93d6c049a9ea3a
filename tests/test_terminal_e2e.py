"""vram-bench in real terminals, driven with the keyboard alone: tmux, and tmux running `ssh localhost`.

Each test copies the tiny_gpt sample into a tmp dir and starts the real CLI (`vram-bench run
train.py --no-mouse`, from this checkout) in a detached tmux server on a private socket, with
HOME and the XDG folders in the tmp dir and a short private XDG_RUNTIME_DIR under /tmp. `run`
starts the training session as a detached process of its own and opens the app attached to it.
The tests press keys with `tmux send-keys` (space to pause, `s` for a snapshot, `q` then `s` or
`x` to stop the session) and read the screen with `tmux capture-pane`, like a user at a
terminal: no Textual test harness, no mouse. The screens are checked for characters that
terminals mangle, for text that would be invisible at 16 colours, and for colour codes when
NO_COLOR is set.

The terminal going away (the tmux server killed, SIGHUP to the starting process group, a
dropped SSH link) ends the app, not the session (issue 16): it trains on, `vram-bench ls` lists
it, `vram-bench attach` from a new tmux session draws its history and the step count going on,
and stopping it there writes a final snapshot that `--resume latest` loads. Every session
process a test started is ended at its teardown (tests/e2e_sessions.py).

The SSH tests start a throwaway OpenSSH server on a loopback port (its own host key, user key
and config, all in the tmp dir) and run the same session through `ssh -tt 127.0.0.1`. Tests
skip, saying why, where tmux or the OpenSSH server is missing (`.ci/run` installs them where
it can).
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import unicodedata
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from e2e_sessions import (
    end_sessions,
    make_runtime_dir,
    pid_alive,
    session_facts,
    wait_gone,
    wait_session_facts,
)

import workbench

REPO = Path(workbench.__file__).resolve().parent.parent  # the checkout under test
SAMPLE = REPO / "sample_projects" / "tiny_gpt"
WIDTH, HEIGHT = 120, 40
STARTUP_TIMEOUT = 90.0  # torch import + setup() of the sample on a slow, shared CI machine
ACTION_TIMEOUT = 30.0  # a key press until the screen shows its effect
STOP_TIMEOUT = 60.0  # stopping a session: its final snapshot, then its exit, then the app's
SSHD = Path("/usr/sbin/sshd")

needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed (apt-get install tmux)")


# --------------------------------------------------------------------------- the project and its command


def copy_sample(tmp_path: Path) -> Path:
    """The tiny_gpt sample in tmp (so its .vram-bench/ artifacts land there); returns train.py."""
    if not (SAMPLE / "train.py").exists():
        pytest.skip(f"the tiny_gpt sample is not in this checkout ({SAMPLE})")
    root = tmp_path / "tiny_gpt"
    shutil.copytree(SAMPLE, root, ignore=shutil.ignore_patterns(".vram-bench", "__pycache__", "*.pyc"))
    return root / "train.py"


def vram_bench_argv() -> list[str]:
    """The `vram-bench` script next to this interpreter, else `python -m workbench` (the same CLI)."""
    script = Path(sys.executable).with_name("vram-bench")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "workbench"]


_RUNTIME_DIRS: list[Path] = []  # this test's XDG_RUNTIME_DIRs: their sessions are ended at teardown


@pytest.fixture(autouse=True)
def _end_every_session() -> Iterator[None]:
    """After each test (and after its tmux servers are gone): end every session process it started, then
    remove its runtime folder. Autouse, so set up first and torn down last."""
    try:
        yield
    finally:
        while _RUNTIME_DIRS:
            end_sessions(_RUNTIME_DIRS.pop())


def private_env(tmp_path: Path) -> dict[str, str]:
    """A clean environment: no user config, no colour hints, this checkout's workbench first on the path,
    and a short private XDG_RUNTIME_DIR (a session's socket path must fit in 107 bytes) ended at teardown."""
    home = tmp_path / "home"
    runtime = make_runtime_dir()
    _RUNTIME_DIRS.append(runtime)
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "XDG_RUNTIME_DIR": str(runtime),
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(REPO),
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",  # a good neighbour on a shared CI machine
    }
    for folder in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
        Path(env[folder]).mkdir(parents=True, exist_ok=True)
    return env


def vram_bench_command(folder: Path, env: dict[str, str], pid_file: Path, *args: str,
                       extra_env: dict[str, str] | None = None) -> str:
    """A shell command line that records its pid, then becomes `vram-bench ARGS` in `folder`.

    Run it with its own shell (`sh -c`, or as the remote command of ssh): it ends in `exec`.
    """
    assignments = {**env, **(extra_env or {})}
    return " ".join(
        [
            f"echo $$ > {shlex.quote(str(pid_file))};",
            f"cd {shlex.quote(str(folder))} &&",
            "exec env",
            *(shlex.quote(f"{k}={v}") for k, v in assignments.items()),
            *map(shlex.quote, vram_bench_argv()),
            *map(shlex.quote, args),
        ]
    )


def app_command(entry: Path, env: dict[str, str], pid_file: Path, *, extra_env: dict[str, str] | None = None) -> str:
    """`vram-bench run <entry> --no-mouse`: starts the session process, then the app attached to it."""
    return vram_bench_command(entry.parent, env, pid_file, "run", entry.name, "--no-mouse", extra_env=extra_env)


def attach_command(project: Path, env: dict[str, str], pid_file: Path) -> str:
    """`vram-bench attach --no-mouse` in the project's folder: the app again, on the session that runs there."""
    return vram_bench_command(project, env, pid_file, "attach", "--no-mouse")


def vram_bench(env: dict[str, str], *args: str, cwd: Path, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """`vram-bench ARGS` outside any terminal (stdin /dev/null), with the test's environment."""
    return subprocess.run([*vram_bench_argv(), *args], check=False, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, encoding="utf-8", errors="replace", timeout=timeout)


def runtime_dir(env: dict[str, str]) -> Path:
    return Path(env["XDG_RUNTIME_DIR"])


def run_events(project: Path, run: int = -1) -> list[dict]:
    """The events of one of the project's runs (by start: -1 is the newest), as written to its events.jsonl."""
    logs = sorted((project / ".vram-bench" / "runs").glob("*/events.jsonl"))
    if not logs:
        return []
    events = []
    for line in logs[run].read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue  # a line being written
    return events


def session_log_tail(env: dict[str, str], n: int = 15) -> str:
    """The last lines of each session process's own log (its stdout and stderr: tracebacks land there)."""
    parts = []
    for log in sorted((runtime_dir(env) / "vram-bench").glob("*.log")):
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()[-n:]
        parts.append(f"--- {log.name} ---\n" + "\n".join(lines))
    return "\n".join(parts) or "(no session log)"


def events_tail(project: Path, n: int = 40) -> str:
    """What the app's event log says last: prints (a crashed UI's traceback lands there), errors, exits."""
    logs = sorted((project / ".vram-bench" / "runs").glob("*/events.jsonl"))  # the newest run's
    path = logs[-1] if logs else project / ".vram-bench" / "events.jsonl"
    if not path.exists():
        return "(no events.jsonl: the session never started)"
    lines = []
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            event = json.loads(raw)
        except ValueError:
            continue
        if event.get("event") in ("print", "error", "exit", "setup", "paused", "snapshot"):
            event.pop("time", None)
            if event.get("traceback"):
                event["traceback"] = event["traceback"][-600:]
            lines.append(json.dumps(event, ensure_ascii=False)[:300])
    return "\n".join(lines[-n:]) or "(no print/error/exit events)"


# --------------------------------------------------------------------------- tmux


class TmuxScreen:
    """One detached tmux server on a private socket, one pane running a command; read and typed into."""

    def __init__(self, workdir: Path, env: dict[str, str], *, term: str = "tmux-256color", project: Path | None = None) -> None:
        self.socket = f"vram-bench-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        # A socket in the tmp dir goes away with it (tmux leaves its socket file behind); a unix
        # socket path must stay under about 100 bytes, so very long tmp paths fall back to -L.
        socket_path = workdir / f"tmux-{uuid.uuid4().hex[:8]}.sock"
        self.socket_args = ["-S", str(socket_path)] if len(str(socket_path)) < 100 else ["-L", self.socket]
        self.env = env
        self.project = project
        self.pid_file = workdir / f"{self.socket}.pid"  # the app's pid, written by `app_command`
        self.status_file = workdir / f"{self.socket}.status"  # the command's exit status, once it ends
        self.conf = workdir / f"{self.socket}.conf"
        # remain-on-exit keeps a finished pane readable; no status line, so
        # the app gets the whole WIDTH x HEIGHT; TERM inside the pane is `term`.
        self.conf.write_text(
            f"set -g remain-on-exit on\nset -g status off\nset -g history-limit 5000\nset -g default-terminal {term}\n",
            encoding="utf-8",
        )
        self.started = False

    def tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["tmux", "-u", *self.socket_args, "-f", str(self.conf), *args],
            env=self.env, capture_output=True, text=True, encoding="utf-8", errors="replace", timeout=30, check=check,
        )

    def start(self, command: str) -> None:
        """Run a shell command in the pane; its exit status goes to a file (tmux 3.3 can leave a
        finished pane command unreaped, so #{pane_dead_status} is not reliable)."""
        wrapped = f"{command}; echo $? > {shlex.quote(str(self.status_file))}"
        self.tmux("new-session", "-d", "-s", "bench", "-x", str(WIDTH), "-y", str(HEIGHT), wrapped)
        self.started = True

    def capture(self, *, escapes: bool = False, history: bool = False) -> str:
        """The visible screen, one line per row (tmux trims trailing blanks); `escapes` keeps SGR codes.

        `history`: everything since the pane started, wrapped lines joined (what a user scrolls back to).
        """
        flags = (["-e"] if escapes else []) + (["-J", "-S", "-"] if history else [])
        result = self.tmux("capture-pane", "-p", *flags, "-t", "bench", check=False)
        return result.stdout

    def send(self, *keys: str) -> None:
        """Press keys by tmux name: "Space", "Escape", "q"."""
        self.tmux("send-keys", "-t", "bench", *keys)

    def _pane(self, fmt: str) -> str | None:
        result = self.tmux("display-message", "-p", "-t", "bench", fmt, check=False)
        return result.stdout.strip() if result.returncode == 0 else None

    def is_alive(self) -> bool:
        return not self.status_file.exists() and self._pane("#{pane_dead}") == "0"

    def exit_status(self) -> int | None:
        """The exit status of the command (128+N for a signal N); None while it runs."""
        try:
            text = self.status_file.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def explain(self, why: str, screen: str | None = None) -> str:
        screen = self.capture() if screen is None else screen
        alive = "running" if self.is_alive() else f"exited with status {self.exit_status()}"
        text = f"{why}\n--- the screen (the process {alive}) ---\n{screen.rstrip()}\n"
        if self.project is not None:
            text += f"--- {self.project.name}/.vram-bench/events.jsonl (last prints/errors) ---\n{events_tail(self.project)}\n"
        text += f"--- the session processes' logs ---\n{session_log_tail(self.env)}\n"
        return text

    def wait_for(self, condition: str | Callable[[str], bool], timeout: float = ACTION_TIMEOUT, what: str | None = None) -> str:
        """Poll the screen until `condition` (text on it, or a predicate) holds; return that screen."""
        check = (lambda screen: condition in screen) if isinstance(condition, str) else condition
        what = what or (repr(condition) if isinstance(condition, str) else "the screen to change")
        deadline = time.monotonic() + timeout
        while True:
            screen = self.capture()
            if check(screen):
                return screen
            if not self.is_alive():
                pytest.fail(self.explain(f"waiting for {what}: the process exited first", screen), pytrace=False)
            if time.monotonic() > deadline:
                pytest.fail(self.explain(f"waiting for {what}: not on the screen after {timeout:.0f} s", screen), pytrace=False)
            time.sleep(0.2)

    def wait_exit(self, timeout: float = ACTION_TIMEOUT) -> int | None:
        """Wait for the command to end; its exit status."""
        deadline = time.monotonic() + timeout
        while self.exit_status() is None:
            if time.monotonic() > deadline:
                pytest.fail(self.explain(f"the process did not exit within {timeout:.0f} s"), pytrace=False)
            # The shell writes the status file before the pane dies, so read it again after seeing
            # a dead pane: the command may have ended between the two checks.
            if self._pane("#{pane_dead}") != "0" and self.exit_status() is None:
                time.sleep(0.5)  # an `echo $? >` caught between creating and writing the file
                if self.exit_status() is None:
                    pytest.fail(self.explain("the pane closed without an exit status"), pytrace=False)
            time.sleep(0.2)
        return self.exit_status()

    def close(self) -> None:
        """Kill the tmux server (SIGHUP to the pane: the app detaches), then make sure the app it ran is gone.
        The session process is not the app's to end: the test's teardown ends it (`_end_every_session`)."""
        if self.started:
            self.tmux("kill-server", check=False)
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return
        deadline = time.monotonic() + 15  # the app leaves at once on SIGHUP; give a slow machine time
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if pid_alive(pid):
            try:
                os.kill(pid, 9)
            except OSError:
                pass


@pytest.fixture
def tmux_screen(tmp_path: Path) -> Iterator[Callable[..., TmuxScreen]]:
    screens: list[TmuxScreen] = []

    def make(env: dict[str, str], **kwargs: object) -> TmuxScreen:
        screen = TmuxScreen(tmp_path, env, **kwargs)  # type: ignore[arg-type]
        screens.append(screen)
        return screen

    try:
        yield make
    finally:
        for screen in screens:
            screen.close()


# --------------------------------------------------------------------------- what the screen must look like


def status_line(screen: str, state: str) -> str | None:
    """The line that shows `state` (RUNNING / PAUSED) and a step count: the status bar."""
    for line in screen.splitlines():
        if re.search(rf"\b{state}\b", line) and re.search(r"\bstep \d+", line):
            return line
    return None


def step_of(line: str) -> int:
    match = re.search(r"\bstep (\d+)", line)
    assert match, line
    return int(match.group(1))


def running(screen: str) -> bool:
    line = status_line(screen, "RUNNING")
    return line is not None and step_of(line) >= 1


def paused(screen: str) -> bool:
    return status_line(screen, "PAUSED") is not None and status_line(screen, "RUNNING") is None


def assert_no_mangled_characters(screen: str) -> None:
    """Only characters every terminal draws one cell wide, and boxes whose right edges line up."""
    bad = []
    for row, line in enumerate(screen.splitlines()):
        assert len(line) <= WIDTH, f"row {row} is {len(line)} cells wide (terminal {WIDTH}):\n{line}"
        for col, char in enumerate(line):
            code = ord(char)
            if (
                char == "\ufffd"  # a replacement character: bytes that were not valid UTF-8
                or code > 0xFFFF  # emoji and other astral characters: widths differ between terminals
                or unicodedata.east_asian_width(char) in ("W", "F")  # two cells wide
                or unicodedata.combining(char)
                or unicodedata.category(char) in ("Cc", "Cf", "Co", "Cn", "Cs", "Mn", "Me")  # controls, zero-width
            ):
                bad.append(f"row {row} col {col}: U+{code:04X} {unicodedata.name(char, '?')}")
    assert not bad, "characters that terminals mangle:\n  " + "\n  ".join(bad[:20]) + f"\n--- screen ---\n{screen}"

    # A full-width box (the log): every row down to its bottom edge ends on its right border.
    lines = screen.splitlines()
    for top, line in enumerate(lines):
        if len(line) == WIDTH and line.startswith("╭") and line.endswith("╮") and line.count("╮") == 1:
            for row in range(top + 1, len(lines)):
                if lines[row].startswith("╰"):
                    break
                assert len(lines[row]) == WIDTH and lines[row].endswith("│"), (
                    f"row {row} of the box starting at row {top} does not end on its right border "
                    f"(a character drawn wider than the app assumed?):\n{lines[row]!r}\n--- screen ---\n{screen}"
                )


_SGR = re.compile(r"\x1b\[([0-9;]*)m")
_OTHER_ESCAPE = re.compile(r"\x1b(\[[0-9;?]*[A-Za-z]|\][^\x07\x1b]*(\x07|\x1b\\)|[()][0-9A-Za-z]|.)")


def sgr_colour_codes(escaped: str) -> list[str]:
    """Every colour-setting SGR code in a `capture-pane -e` screen (foreground or background)."""
    found = []
    for match in _SGR.finditer(escaped):
        params = [int(p) if p else 0 for p in match.group(1).split(";")]
        i = 0
        while i < len(params):
            p = params[i]
            if p in (38, 48) and i + 1 < len(params):
                width = 3 if params[i + 1] == 5 else 5
                found.append(";".join(map(str, params[i : i + width])))
                i += width
                continue
            if 30 <= p <= 37 or 40 <= p <= 47 or 90 <= p <= 97 or 100 <= p <= 107:
                found.append(str(p))
            i += 1
    return found


def styled_cells(escaped: str) -> list[list[tuple[str, object, object]]]:
    """Rows of (character, foreground, background) as the terminal would show them (reverse applied).

    Colours are normalised so the same colour compares equal however it was written:
    None is the terminal's default, 0-15 the 16 ANSI colours, ("256", n) and ("rgb", r, g, b) the rest.
    """
    fg: object = None
    bg: object = None
    reverse = False

    def extended(params: list[int], i: int) -> tuple[object, int]:
        if i + 1 < len(params) and params[i + 1] == 5 and i + 2 < len(params):
            n = params[i + 2]
            return (n if n < 16 else ("256", n)), 3
        if i + 1 < len(params) and params[i + 1] == 2 and i + 4 < len(params):
            return ("rgb", *params[i + 2 : i + 5]), 5
        return None, len(params) - i

    rows = []
    for raw in escaped.split("\n"):
        row: list[tuple[str, object, object]] = []
        pos = 0
        while pos < len(raw):
            if raw[pos] == "\x1b":
                sgr = _SGR.match(raw, pos)
                if sgr:
                    params = [int(p) if p else 0 for p in sgr.group(1).split(";")]
                    i = 0
                    while i < len(params):
                        p = params[i]
                        step = 1
                        if p == 0:
                            fg, bg, reverse = None, None, False
                        elif p == 7:
                            reverse = True
                        elif p == 27:
                            reverse = False
                        elif 30 <= p <= 37:
                            fg = p - 30
                        elif 90 <= p <= 97:
                            fg = p - 90 + 8
                        elif 40 <= p <= 47:
                            bg = p - 40
                        elif 100 <= p <= 107:
                            bg = p - 100 + 8
                        elif p == 39:
                            fg = None
                        elif p == 49:
                            bg = None
                        elif p in (38, 48):
                            colour, step = extended(params, i)
                            if p == 38:
                                fg = colour
                            else:
                                bg = colour
                        i += step
                    pos = sgr.end()
                    continue
                other = _OTHER_ESCAPE.match(raw, pos)
                pos = other.end() if other else pos + 1
                continue
            shown_fg, shown_bg = (bg, fg) if reverse else (fg, bg)
            if reverse:  # reverse video of a default colour is the other default
                shown_fg = "default-bg" if bg is None else bg
                shown_bg = "default-fg" if fg is None else fg
            row.append((raw[pos], shown_fg, shown_bg))
            pos += 1
        rows.append(row)
    return rows


def assert_text_visible(escaped: str) -> None:
    """No letter, digit or punctuation is drawn in its own background colour (invisible at this colour depth).

    Graphics (box edges, chart dots, bars) are left out: a pane edge that fades into the
    background at a low colour depth is a matter of taste, a word that does is unreadable.
    """
    invisible = []
    for r, row in enumerate(styled_cells(escaped)):
        for c, (char, fg, bg) in enumerate(row):
            if unicodedata.category(char)[0] in "LNP" and fg is not None and fg == bg:
                invisible.append(f"row {r} col {c} {char!r} fg=bg={fg!r}")
    plain = _SGR.sub("", escaped)
    assert not invisible, "text drawn in its background colour:\n  " + "\n  ".join(invisible[:20]) + f"\n--- screen ---\n{plain}"


def test_screen_checks_flag_what_they_are_for() -> None:
    """The checks above on made-up screens (no terminal needed): clean ones pass, each problem is caught."""
    assert sgr_colour_codes("\x1b[1;38;5;16;48;2;1;2;3mX\x1b[0;97;100mY") == ["38;5;16", "48;2;1;2;3", "97", "100"]
    assert sgr_colour_codes("\x1b[1;7mX\x1b[2;39;49mY\x1b[0m") == []
    assert_text_visible("\x1b[97;100mshown\x1b[0m \x1b[7mreversed\x1b[0m \x1b[30;40m\u2500\u2500\x1b[0m (edges may fade)")
    for hidden in ("\x1b[30;40mhidden", "\x1b[38;5;1;41mhidden", "\x1b[7;31;41mhidden", "\x1b[38;2;9;9;9;48;2;9;9;9mhidden"):
        with pytest.raises(AssertionError, match="background"):
            assert_text_visible(hidden)

    top, row, bottom = "\u256d" + "\u2500" * (WIDTH - 2) + "\u256e", "\u2502" + " " * (WIDTH - 2) + "\u2502", "\u2570" + "\u2500" * (WIDTH - 2) + "\u256f"
    assert_no_mangled_characters("\n".join([" status \u2503 \u28c0\u2847 \u2591\u2588 \u258f", top, row, bottom]))
    for bad in ("\ufffd", "\u8868", "\U0001f680", "e\u0301", "\u200b"):
        with pytest.raises(AssertionError, match="mangle"):
            assert_no_mangled_characters(f"text {bad} text")
    with pytest.raises(AssertionError, match="right border"):
        assert_no_mangled_characters("\n".join([top, row[:-2] + "\u2502", bottom]))

    axis = "\u2502 4.0 \u252b\u28a3    \u2523\n\u2502     \u2517\u2501\u2533\u2501\u2501\u2533\u2501\u251b\u2502\n\u2502      10  20  \u2502\n\u2502\n\u2502      step   \u2502"
    assert chart_step_ticks(axis) == [10, 20]
    assert chart_step_ticks("\u2502 loss  waiting for the first step... \u2502") == []


# --------------------------------------------------------------------------- the drive


def pause_and_snapshot(screen: TmuxScreen, project: Path) -> int:
    """Wait for training, press space (PAUSED), then s (snapshot logged and on disk); the paused step."""
    screen.wait_for(running, timeout=STARTUP_TIMEOUT, what="RUNNING and a step count in the status bar")
    screen.send("Space")
    shown = screen.wait_for(paused, what="PAUSED in the status bar after space")
    step = step_of(status_line(shown, "PAUSED") or "")
    screen.send("s")
    shown = screen.wait_for(
        lambda s: re.search(r"SNAPSHOT \S*snapshots/step-0*(\d+)\.pt", s) is not None, what="the snapshot in the log after s"
    )
    logged = int(re.search(r"SNAPSHOT \S*snapshots/step-0*(\d+)\.pt", shown).group(1))  # type: ignore[union-attr]
    assert logged == step, screen.explain(f"paused at step {step}, but the snapshot is of step {logged}", shown)
    assert run_snapshot(project, step).is_file(), screen.explain("no snapshot file", shown)
    return step


def run_snapshot(project: Path, step: int) -> Path:
    """The snapshot of `step` in the project's one run folder (each session writes its own)."""
    found = list((project / ".vram-bench" / "runs").glob(f"*/snapshots/step-{step:08d}.pt"))
    assert len(found) <= 1, found
    return found[0] if found else project / ".vram-bench" / "runs" / "?" / f"step-{step:08d}.pt"


QUESTION = "Leave the session?"  # the title of what q asks


def leave_by_stopping(screen: TmuxScreen, *, snapshot: bool) -> dict:
    """q, then s (stop after a final snapshot) or x (stop without one): the session ends, then the app,
    with status 0; nothing is left running. The session's facts (name, pid)."""
    facts = wait_session_facts(runtime_dir(screen.env))
    screen.send("q")
    asked = screen.wait_for(QUESTION, what=f"{QUESTION!r} after q")
    assert_no_mangled_characters(asked)
    screen.send("s" if snapshot else "x")
    status = screen.wait_exit(timeout=STOP_TIMEOUT)
    key = "s (stop after a final snapshot)" if snapshot else "x (stop without a snapshot)"
    assert status == 0, screen.explain(f"exit status {status} after q, {key}")
    assert wait_gone(int(facts["pid"]), ACTION_TIMEOUT), screen.explain(f"the session (pid {facts['pid']}) still runs after q, {key}")
    after = screen.capture(history=True)
    assert "vram-bench: the session ended (quit, exit code 0)" in after, screen.explain(
        f"the app did not say the session ended after q, {key}", after)
    assert not session_facts(runtime_dir(screen.env)), "the ended session left its facts file behind"
    return facts


def status_step(screen: str) -> int:
    """The step count on the status bar (RUNNING or PAUSED)."""
    line = status_line(screen, "RUNNING") or status_line(screen, "PAUSED")
    assert line is not None, screen
    return step_of(line)


def step_events(project: Path) -> list[int]:
    return [e["step"] for e in run_events(project) if e.get("event") == "step"]


def assert_the_session_trains_on(project: Path, env: dict[str, str], facts: dict, shown_step: int) -> None:
    """The app is gone, the session is not: its process runs, events.jsonl grows, `vram-bench ls` lists it running."""
    pid, name = int(facts["pid"]), facts["name"]
    assert pid_alive(pid), f"the session process (pid {pid}) ended with the app\n{events_tail(project)}\n{session_log_tail(env)}"
    logs = sorted((project / ".vram-bench" / "runs").glob("*/events.jsonl"))
    assert len(logs) == 1, f"one session, one run folder: {logs}"
    before = step_events(project)
    time.sleep(2.0)
    after = step_events(project)
    assert len(after) > len(before) and max(after) > max(before, default=0) >= shown_step, (
        f"events.jsonl did not grow in 2 s after the app left ({len(before)} then {len(after)} step events; "
        f"last steps {before[-1:]} then {after[-1:]})\n{events_tail(project)}\n{session_log_tail(env)}")
    listed = vram_bench(env, "ls", cwd=project)
    assert listed.returncode == 0, f"vram-bench ls: exit {listed.returncode}\n{listed.stdout}{listed.stderr}"
    rows = [line.split() for line in listed.stdout.splitlines()]
    assert rows and rows[0][:4] == ["NAME", "PID", "STATE", "STEP"], listed.stdout
    mine = [row for row in rows[1:] if row and row[0] == name]
    assert len(mine) == 1 and mine[0][1] == str(pid), f"vram-bench ls does not list session {name} (pid {pid}):\n{listed.stdout}"
    assert mine[0][2] == "running" and int(mine[0][3]) >= shown_step, f"not running past step {shown_step}:\n{listed.stdout}"


def chart_step_ticks(screen: str) -> list[int]:
    """The numbers under the loss chart's x axis (the row below its bottom edge `┗━━┳━━┛`, labelled "step"), or []
    while it has no points ("waiting for the first step...")."""
    if "waiting for the first step" in screen:
        return []
    lines = screen.splitlines()
    for row, line in enumerate(lines[:-1]):
        left = line[: WIDTH * 2 // 3]  # the loss pane; the memory pane is on the right
        if "\u2517" in left and "\u2533" in left:  # ┗ and ┳: the plot's bottom edge with its tick marks
            below = lines[row + 1 : row + 4]
            if any(re.search(r"\bstep\b", later[: WIDTH * 2 // 3]) for later in below):
                return [int(n) for n in re.findall(r"\b\d+\b", lines[row + 1][: WIDTH * 2 // 3])]
    return []


def final_snapshot_event(project: Path, run: int = -1) -> dict | None:
    finals = [e for e in run_events(project, run) if e.get("event") == "snapshot" and e.get("reason") == "final"]
    return finals[-1] if finals else None


def assert_resumes_from(project: Path, env: dict[str, str], snapshot: dict) -> None:
    """`vram-bench run train.py --headless --resume latest` loads that snapshot (its `resume` event names it)."""
    max_steps = int(snapshot["step"]) + 2
    result = vram_bench(env, "run", "train.py", "--headless", "--resume", "latest", "--max-steps", str(max_steps),
                        cwd=project, timeout=STARTUP_TIMEOUT + 60)
    events = []
    for line in result.stdout.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    resumed = [e for e in events if e.get("event") == "resume"]
    said = f"exit {result.returncode}\nstdout (last lines):\n" + "\n".join(result.stdout.splitlines()[-15:]) + f"\nstderr:\n{result.stderr[-2000:]}"
    assert result.returncode == 0, f"--resume latest --max-steps {max_steps}: {said}"
    assert resumed and resumed[0].get("ok") and Path(resumed[0]["path"]).resolve() == Path(snapshot["path"]).resolve(), (
        f"--resume latest did not load the final snapshot {snapshot['path']}: resume events {resumed}\n{said}")
    steps = [e["step"] for e in events if e.get("event") == "step"]
    assert steps and steps[0] == int(snapshot["step"]) + 1, f"the resumed run's first step is not {int(snapshot['step']) + 1}: {steps[:5]}"


# --------------------------------------------------------------------------- tmux tests


@needs_tmux
def test_tmux_keyboard_only_pause_snapshot_step_and_stop_with_snapshot(tmp_path: Path, tmux_screen) -> None:
    entry = copy_sample(tmp_path)
    env = private_env(tmp_path)
    screen = tmux_screen(env, term="tmux-256color", project=entry.parent)
    screen.start(shlex.join(["sh", "-c", app_command(entry, env, screen.pid_file)]))

    step = pause_and_snapshot(screen, entry.parent)
    assert_no_mangled_characters(screen.capture())
    assert_text_visible(screen.capture(escapes=True))

    screen.send("n")  # one step while paused: now there is progress a stop without a snapshot would lose
    screen.wait_for(
        lambda s: paused(s) and step_of(status_line(s, "PAUSED") or "step 0") == step + 1, what=f"step {step + 1} after n"
    )
    screen.send("q")
    asked = screen.wait_for(QUESTION, what=f"{QUESTION!r} after q")
    assert re.search(r"\b1 steps? (was|were) trained since the last snapshot", asked), screen.explain("the question does not count the unsaved step", asked)
    assert_no_mangled_characters(asked)
    screen.send("s")  # stop the session after a final snapshot; the app leaves once it has ended
    status = screen.wait_exit(timeout=STOP_TIMEOUT)
    assert status == 0, screen.explain(f"exit status {status} after stopping with a snapshot")
    final = final_snapshot_event(entry.parent)
    assert final is not None and final["step"] == step + 1, screen.explain(f"no final snapshot of step {step + 1} in events.jsonl: {final}")
    assert run_snapshot(entry.parent, step + 1).is_file() and Path(final["path"]) == run_snapshot(entry.parent, step + 1), screen.explain(
        f"no final snapshot file of step {step + 1}: {final}")
    after = screen.capture(history=True)
    assert "vram-bench: the session ended (quit, exit code 0)" in after, screen.explain("the app does not say the session ended", after)
    assert "detached" not in after, screen.explain("the app says it detached, but the session was stopped", after)
    assert not session_facts(runtime_dir(env)), "the stopped session left its facts behind"


@needs_tmux
def test_tmux_16_colours_text_stays_visible(tmp_path: Path, tmux_screen) -> None:
    """TERM=xterm, no COLORTERM: only the 16 ANSI colours are used, and no text vanishes into its background."""
    entry = copy_sample(tmp_path)
    env = private_env(tmp_path)
    screen = tmux_screen(env, term="xterm", project=entry.parent)
    screen.start(shlex.join(["sh", "-c", app_command(entry, env, screen.pid_file)]))

    pause_and_snapshot(screen, entry.parent)
    escaped = screen.capture(escapes=True)
    extended = sorted({c for c in sgr_colour_codes(escaped) if c.startswith(("38;", "48;"))})
    assert not extended, screen.explain(f"colours beyond the 16 ANSI ones with TERM=xterm: {extended[:10]}")
    assert_text_visible(escaped)
    assert_no_mangled_characters(screen.capture())
    leave_by_stopping(screen, snapshot=False)


@needs_tmux
def test_tmux_no_color_has_no_colour_codes(tmp_path: Path, tmux_screen) -> None:
    """NO_COLOR=1 (no-color.org): no colour escape codes at all; bold and reverse still mark things."""
    entry = copy_sample(tmp_path)
    env = private_env(tmp_path)
    screen = tmux_screen(env, term="xterm", project=entry.parent)
    screen.start(shlex.join(["sh", "-c", app_command(entry, env, screen.pid_file, extra_env={"NO_COLOR": "1"})]))

    screen.wait_for(running, timeout=STARTUP_TIMEOUT, what="RUNNING and a step count in the status bar")
    screen.send("Space")
    screen.wait_for(paused, what="PAUSED in the status bar after space")
    escaped = screen.capture(escapes=True)
    colours = sorted(set(sgr_colour_codes(escaped)))
    assert not colours, screen.explain(f"colour codes with NO_COLOR=1: {colours[:12]}")
    assert_no_mangled_characters(screen.capture())

    leave_by_stopping(screen, snapshot=False)  # q, x: the session ends without a snapshot
    assert not list((entry.parent / ".vram-bench").rglob("*.pt")), "stopping without a snapshot wrote one"


# --------------------------------------------------------------------------- ssh


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, **kwargs)  # type: ignore[call-overload]


class Sshd:
    """A throwaway OpenSSH server on a loopback port that lets the current user in with one key."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.user = getpass.getuser()
        self.port = 0
        self.key = folder / "user_key"
        self.log = folder / "sshd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        host_key = self.folder / "host_key"
        for key in (host_key, self.key):
            result = _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "vram-bench-test", "-f", str(key)])
            if result.returncode != 0:
                pytest.skip(f"ssh-keygen failed: {result.stderr.strip()}")
        authorized = self.folder / "authorized_keys"
        authorized.write_text(self.key.with_suffix(".pub").read_text())
        authorized.chmod(0o600)
        if os.geteuid() == 0:  # sshd running as root insists on its privilege-separation folder
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)

        for _attempt in range(3):  # the free port can be taken between asking and binding
            self.port = _free_port()
            config = self.folder / "sshd_config"
            config.write_text(
                "\n".join(
                    [
                        "ListenAddress 127.0.0.1",
                        f"Port {self.port}",
                        f"HostKey {host_key}",
                        f"PidFile {self.folder / 'sshd.pid'}",
                        f"AuthorizedKeysFile {authorized}",
                        f"AllowUsers {self.user}",
                        "PubkeyAuthentication yes",
                        "PasswordAuthentication no",
                        "KbdInteractiveAuthentication no",
                        "PermitRootLogin prohibit-password",
                        "UsePAM no",
                        "StrictModes no",
                        "PrintMotd no",
                        "PrintLastLog no",
                        "LogLevel VERBOSE",
                        "",
                    ]
                )
            )
            check = _run([str(SSHD), "-t", "-f", str(config)])
            if check.returncode != 0:
                pytest.skip(f"sshd rejects the test configuration: {check.stderr.strip()}")
            with open(self.log, "wb") as log:
                self.proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                        return
                except OSError:
                    time.sleep(0.1)
            self.stop()
            if "Address already in use" not in self.log.read_text(errors="replace"):
                break
        pytest.skip(f"sshd did not start: {self.log.read_text(errors='replace').strip()[-800:]}")

    def ssh_argv(self, *remote: str, tty: bool = False) -> list[str]:
        return [
            "ssh", *(["-tt"] if tty else []), "-F", "/dev/null", "-p", str(self.port), "-i", str(self.key), "-l", self.user,
            "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=30",
            "127.0.0.1", *remote,
        ]  # fmt: skip

    def check_login(self, env: dict[str, str]) -> None:
        result = _run(self.ssh_argv("echo", "vram-bench-ssh-ok"), env=env, stdin=subprocess.DEVNULL)
        if "vram-bench-ssh-ok" not in result.stdout:
            log = self.log.read_text(errors="replace").strip()[-800:]
            pytest.skip(f"cannot log in to the test sshd as {self.user}: {result.stderr.strip()} | sshd: {log}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    if not SSHD.exists():
        pytest.skip("openssh-server not installed (apt-get install openssh-server)")
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (apt-get install openssh-client)")
    server = Sshd(tmp_path / "sshd")
    try:
        server.start()
        yield server
    finally:
        server.stop()


def start_over_ssh(tmp_path: Path, sshd: Sshd, tmux_screen: Callable[..., TmuxScreen]) -> tuple[TmuxScreen, Path]:
    """The sample, run by `ssh -tt 127.0.0.1 '<vram-bench command>'` in a tmux pane; (screen, train.py)."""
    entry = copy_sample(tmp_path)
    env = private_env(tmp_path)
    sshd.check_login(env)
    screen = tmux_screen(env, term="xterm-256color", project=entry.parent)
    # The login gets a fresh environment: the command hands the app the same interpreter, paths and HOME.
    screen.start(shlex.join(sshd.ssh_argv(app_command(entry, env, screen.pid_file), tty=True)))
    return screen, entry


@needs_tmux
def test_ssh_session_in_tmux_keyboard_only_pause_snapshot_quit(tmp_path: Path, sshd: Sshd, tmux_screen) -> None:
    screen, entry = start_over_ssh(tmp_path, sshd, tmux_screen)

    pause_and_snapshot(screen, entry.parent)
    assert_no_mangled_characters(screen.capture())
    assert_text_visible(screen.capture(escapes=True))
    leave_by_stopping(screen, snapshot=False)  # ssh's exit status is the remote command's
    assert sshd.log.read_text(errors="replace").count("Accepted publickey") >= 2, "the session did not go through sshd"


def attach_and_stop(tmp_path: Path, tmux_screen: Callable[..., TmuxScreen], project: Path, env: dict[str, str],
                    shown_step: int, *, over: Sshd | None = None) -> dict:
    """`vram-bench attach --no-mouse` from a new tmux server (through ssh if `over`): the step count goes on from
    where it was and the chart draws the history; then q, s stops the session. Its final snapshot event."""
    screen = tmux_screen(env, term="xterm-256color", project=project)
    command = attach_command(project, env, screen.pid_file)
    screen.start(shlex.join(over.ssh_argv(command, tty=True)) if over is not None else shlex.join(["sh", "-c", command]))
    shown = screen.wait_for(lambda s: running(s) and status_step(s) >= shown_step, timeout=ACTION_TIMEOUT,
                            what=f"RUNNING at step >= {shown_step} after attach")
    trained = max(step_events(project), default=shown_step)  # before this client attached
    shown = screen.wait_for(lambda s: bool(chart_step_ticks(s)) and min(chart_step_ticks(s)) < trained,
                            what=f"the loss chart's history after attach (its step axis ticks from below step {trained})")
    assert_no_mangled_characters(shown)
    leave_by_stopping(screen, snapshot=True)
    final = final_snapshot_event(project)
    assert final is not None and Path(final["path"]).is_file() and final["step"] >= shown_step, screen.explain(
        f"no final snapshot after stopping the attached session: {final}", screen.capture(history=True))
    return final


@needs_tmux
@pytest.mark.timeout(420)
def test_ssh_dropped_connection_leaves_the_session_training_then_attach_stop_and_resume(
        tmp_path: Path, sshd: Sshd, tmux_screen) -> None:
    """Issue 16 end to end: the SSH link drops mid-training (the tmux server and its ssh client die: sshd hangs
    up, SIGHUP); the app ends, the session trains on; attach from a new terminal, stop it with a final
    snapshot; `--resume latest` loads that snapshot."""
    screen, entry = start_over_ssh(tmp_path, sshd, tmux_screen)
    project, env = entry.parent, screen.env
    shown = screen.wait_for(running, timeout=STARTUP_TIMEOUT, what="RUNNING and a step count in the status bar")
    shown_step = status_step(shown)
    app_pid = int(screen.pid_file.read_text().strip())
    facts = wait_session_facts(runtime_dir(env))
    assert int(facts["pid"]) != app_pid and Path(facts["project"]) == project.resolve(), facts

    screen.tmux("kill-server")  # the ssh client dies with its terminal; the connection drops
    assert wait_gone(app_pid, ACTION_TIMEOUT), (
        f"the app (pid {app_pid}) still runs {ACTION_TIMEOUT:.0f} s after its SSH connection dropped\n{events_tail(project)}")
    assert_the_session_trains_on(project, env, facts, shown_step)
    assert not any(e.get("event") == "exit" for e in run_events(project)), events_tail(project)

    final = attach_and_stop(tmp_path, tmux_screen, project, env, shown_step, over=sshd)
    assert sshd.log.read_text(errors="replace").count("Accepted publickey") >= 3, "the attach did not go through sshd"
    assert_resumes_from(project, env, final)


@needs_tmux
@pytest.mark.timeout(240)
def test_tmux_hangup_to_the_starting_process_group_leaves_the_session_training(tmp_path: Path, tmux_screen) -> None:
    """A closed terminal without ssh: SIGHUP to the process group that started `vram-bench run`. The app says it
    detached and how to come back; the session (its own process group) trains on; `vram-bench stop NAME` from
    another shell writes its final snapshot and ends it."""
    entry = copy_sample(tmp_path)
    project, env = entry.parent, private_env(tmp_path)
    screen = tmux_screen(env, project=project)
    # The pane's own shell waits out the hangup (`trap : HUP`), so the pane stays open and shows what the app
    # says on its way out; tmux closes the terminal of a pane whose first process died, and the app's last
    # words with it. `sh -c` restores the default disposition for the app.
    screen.start("trap : HUP; " + shlex.join(["sh", "-c", app_command(entry, env, screen.pid_file)]))
    shown = screen.wait_for(running, timeout=STARTUP_TIMEOUT, what="RUNNING and a step count in the status bar")
    shown_step = status_step(shown)
    app_pid = int(screen.pid_file.read_text().strip())
    facts = wait_session_facts(runtime_dir(env))
    pgid = os.getpgid(app_pid)
    assert os.getpgid(int(facts["pid"])) != pgid, "the session runs in the terminal's process group"

    os.killpg(pgid, signal.SIGHUP)
    assert wait_gone(app_pid, ACTION_TIMEOUT), f"the app (pid {app_pid}) still runs {ACTION_TIMEOUT:.0f} s after SIGHUP"
    status = screen.wait_exit()
    assert status == 0, screen.explain(f"exit status {status} after SIGHUP (a hangup detaches)")
    said = f"vram-bench: detached; session {facts['name']} trains on (pid {facts['pid']})"
    after = screen.capture(history=True)
    assert said in after and f"vram-bench attach {facts['name']}" in after and f"vram-bench stop {facts['name']}" in after, (
        screen.explain("the app did not say it detached and how to come back", after))
    assert_the_session_trains_on(project, env, facts, shown_step)

    stopped = vram_bench(env, "stop", facts["name"], cwd=tmp_path, timeout=STOP_TIMEOUT)
    final = final_snapshot_event(project)
    assert stopped.returncode == 0 and final is not None, (
        f"vram-bench stop: exit {stopped.returncode}\n{stopped.stderr}\n{events_tail(project)}")
    assert f"vram-bench: final snapshot: {final['path']}" in stopped.stderr and Path(final["path"]).is_file(), stopped.stderr
    assert final["step"] > shown_step, final
    assert not pid_alive(int(facts["pid"])), f"the session (pid {facts['pid']}) still runs after vram-bench stop"


# --------------------------------------------------------------------------- a dropped connection while a step is stuck

STUCK_AT_STEP_3 = '''\
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch


def setup(bench):
    model = torch.nn.Linear(4, 1)
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01)}


def step(state, bench):
    if bench.step == 3:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        Path("stuck").write_text(str(child.pid))
        threading.Event().wait()  # blocked in C: no interrupt lands here
    time.sleep(0.01)
    loss = state["model"](torch.ones(2, 4)).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return loss
'''

# Lowers the quit escalation (10 s + 5 s) for the test: imported at interpreter start, in the app and in
# the session process it starts (which inherits PYTHONPATH). The session process quits through
# run_headless, which reads headless.QUIT_TIMEOUTS; quit_escalation's copy is the in-process app's.
LOWER_QUIT_TIMEOUTS = '''\
import workbench.frontends.headless as headless
import workbench.engine.quit_escalation as quit_escalation

LOWER = quit_escalation.QuitTimeouts(step=1.0, interrupted=1.0, children=2.0)
quit_escalation.QUIT_TIMEOUTS = LOWER
headless.QUIT_TIMEOUTS = LOWER
'''


@needs_tmux
@pytest.mark.timeout(240)
def test_tmux_dropped_connection_with_a_stuck_step_detaches_then_stop_ends_the_session_and_its_children(
        tmp_path: Path, tmux_screen) -> None:
    """The app does not own the step: the link drops while a step is stuck and the app leaves at once; the
    session stays (stuck). `vram-bench stop NAME` then asks for a final snapshot after the step; a step that
    never ends must not keep the session (and what it started) alive for the 10 minutes a snapshot may take."""
    project = tmp_path / "stuck"
    project.mkdir()
    (project / "train.py").write_text(STUCK_AT_STEP_3, encoding="utf-8")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(LOWER_QUIT_TIMEOUTS, encoding="utf-8")
    env = private_env(tmp_path)
    screen = tmux_screen(env, project=project)
    screen.start(app_command(project / "train.py", env, screen.pid_file, extra_env={"PYTHONPATH": f"{site}:{REPO}"}))
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while not (project / "stuck").exists():
        if time.monotonic() > deadline or not screen.is_alive():
            pytest.fail(screen.explain("the step never got stuck"), pytrace=False)
        time.sleep(0.2)
    time.sleep(0.5)
    app_pid = int(screen.pid_file.read_text().strip())
    child_pid = int((project / "stuck").read_text().strip())
    facts = wait_session_facts(runtime_dir(env))
    session_pid = int(facts["pid"])
    assert pid_alive(app_pid) and pid_alive(child_pid)
    assert psutil.Process(child_pid).ppid() == session_pid, "the step's subprocess is not the session process's child"
    inherited = Path(f"/proc/{session_pid}/environ").read_bytes().split(b"\0")
    assert f"PYTHONPATH={site}:{REPO}".encode() in inherited, "the session process did not inherit the lowered quit timeouts"

    dropped = time.monotonic()
    screen.tmux("kill-server", check=False)  # the SSH link drops: SIGHUP to the app, which detaches
    assert wait_gone(app_pid, 10.0), f"the app was still running {time.monotonic() - dropped:.0f} s after SIGHUP (a stuck step is not its own)"
    time.sleep(1.0)
    assert pid_alive(session_pid) and pid_alive(child_pid), f"the session or its step's subprocess ended with the app\n{events_tail(project)}"

    asked = time.monotonic()
    stopped = vram_bench(env, "stop", facts["name"], cwd=tmp_path, timeout=STOP_TIMEOUT)
    took = time.monotonic() - asked
    said = events_tail(project)
    assert wait_gone(session_pid, 5.0), f"the session still runs {time.monotonic() - asked:.0f} s after vram-bench stop\n{said}"
    assert took < 20.0, f"vram-bench stop took {took:.0f} s with the quit timeouts lowered to 1 s + 1 s + 2 s"
    assert wait_gone(child_pid, 5.0), "the step's subprocess outlived the session"
    assert stopped.returncode == 1 and "ended (stuck, exit code 1)" in stopped.stderr, (
        f"vram-bench stop: exit {stopped.returncode}\n{stopped.stderr}\n{said}")
    assert '"where": "quit"' in said and "ending 1 child process" in said, said
