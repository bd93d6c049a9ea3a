"""`vram-bench serve`: textual-serve behind a token, a Host check and an Origin check.

Each test starts the real server (`workbench.frontends.tui.serve.serve`) in a subprocess, serving a tiny
Textual app that counts up every 0.2 s, and talks to it over HTTP and websockets with
aiohttp, or with a headless Chromium driven by Playwright.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest.importorskip("textual_serve", reason="textual-serve not installed (pip install 'vram-bench[serve]')")
import aiohttp  # a textual-serve dependency

from tests.test_terminal_e2e import Sshd, _free_port, sshd  # noqa: F401  (a throwaway sshd, the fixture)
from workbench.errors import UserError
from workbench.frontends.tui.serve import Gate, HostRule, add_serve_arguments, listen_unix, split_host

REPO = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT = 30.0

COUNTER_APP = """\
from textual.app import App, ComposeResult
from textual.widgets import Static


class Counter(App):
    def compose(self) -> ComposeResult:
        yield Static("count 0", id="count")

    def on_mount(self) -> None:
        self.n = 0
        self.set_interval(0.2, self.tick)

    def tick(self) -> None:
        self.n += 1
        self.query_one("#count", Static).update(f"count {self.n}")


Counter().run()
"""

SERVER = """\
import argparse
import sys
from pathlib import Path
from workbench.frontends.tui.serve import add_serve_arguments, run_serve, serve

command, mode, where = sys.argv[1:4]
out = lambda line: print(line, flush=True)
if mode == "cli":  # as `vram-bench serve ARGS...` will: NAME's socket in the folder `where`
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    run_serve(parser.parse_args(sys.argv[4:]), lambda name: command, folder=Path(where), out=out)
elif mode == "unix":
    serve(command, unix_path=Path(where), host=None, port=None, title="counter", out=out)
else:
    host, port = where.rsplit(":", 1)
    serve(command, unix_path=None, host=host, port=int(port), title="counter", out=out)
print("stopped", flush=True)
"""


@dataclass
class Served:
    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    pending: queue.Queue[str | None] | None = None  # what serve prints after its URL

    @property
    def url(self) -> str:
        """The URL with the token that serve printed."""
        for line in self.lines:
            if match := re.search(r"(http://\S+/\?token=\S+)", line):
                return match.group(1)
        raise AssertionError(f"no URL with a token in {self.lines}")

    @property
    def token(self) -> str:
        return self.url.split("?token=", 1)[1]

    @property
    def base(self) -> str:
        return self.url.split("/?token=", 1)[0]

    @property
    def host(self) -> str:
        return self.base.removeprefix("http://")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        while self.pending is not None:
            try:
                line = self.pending.get(timeout=5)
            except queue.Empty:
                break
            if line is None:
                self.pending = None
                break
            self.lines.append(line)
        return self.proc.returncode


def start_server(tmp_path: Path, mode: str, where: str, app_source: str = COUNTER_APP, cli_args: tuple[str, ...] = ()) -> Served:
    app = tmp_path / "served_app.py"
    app.write_text(app_source, encoding="utf-8")
    command = shlex.join([sys.executable, str(app)])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, command, mode, where, *cli_args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path,
    )
    served = Served(proc)
    lines: queue.Queue[str | None] = queue.Queue()
    served.pending = lines
    threading.Thread(target=_read_lines, args=(proc, lines), daemon=True).start()
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            continue
        if line is None:
            break
        served.lines.append(line)
        if line.startswith("Press Ctrl+C"):
            return served
    served.stop()
    raise AssertionError("serve did not print its URL in time:\n" + "\n".join(served.lines))


def _read_lines(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put(line.rstrip("\n"))
    lines.put(None)


@pytest.fixture
def tcp_server(tmp_path: Path) -> Iterator[Served]:
    served = start_server(tmp_path, "tcp", "127.0.0.1:0")
    yield served
    assert served.stop() == 0, "\n".join(served.lines)


def cookie_header(gate_cookie: tuple[str, str]) -> dict[str, str]:
    name, value = gate_cookie
    return {"Cookie": f"{name}={value}"}


async def get(url: str, headers: dict[str, str] | None = None, connector: aiohttp.BaseConnector | None = None,
              ) -> tuple[int, str, aiohttp.ClientResponse]:
    async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar()) as session, \
            session.get(url, headers=headers or {}, allow_redirects=False) as response:
        return response.status, await response.text(), response


async def first_cookie(served: Served) -> tuple[str, str]:
    status, _, response = await get(served.url)
    assert status == 200
    (morsel,) = response.cookies.values()
    return morsel.key, morsel.value


async def read_counter(ws: aiohttp.ClientWebSocketResponse, timeout: float = 15.0) -> int:
    """The counter's value, from the terminal output the app streams over the websocket."""
    seen = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = await ws.receive(timeout=deadline - time.monotonic())
        if message.type == aiohttp.WSMsgType.BINARY:
            seen += message.data
            counts = re.findall(rb"count (\d+)", seen)
            if counts:
                return int(counts[-1])
        elif message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
            break
    raise AssertionError(f"no counter in the app's output: {seen[-400:]!r}")


# --- the gate's rules, without a server ----------------------------------------------------------


def test_host_rules() -> None:
    loopback = HostRule.for_tcp("127.0.0.1", 8765)
    assert loopback.allows("127.0.0.1:8765")
    assert loopback.allows("localhost:8765")
    assert loopback.allows("[::1]:8765")
    assert not loopback.allows("127.0.0.1:8766")
    assert not loopback.allows("evil.example:8765")  # DNS rebinding
    assert not loopback.allows(None)
    assert not loopback.allows("127.0.0.1:8765:1")

    named = HostRule.for_tcp("10.1.2.3", 80)
    assert named.allows("10.1.2.3") and named.allows("10.1.2.3:80")
    assert not named.allows("localhost")

    unix = HostRule.for_unix_socket()  # any forwarded port, loopback names only
    assert unix.allows("localhost:8765") and unix.allows("127.0.0.1:9999") and unix.allows("[::1]:1")
    assert not unix.allows("evil.example:8765")

    wildcard = HostRule.for_tcp("0.0.0.0", 8000)
    assert wildcard.allows("192.168.1.5:8000") and wildcard.allows("localhost:8000")
    assert not wildcard.allows("evil.example:8000")

    assert split_host("[::1]:80") == ("::1", 80)
    assert split_host("Example.COM") == ("example.com", 80)
    assert split_host("::1") is None


def test_gate_refusals() -> None:
    gate = Gate.new(HostRule.for_tcp("127.0.0.1", 8765))
    ok = {"host": "127.0.0.1:8765", "origin": None, "query_token": None, "cookie_token": gate.token}
    assert gate.refusal(**ok) is None
    assert gate.refusal(**{**ok, "cookie_token": None, "query_token": gate.token}) is None
    assert gate.refusal(**{**ok, "origin": "http://127.0.0.1:8765"}) is None
    assert "token" in gate.refusal(**{**ok, "cookie_token": None})
    assert "token" in gate.refusal(**{**ok, "cookie_token": gate.token[:-1] + "x"})
    assert "host name" in gate.refusal(**{**ok, "host": "evil.example:8765"})
    for origin in ("http://evil.example", "http://127.0.0.1:8766", "https://127.0.0.1:8765", "null",
                   "http://localhost:8765"):  # Origin must be this very page's: same name as the Host
        assert "refused" in gate.refusal(**{**ok, "origin": origin}), origin
    assert len(gate.token) >= 32 and Gate.new(gate.hosts).token != gate.token


def test_serve_arguments() -> None:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args([])
    assert (args.name, args.host, args.port) == (None, None, None)
    args = parser.parse_args(["tiny_gpt", "--host", "0.0.0.0", "--port", "9000"])
    assert (args.name, args.host, args.port) == ("tiny_gpt", "0.0.0.0", 9000)
    with pytest.raises(SystemExit):
        parser.parse_args(["--port", "70000"])


# --- a real server over TCP ----------------------------------------------------------------------


async def test_http_needs_the_token(tcp_server: Served) -> None:
    status, text, _ = await get(tcp_server.base + "/")
    assert status == 403 and "token" in text
    status, _, _ = await get(tcp_server.base + "/?token=wrong")
    assert status == 403
    status, _, _ = await get(tcp_server.base + "/static/js/textual.js")
    assert status == 403

    status, page, response = await get(tcp_server.url)
    assert status == 200
    assert f'data-session-websocket-url="ws://{tcp_server.host}/ws"' in page
    (morsel,) = response.cookies.values()
    assert morsel.value == tcp_server.token
    assert morsel["httponly"] and morsel["samesite"] == "Strict" and morsel["path"] == "/"
    assert response.headers["Referrer-Policy"] == "no-referrer"

    cookie = cookie_header((morsel.key, morsel.value))
    status, _, _ = await get(tcp_server.base + "/", headers=cookie)
    assert status == 200
    status, script, _ = await get(tcp_server.base + "/static/js/textual.js", headers=cookie)
    assert status == 200 and "WebSocket" in script


async def test_wrong_host_is_refused(tcp_server: Served) -> None:
    port = tcp_server.host.rsplit(":", 1)[1]
    status, text, _ = await get(tcp_server.url, headers={"Host": f"rebound.example:{port}"})
    assert status == 403 and "host name" in text
    status, _, _ = await get(tcp_server.url, headers={"Host": "127.0.0.1:1"})
    assert status == 403
    status, _, _ = await get(tcp_server.url, headers={"Host": f"localhost:{port}"})  # a loopback bind's names
    assert status == 200


async def test_websocket_needs_the_token_and_its_own_origin(tcp_server: Served) -> None:
    cookie = cookie_header(await first_cookie(tcp_server))
    ws_url = f"ws://{tcp_server.host}/ws?width=80&height=24"
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(ws_url, origin=tcp_server.base)
        assert refused.value.status == 403

        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(ws_url, headers=cookie, origin="http://evil.example")
        assert refused.value.status == 403

        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(ws_url, headers={**cookie, "Host": f"evil.example:{tcp_server.host.rsplit(':', 1)[1]}"},
                                     origin="http://evil.example")
        assert refused.value.status == 403

        async with session.ws_connect(ws_url, headers=cookie, origin=tcp_server.base) as ws:
            first = await read_counter(ws)
            later = first
            deadline = time.monotonic() + 10
            while later <= first and time.monotonic() < deadline:
                later = await read_counter(ws)
            assert later > first


# --- the default: a Unix socket ------------------------------------------------------------------


async def test_unix_socket_is_private_and_answers(tmp_path: Path) -> None:
    """`vram-bench serve tiny_gpt`: the default, a Unix socket named after the session in a private folder."""
    folder = tmp_path / "private"
    path = folder / "tiny_gpt.sock"
    served = start_server(tmp_path, "cli", str(folder), cli_args=("tiny_gpt",))
    try:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert stat.S_ISSOCK(path.stat().st_mode) and stat.S_IMODE(path.stat().st_mode) == 0o600
        text = "\n".join(served.lines)
        assert f"ssh -N -L 8765:{path} " in text
        assert "http://localhost:8765/?token=" in text

        status, _, _ = await get("http://localhost/", connector=aiohttp.UnixConnector(path=str(path)))
        assert status == 403
        status, page, response = await get(f"http://localhost:8765/?token={served.token}",
                                           connector=aiohttp.UnixConnector(path=str(path)))
        assert status == 200 and 'data-session-websocket-url="ws://localhost:8765/ws"' in page
        assert response.cookies
        status, _, _ = await get(f"http://rebound.example:8765/?token={served.token}",
                                 connector=aiohttp.UnixConnector(path=str(path)))
        assert status == 403
    finally:
        assert served.stop() == 0, "\n".join(served.lines)
    assert not path.exists(), "serve leaves no socket behind after Ctrl+C"
    assert "stopped" in served.lines


async def test_ctrl_c_ends_the_browser_sessions(tcp_server: Served) -> None:
    psutil = pytest.importorskip("psutil")
    cookie = cookie_header(await first_cookie(tcp_server))
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session, \
            session.ws_connect(f"ws://{tcp_server.host}/ws", headers=cookie, origin=tcp_server.base) as ws:
        await read_counter(ws)
        apps = psutil.Process(tcp_server.proc.pid).children(recursive=True)
        assert apps, "the browser's app runs as a child of serve"
        started = time.monotonic()
        assert tcp_server.stop() == 0, "\n".join(tcp_server.lines)
        assert time.monotonic() - started < 10
        message = await ws.receive(timeout=5)
        assert message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    _, alive = psutil.wait_procs(apps, timeout=5)
    assert not alive, f"apps left running after serve stopped: {alive}"


async def test_through_ssh_port_forwarding(tmp_path: Path, sshd: Sshd) -> None:  # noqa: F811 (the fixture)
    """The printed `ssh -N -L PORT:/path/serve.sock user@host`, with a throwaway sshd on this machine."""
    sshd.check_login({**os.environ})
    path = tmp_path / "private" / "serve.sock"
    served = start_server(tmp_path, "unix", str(path))
    port = _free_port()
    tunnel = open_tunnel(sshd, port, path)
    try:
        base = f"http://localhost:{port}"
        status, _, _ = await get(base + "/")
        assert status == 403
        status, page, response = await get(f"{base}/?token={served.token}")
        assert status == 200 and f'data-session-websocket-url="ws://localhost:{port}/ws"' in page
        (morsel,) = response.cookies.values()
        cookie = cookie_header((morsel.key, morsel.value))
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session, \
                session.ws_connect(f"ws://localhost:{port}/ws", origin=base, headers=cookie) as ws:
            assert await read_counter(ws) >= 0
    finally:
        tunnel.terminate()
        tunnel.wait(10)
        assert served.stop() == 0, "\n".join(served.lines)


def open_tunnel(server: Sshd, port: int, path: Path) -> subprocess.Popen[bytes]:
    """`ssh -N -L port:path`, once the local port accepts connections."""
    argv = server.ssh_argv()
    argv[1:1] = ["-N", "-L", f"{port}:{path}", "-o", "ExitOnForwardFailure=yes"]
    tunnel = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return tunnel
        except OSError:
            if tunnel.poll() is not None:
                raise AssertionError(f"ssh -L failed: {tunnel.stderr.read().decode(errors='replace')}") from None
            if time.monotonic() > deadline:
                tunnel.kill()
                raise AssertionError("the ssh tunnel did not open in 20 s") from None
            time.sleep(0.1)


STUBBORN_APP = """\
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
sys.stdout.write("__GANGLION__\\n")
sys.stdout.flush()
while True:
    time.sleep(1)  # never reads the quit request on stdin
"""


async def test_an_app_that_ignores_quit_is_killed_at_shutdown(tmp_path: Path) -> None:
    psutil = pytest.importorskip("psutil")
    served = start_server(tmp_path, "tcp", "127.0.0.1:0", app_source=STUBBORN_APP)
    cookie = cookie_header(await first_cookie(served))
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session, \
            session.ws_connect(f"ws://{served.host}/ws", headers=cookie, origin=served.base):
        deadline = time.monotonic() + 10
        while not (apps := psutil.Process(served.proc.pid).children(recursive=True)):
            assert time.monotonic() < deadline, "the app did not start"
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # let the shell start python, if it does not exec it
        apps = psutil.Process(served.proc.pid).children(recursive=True)
        started = time.monotonic()
        assert served.stop() == 0, "\n".join(served.lines)
        assert time.monotonic() - started < 15
    _, alive = psutil.wait_procs(apps, timeout=5)
    assert not alive, f"apps left running after serve stopped: {alive}"


LAST_WORDS_APP = """\
import subprocess, sys
sys.stdout.write("__GANGLION__\\n")
sys.stdout.flush()
# stdout ends when this process exits; stderr a moment later, after a last line from a child that holds only stderr
subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(0.3); sys.stderr.write('vram-bench: last words\\\\n')"],
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
"""


async def test_what_an_app_says_as_it_exits_reaches_serves_output(tmp_path: Path) -> None:
    """`vram-bench: detached; session NAME trains on` (or why attach failed) is the app's last stderr line.
    textual-serve stops reading stderr when stdout ends, which at an app's exit races with its last
    write; serve reads the rest of the pipe itself. Here stdout ends first, so textual-serve always misses it."""
    served = start_server(tmp_path, "tcp", "127.0.0.1:0", app_source=LAST_WORDS_APP)
    cookie = cookie_header(await first_cookie(served))
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session, \
            session.ws_connect(f"ws://{served.host}/ws", headers=cookie, origin=served.base):
        await asyncio.sleep(1.0)  # the app has said its last words and exited
    await asyncio.sleep(0.5)
    assert served.stop() == 0, "\n".join(served.lines)
    assert "vram-bench: last words" in served.lines, served.lines[-3:]


def test_unix_socket_refuses_an_open_folder_and_replaces_a_dead_socket(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with pytest.raises(UserError, match="open to other users"):
        listen_unix(shared / "serve.sock")

    private = tmp_path / "private"
    dead = listen_unix(private / "serve.sock")
    dead.close()  # a killed server leaves its socket file behind
    with listen_unix(private / "serve.sock") as sock:
        assert sock.getsockname() == str(private / "serve.sock")
        with pytest.raises(UserError, match="already listening"):
            listen_unix(private / "serve.sock")

    (private / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="not a socket"):
        listen_unix(private / "notes.txt")


# --- a real browser ------------------------------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

# textual.js draws the terminal on a canvas (xterm.js's WebGL or canvas renderer), so there is no text
# in the DOM to read, and it keeps its xterm Terminal to itself. The test serves the page a copy of
# textual.js that also pushes each Terminal it builds onto `window.__terminals`, and reads that
# terminal's buffer (what is on the screen) through xterm's public API.
READ_SCREEN = """() => {
    const terms = window.__terminals || [];
    if (!terms.length) return null;
    const buffer = terms[0].buffer.active;
    const lines = [];
    for (let i = 0; i < terms[0].rows; i++) {
        const line = buffer.getLine(buffer.viewportY + i);
        lines.push(line ? line.translateToString(true) : "");
    }
    return lines.join("\\n");
}"""


@pytest.mark.timeout(120)
def test_the_page_shows_the_app_in_a_browser(tmp_path: Path) -> None:
    playwright_api = pytest.importorskip("playwright.sync_api", reason="Playwright not installed (pip install playwright)")
    if not os.access(CHROMIUM, os.X_OK) and shutil.which("chromium") is None:
        pytest.skip("Chromium not installed (apt-get install chromium)")
    executable = CHROMIUM if os.access(CHROMIUM, os.X_OK) else shutil.which("chromium")

    served = start_server(tmp_path, "tcp", "127.0.0.1:0")
    try:
        with playwright_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1000, "height": 700})
                page.route("**/static/js/textual.js", _expose_terminals)
                page.goto(served.url)

                def counter() -> int | None:
                    screen = page.evaluate(READ_SCREEN)
                    found = re.findall(r"count (\d+)", screen or "")
                    return int(found[-1]) if found else None

                first = _wait_for(counter, 30, "the counter on the page's terminal", page)
                later = _wait_for(lambda: (n if (n := counter()) is not None and n > first else None), 10,
                                  f"the counter to move past {first}", page)
                assert later > first
                assert page.context.cookies()[0]["httpOnly"]

                stranger = browser.new_page()  # another context: no cookie
                assert stranger.goto(served.base + "/").status == 403
            finally:
                browser.close()
    finally:
        assert served.stop() == 0, "\n".join(served.lines)


def _expose_terminals(route) -> None:  # type: ignore[no-untyped-def]
    """Serve textual.js with each xterm Terminal it builds added to `window.__terminals`."""
    response = route.fetch()
    script = response.text()
    hook = re.search(r"this\.terminal=new (\w+)\.Terminal\(", script)
    if hook is None:
        pytest.fail("textual.js no longer builds its terminal as `this.terminal=new X.Terminal(`: update the hook")
    start = script.index("this.fitAddon=", hook.end())
    script = script[:start] + "(window.__terminals=window.__terminals||[]).push(this.terminal)," + script[start:]
    route.fulfill(response=response, body=script)


def _wait_for(probe, timeout: float, what: str, page) -> int:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value is not None:
            return value
        time.sleep(0.2)
    screen = page.evaluate(READ_SCREEN)
    raise AssertionError(f"waiting for {what}: not there after {timeout:.0f} s; the terminal shows:\n{screen}")


def test_serve_names_a_running_session(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from workbench.frontends.tui.serve import live_session_name, serve_main

    sessions = tmp_path / "sessions"
    sessions.mkdir(mode=0o700)
    assert serve_main([], sessions=sessions) == 2
    assert "no session is running" in capsys.readouterr().err

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as session:  # a live session: its socket answers
        session.bind(str(sessions / "tiny_gpt.sock"))
        session.listen(16)  # never accepts: each probe waits in the backlog
        assert live_session_name(None, sessions) == "tiny_gpt"
        assert live_session_name("tiny_gpt", sessions) == "tiny_gpt"
        assert serve_main(["other"], sessions=sessions) == 2
        assert "no session named other is running (running: tiny_gpt)" in capsys.readouterr().err
    assert not (sessions / "serve").exists()  # nothing served, nothing made
