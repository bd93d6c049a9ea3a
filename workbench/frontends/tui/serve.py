"""`vram-bench serve [NAME]`: the workbench in a browser, through textual-serve.

textual-serve (checked against 1.1.3) runs a command per browser connection and relays
its terminal over a websocket (aiohttp). A command channel into a training process is
code execution, and textual-serve checks no token and no Origin, so this module adds
the gate it lacks, as an aiohttp middleware in front of every route:

- a token (`secrets.token_urlsafe(24)`) in the printed URL, turned into an HttpOnly,
  SameSite=Strict cookie on first use, and required on every request and on the
  websocket upgrade (no token and no cookie: 403);
- the Host header must name this server (DNS rebinding: a page at evil.example whose
  name now points at 127.0.0.1 sends `Host: evil.example`), and a request carrying an
  Origin (every websocket a browser opens does) must come from that same host and port.

By default the server listens on a Unix socket in a private folder (0700, the socket
0600): only this user reaches it on this machine, and the user's own computer reaches
it through `ssh -L 8765:/path/to/serve.sock user@host`. The token is required there
too: the forwarded port on the user's computer is a TCP port any local user (or, by
DNS rebinding, any web page) can try. `--host/--port` serve over TCP instead.

Hooks into textual-serve: `Server._make_app()` (its routes: /, /ws, /download, /static)
with our middleware prepended; `handle_index` rewritten to build its URLs from the
request's (checked) Host rather than from a fixed public URL, so the page works through
any forwarded port; `handle_websocket` and `_process_messages` wrapped to know each
browser's websocket and app process, so that Ctrl+C closes them, gives each app 5 s to
quit and kills what is left (textual-serve leaves them to aiohttp's 60 s shutdown timeout,
and runs each app through `sh -c`); and, once an app has ended, its stderr read to the end
(textual-serve stops reading it when stdout ends, and so can drop an app's last line,
`vram-bench: detached; session NAME trains on` or why `attach` failed).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import hashlib
import hmac
import ipaddress
import os
import secrets
import shlex
import signal
import socket
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from workbench.errors import UserError

if TYPE_CHECKING:
    from aiohttp import web

DEFAULT_PORT = 8765  # the local port in the printed `ssh -L` line, and --port's default
TOKEN_PARAM = "token"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
SOCKET_PATH_MAX = 107  # sun_path is 108 bytes on Linux, one of them the terminating NUL
SESSION_CLOSE_TIMEOUT = 5.0  # how long a browser's app gets to quit at shutdown before it is killed


# --- the gate: pure pieces, no aiohttp ---------------------------------------------------------


def split_host(value: str | None, default_port: int = 80) -> tuple[str, int] | None:
    """`Host`-style `name[:port]` (IPv6 in brackets) as (lower-case name, port); None when malformed."""
    if not value:
        return None
    value = value.strip().lower()
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:]
    else:
        if value.count(":") > 1:
            return None  # a bare IPv6 address: a Host header must bracket it
        name, _, port_text = value.partition(":")
    if not name:
        return None
    if not port_text:
        return name, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    return name, int(port_text)


def _is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class HostRule:
    """Which `Host` headers name this server."""

    names: frozenset[str]  # lower-case names and IP literals, IPv6 without brackets
    port: int | None  # None: any port (a Unix socket, reached through a forwarded port we cannot know)
    any_ip_literal: bool = False  # a wildcard bind: any of the machine's addresses (rebinding needs a name)

    def allows(self, host_header: str | None) -> bool:
        parsed = split_host(host_header)
        if parsed is None:
            return False
        name, port = parsed
        if self.port is not None and port != self.port:
            return False
        return name in self.names or (self.any_ip_literal and _is_ip_literal(name))

    @classmethod
    def for_unix_socket(cls) -> HostRule:
        return cls(LOOPBACK_NAMES, None)

    @classmethod
    def for_tcp(cls, host: str, port: int) -> HostRule:
        host = host.strip("[]").lower()
        names = {host}
        wildcard = host in WILDCARD_HOSTS
        if wildcard or is_loopback(host):
            names |= LOOPBACK_NAMES
        if wildcard:
            names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        return cls(frozenset(names - {""}), port, any_ip_literal=wildcard)


@dataclass(frozen=True)
class Gate:
    """The token, its cookie and the Host rule; `refusal` says why a request is turned away."""

    token: str
    hosts: HostRule

    @classmethod
    def new(cls, hosts: HostRule) -> Gate:
        return cls(secrets.token_urlsafe(24), hosts)

    @property
    def cookie_name(self) -> str:
        # Cookies ignore ports: servers on other ports of localhost must not overwrite each other's.
        return "vram_bench_" + hashlib.sha256(self.token.encode()).hexdigest()[:12]

    def token_matches(self, candidate: str | None) -> bool:
        return candidate is not None and hmac.compare_digest(candidate.encode(), self.token.encode())

    def refusal(self, *, host: str | None, origin: str | None, query_token: str | None,
                cookie_token: str | None) -> str | None:
        """None to let the request through, else the reason for the 403."""
        if not self.hosts.allows(host):
            return f"this server does not answer to the host name {host!r}."
        if origin is not None and not _same_origin(origin, host):
            return f"requests from {origin!r} are refused (only this page's own origin may connect)."
        if not (self.token_matches(query_token) or self.token_matches(cookie_token)):
            return "this page needs its token: open the full URL that `vram-bench serve` printed."
        return None

    def url(self, base: str) -> str:
        return f"{base.rstrip('/')}/?{TOKEN_PARAM}={self.token}"


def _same_origin(origin: str, host: str | None) -> bool:
    """An Origin is `scheme://host[:port]`; it must be plain http on exactly the Host this request named."""
    parts = urlsplit(origin.strip().lower())
    if parts.scheme != "http" or parts.path not in ("", "/") or parts.query or parts.username:
        return False
    return split_host(parts.netloc) is not None and split_host(parts.netloc) == split_host(host)


# --- aiohttp: the middleware and textual-serve's server -----------------------------------------


def gate_middleware(gate: Gate) -> Callable[..., Any]:
    """An aiohttp middleware: 403 before any handler for a request the gate refuses."""
    from aiohttp import web

    @web.middleware
    async def middleware(request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        query_token = request.query.get(TOKEN_PARAM)
        refusal = gate.refusal(
            host=request.headers.get("Host"),
            origin=request.headers.get("Origin"),
            query_token=query_token,
            cookie_token=request.cookies.get(gate.cookie_name),
        )
        if refusal is not None:
            return web.Response(status=403, text=f"403 Forbidden: {refusal}\n", headers=_SAFETY_HEADERS)
        response = await handler(request)
        if not response.prepared:  # a websocket has sent its headers by the time it returns
            response.headers.update(_SAFETY_HEADERS)
            if gate.token_matches(query_token) and not gate.token_matches(request.cookies.get(gate.cookie_name)):
                response.set_cookie(gate.cookie_name, gate.token, httponly=True, samesite="Strict", path="/")
        return response

    return middleware


_SAFETY_HEADERS = {
    "Referrer-Policy": "no-referrer",  # the URL carries the token
    "Content-Security-Policy": "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
}


def _server_class() -> type:
    try:
        from textual_serve.server import Server
    except ImportError:
        raise UserError(
            "`vram-bench serve` needs the textual-serve package, which is not installed.",
            hint="Install it with: pip install 'vram-bench[serve]' (or pip install textual-serve).",
        ) from None
    import aiohttp_jinja2
    from aiohttp import WSCloseCode

    class GatedServer(Server):  # type: ignore[misc, valid-type]
        """textual-serve's Server behind the gate, with URLs taken from the request's Host."""

        def __init__(self, command: str, gate: Gate, title: str) -> None:
            super().__init__(command, title=title)
            self.gate = gate
            self.sessions: dict[Any, tuple[Any, Any]] = {}  # handler task -> (websocket, AppService) until its app ends

        async def make_app(self) -> web.Application:
            app = await self._make_app()
            app.middlewares.insert(0, gate_middleware(self.gate))
            return app

        async def on_startup(self, app: web.Application) -> None:
            pass  # textual-serve prints its logo and a URL without the token here; serve() prints ours

        async def on_shutdown(self, app: web.Application) -> None:
            """Close every browser's websocket, give its app a moment to quit, then kill what is left."""
            loop = asyncio.get_running_loop()
            deadline = loop.time() + SESSION_CLOSE_TIMEOUT
            closing = [asyncio.ensure_future(websocket.close(code=WSCloseCode.GOING_AWAY, message=b"vram-bench serve stopped"))
                       for websocket, _ in self.sessions.values()]
            while self.sessions and loop.time() < deadline:
                await asyncio.sleep(0.05)
            for _, service in list(self.sessions.values()):
                process = getattr(service, "_process", None)  # textual-serve 1.1.3: an asyncio Process
                if process is not None and process.returncode is None:
                    _kill_tree(process.pid)
            for task in closing:
                task.cancel()

        async def handle_websocket(self, request: web.Request) -> web.StreamResponse:
            try:
                return await super().handle_websocket(request)
            finally:  # after textual-serve's AppService.stop(): the app has quit (or was killed)
                task = asyncio.current_task()
                session = self.sessions.get(task)
                if session is not None:
                    await _relay_stderr_tail(session[1])
                self.sessions.pop(task, None)

        async def _process_messages(self, websocket: Any, app_service: Any) -> None:
            self.sessions[asyncio.current_task()] = (websocket, app_service)
            await super()._process_messages(websocket, app_service)

        async def handle_index(self, request: web.Request) -> web.StreamResponse:
            base = f"http://{request.host}"  # the gate has checked it names this server
            font_size = request.query.get("fontsize", "16")
            context = {
                "font_size": int(font_size) if font_size.isdigit() else 16,
                "app_websocket_url": f"ws://{request.host}{request.app.router['websocket'].url_for()}",
                "config": {"static": {"url": f"{base}/static/"}},
                "application": {"name": self.title},
            }
            response = aiohttp_jinja2.render_template("app_index.html", request, context)
            response.headers["Cache-Control"] = "no-store"
            return response

    return GatedServer


async def _relay_stderr_tail(service: Any) -> None:
    """Print what the app wrote to stderr that textual-serve did not read.

    textual-serve 1.1.3 stops reading an app's stderr the moment its stdout ends, which is when
    the process exits, so the last lines (`vram-bench: detached; session NAME trains on`, or why
    `attach` could not start: the session has ended) were lost whenever they sat unread in the pipe.
    """
    import sys

    process = getattr(service, "_process", None)  # an asyncio Process; its stderr reader is idle by now
    stderr = getattr(process, "stderr", None)
    if stderr is None:
        return
    try:
        rest = await asyncio.wait_for(stderr.read(), 1.0)
    except (asyncio.TimeoutError, OSError, RuntimeError, ValueError):
        return
    if rest:
        sys.stdout.write(rest.decode("utf-8", "replace"))
        sys.stdout.flush()


def _kill_tree(pid: int) -> None:
    """Kill a browser's app and what it started: textual-serve runs it through `sh -c`, which may not exec it."""
    import psutil

    try:
        parent = psutil.Process(pid)
        processes = [*parent.children(recursive=True), parent]
    except psutil.NoSuchProcess:
        return
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


# --- listening ------------------------------------------------------------------------------------


def _private_folder(folder: Path) -> None:
    """Make `folder` (0700) or check it is already private and ours: the socket's only fence on this machine."""
    if not folder.exists():
        try:
            folder.mkdir(parents=True, mode=0o700)
            folder.chmod(0o700)  # mkdir's mode passes through the umask
        except OSError as exc:
            raise UserError(f"cannot make the folder {folder} for the serve socket ({exc.strerror}).") from None
        return
    info = folder.stat()
    if not stat.S_ISDIR(info.st_mode):
        raise UserError(f"{folder} is not a folder, so the serve socket cannot go there.")
    if info.st_uid != os.getuid():
        raise UserError(f"the folder {folder} belongs to another user (uid {info.st_uid}), so the serve socket cannot go there.",
                        hint="Give a folder of your own.")
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise UserError(
            f"the folder {folder} is open to other users (mode {stat.S_IMODE(info.st_mode):04o}), "
            "and anyone who reaches the serve socket can run code in the training process.",
            hint=f"Run `chmod 700 {folder}` or give a private folder.",
        )


def _answers(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        probe.connect(os.fspath(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def listen_unix(path: Path) -> socket.socket:
    """A listening socket at `path`, 0600, in a private folder; a dead server's leftover socket is replaced."""
    path = Path(path).expanduser().absolute()
    if len(os.fsencode(path)) > SOCKET_PATH_MAX:
        raise UserError(f"the serve socket's path {path} is longer than a Unix socket allows ({SOCKET_PATH_MAX} bytes).",
                        hint="Give a shorter folder (or set XDG_RUNTIME_DIR to one).")
    _private_folder(path.parent)
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise UserError(f"{path} exists and is not a socket; vram-bench serve will not replace it.",
                            hint="Move it away, or serve under another name.")
        if _answers(path):
            raise UserError(f"another server is already listening on {path}.",
                            hint="Stop it first (Ctrl+C where it runs), or serve under another name.")
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(os.fspath(path))
        os.chmod(path, 0o600)  # no race: nobody else can enter the 0700 folder meanwhile
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {path} ({exc.strerror}).") from None
    return sock


def listen_tcp(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: any free port)."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UserError(f"cannot serve on --host {host}: {exc.strerror}.",
                        hint="Give an address of this machine, e.g. 127.0.0.1.") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if host.strip("[]") == "::" else 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        hint = "Choose another --port, or stop what uses it." if exc.errno in (98, 48) else ""
        raise UserError(f"cannot listen on {host}:{port} ({exc.strerror}).", hint=hint) from None
    return sock


def _url_host(host: str) -> str:
    host = host.strip("[]")
    return f"[{host}]" if ":" in host else host


# --- serve ---------------------------------------------------------------------------------------


def serve(command: str, *, unix_path: Path | None = None, host: str | None = None, port: int | None = None,
          title: str, out: Callable[[str], object] = print) -> None:
    """Serve `command` (a Textual app, run once per browser tab) until Ctrl+C or SIGTERM.

    With `host` or `port`: TCP on host:port (127.0.0.1 and 8765 by default; port 0 picks a free
    one). Otherwise a Unix socket at `unix_path`, whose folder is made 0700 or must already be.
    Prints where to connect, with the URL and its token, through `out` before it starts answering.
    """
    server_class = _server_class()
    if host is not None or port is not None:
        if unix_path is not None:
            raise UserError("serve listens either on a Unix socket or on --host/--port, not both.")
        host = host or "127.0.0.1"
        port = DEFAULT_PORT if port is None else port
        sock = listen_tcp(host, port)
        bound_port = sock.getsockname()[1]
        gate = Gate.new(HostRule.for_tcp(host, bound_port))
        url_host = socket.gethostname() if host.strip("[]") in WILDCARD_HOSTS else _url_host(host)
        lines = [f"Serving {command!r} on http://{_url_host(host)}:{bound_port}"]
        if not is_loopback(host):
            lines.append(
                f"warning: --host {host} serves to the network over plain HTTP (no encryption): whoever sees "
                "the URL below, or the traffic, can run code in the training process. The default Unix "
                "socket with `ssh -L` is the safer way to reach a remote machine."
            )
        lines += ["Open this URL (it holds the access token; keep it private):",
                  f"    {gate.url(f'http://{url_host}:{bound_port}')}"]
        cleanup_path: Path | None = None
    else:
        if unix_path is None:
            raise UserError("serve needs a Unix socket path, or --host/--port.")
        sock = listen_unix(Path(unix_path))
        cleanup_path = Path(sock.getsockname())
        gate = Gate.new(HostRule.for_unix_socket())
        who = f"{getpass.getuser()}@{socket.gethostname()}"
        lines = [
            f"Serving {command!r} on the Unix socket {cleanup_path} (only you can reach it on this machine).",
            "On your own computer, forward a local port to it:",
            f"    ssh -N -L {DEFAULT_PORT}:{shlex.quote(str(cleanup_path))} {who}",
            "then open this URL (it holds the access token; keep it private):",
            f"    {gate.url(f'http://localhost:{DEFAULT_PORT}')}",
        ]
    lines.append("Press Ctrl+C to stop.")
    try:
        for line in lines:
            out(line)
        asyncio.run(_serve_forever(server_class(command, gate, title), sock))
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
        if cleanup_path is not None:
            try:
                cleanup_path.unlink()
            except FileNotFoundError:
                pass


async def _serve_forever(server: Any, sock: socket.socket) -> None:
    from aiohttp import web

    runner = web.AppRunner(await server.make_app(), handle_signals=False, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    handled = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, stop.set)
            handled.append(signum)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or not Unix
            pass
    try:
        await web.SockSite(runner, sock).start()
        await stop.wait()
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)
        await runner.cleanup()


# --- the CLI's side ----------------------------------------------------------------------------


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", metavar="NAME", default=None,
                        help="the session to serve (`vram-bench ls` lists them); default: the only one running")
    parser.add_argument("--host", default=None,
                        help="serve over TCP on this address instead of a private Unix socket "
                             "(127.0.0.1 stays on this machine; anything else reaches the network)")
    parser.add_argument("--port", type=_port, default=None,
                        help=f"serve over TCP on this port (default {DEFAULT_PORT} once --host is given; 0: any free port)")


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value < 65536:
        raise argparse.ArgumentTypeError("a port is between 0 and 65535")
    return value


def serve_socket_path(name: str | None, folder: Path | None = None) -> Path:
    """Where the serve socket for session NAME goes: a `serve/` folder beside the session sockets.

    A folder of its own, so that listing `*.sock` among the sessions does not take it for one.
    """
    if folder is None:
        from workbench.protocol.registry import runtime_folder

        folder = runtime_folder() / "serve"
    return folder / f"{name or 'default'}.sock"


def run_serve(args: argparse.Namespace, command_for_name: Callable[[str | None], str], *,
              folder: Path | None = None, out: Callable[[str], object] = print) -> int:
    """`vram-bench serve`: `command_for_name(NAME)` is the shell command a browser tab runs
    (e.g. `vram-bench attach NAME`, shell-quoted). Raises UserError; returns the exit status."""
    command = command_for_name(args.name)
    title = f"vram-bench {args.name}" if args.name else "vram-bench"
    if args.host is not None or args.port is not None:
        serve(command, unix_path=None, host=args.host, port=args.port, title=title, out=out)
    else:
        serve(command, unix_path=serve_socket_path(args.name, folder), host=None, port=None, title=title, out=out)
    return 0


def attach_command(name: str | None) -> str:
    """The command a browser tab runs: `vram-bench attach [NAME]` with this very interpreter (no PATH lookup)."""
    import sys

    return shlex.join([sys.executable, "-m", "workbench", "attach", *([name] if name else [])])


def serve_main(argv: list[str], *, sessions: Path | None = None) -> int:
    """`vram-bench serve [NAME] [--host H] [--port P]`, for the CLI's table of subcommands.

    `sessions`: the sessions folder (default: the registry's runtime folder); the serve socket goes in its `serve/`.
    """
    import sys

    parser = argparse.ArgumentParser(
        prog="vram-bench serve",
        description="Open a running session's workbench in a web browser (textual-serve). By default it listens on "
                    "a private Unix socket and prints the `ssh -L` line that reaches it; every URL carries a token.",
    )
    add_serve_arguments(parser)
    args = parser.parse_args(argv)
    try:
        args.name = live_session_name(args.name, sessions)
        return run_serve(args, attach_command, folder=None if sessions is None else sessions / "serve")
    except UserError as exc:
        print(f"vram-bench: error: {exc}", file=sys.stderr)
        return 2


def live_session_name(name: str | None, sessions: Path | None = None) -> str:
    """NAME when such a session is running; without NAME, the one session running. A clear error otherwise."""
    from workbench.protocol import registry

    live = [entry.name for entry in registry.entries(sessions) if not registry.stale(entry)]
    if name is not None:
        if name not in live:
            running = f" (running: {', '.join(live)})" if live else ""
            raise UserError(f"no session named {name} is running{running}.", hint="`vram-bench ls` lists them.")
        return name
    if not live:
        raise UserError("no session is running, so there is nothing to serve.",
                        hint="Start one with `vram-bench run train.py --detach`, then run `vram-bench serve`.")
    if len(live) > 1:
        raise UserError(f"{len(live)} sessions are running ({', '.join(live)}): say which one to serve.",
                        hint=f"For example: vram-bench serve {live[0]}")
    return live[0]
