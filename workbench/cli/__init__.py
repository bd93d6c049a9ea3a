"""The `vram-bench` command line.

Checks everything it can before any UI opens (the path, the contract, the
device), so a mistake is one clear line and exit code 2, not a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
import traceback
from pathlib import Path

import workbench
from workbench.engine.early_output import EarlyOutput
from workbench.errors import UserError
from workbench.cli.samples import DEFAULT_SAMPLE, SAMPLES
from workbench.cli.steady_blas import hold_blas_threads_steady

EXAMPLES = """\
examples:
  vram-bench                                  open the default sample project (a tiny GPT on Shakespeare)
  vram-bench --sample leaky_loop              another sample: batchnorm_cnn, lora_finetune, leaky_loop, memory_lab
  vram-bench run path/to/train.py             your project; its folder is watched for saves
  vram-bench run train.py --device cuda:1     pick a GPU (default: auto)
  vram-bench run train.py --headless          JSON-lines events on stdout, commands on stdin
  vram-bench run train.py --headless --max-steps 100 < /dev/null
  vram-bench run train.py -- --batch-size 8   the script's own arguments go after --: it sees sys.argv == [train.py, --batch-size, 8]
  vram-bench run train.py --resume latest     continue from the newest snapshot of any run (.vram-bench/runs/)
  vram-bench run train.py --detach            start the session in the background (it outlives the terminal)
  vram-bench ls                               the sessions running on this machine
  vram-bench attach [NAME] [--json]           the app again (or JSON lines) on a running session
  vram-bench stop [NAME]                      final snapshot, then the session ends
  vram-bench serve [NAME]                     the app in a browser (private socket + ssh -L; --host/--port: TCP + token)
  vram-bench runs [PROJECT]                   list a project's runs: start, steps, versions, last loss, snapshots
  vram-bench load-bench --size 124M           compare memory-efficient ways to load GPT-2-sized weights

In the app: space pause/resume, r reload, e evaluate, c cleanup, s snapshot, p profile, ? help,
d detach (training goes on), q leave (detach, or stop with or without a final snapshot).
A project defines setup(bench) and step(state, bench); see README.md, "The user contract".
"""


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--headless", action="store_true", help="no TUI: JSON-lines events on stdout, commands on stdin")
    parser.add_argument("--max-steps", type=positive_int, metavar="N",
                        help="stop after N steps (headless: a final snapshot, then exit 0)")
    parser.add_argument("--device", default="auto", metavar="auto|cpu|cuda[:N]", help="where bench.device points (default: auto)")
    parser.add_argument("--eval-every", type=positive_int, metavar="N", help="run evaluate(state, bench) every N steps")
    parser.add_argument("--snapshot-every", type=positive_int, metavar="N",
                        help="take a snapshot after every N steps (the last --keep-snapshots are kept)")
    parser.add_argument("--history", type=positive_int, metavar="N", default=50, help="code versions kept for rollback (default 50)")
    parser.add_argument("--record-memory", action="store_true", help="record CUDA allocation history for memory snapshots (m)")
    parser.add_argument("--sample-hz", type=float, default=10.0, metavar="HZ", help="memory sampling rate (default 10)")
    parser.add_argument("--memory-window", type=float, default=300.0, metavar="SECONDS", help="memory history shown (default 300)")
    parser.add_argument("--resume", metavar="latest|auto|PATH", help="load a snapshot into what setup() builds (weights, "
                        "optimizer, step, RNG); auto: the latest if there is one, else start fresh (batch jobs that requeue)")
    parser.add_argument("--resume-partial", action="store_true", help="with --resume: load the tensors that match, skip the rest")
    parser.add_argument("--keep-snapshots", type=positive_int, default=5, metavar="K", help="snapshots kept per project (default 5)")
    parser.add_argument("--tensorboard", action="store_true", default=None,
                        help="write TensorBoard event files into the run folder (needs: pip install 'vram-bench[tensorboard]'); "
                        "`tensorboard = true` in the settings file does the same")
    parser.add_argument("--time-limit", type=duration, metavar="DURATION",
                        help="the job's wall-clock limit (3h50m, 90m, 20s): the final snapshot is written before it, then "
                        "vram-bench exits 0 (default: the Slurm job's own end time, when it runs under Slurm)")
    parser.add_argument("--requeue", action="store_true",
                        help="after the requeue signal's (or the time limit's) final snapshot, requeue the Slurm job "
                        "(scontrol requeue), so its next start resumes with --resume latest")
    parser.add_argument("--requeue-signal", default="USR1", type=signal_name, metavar="SIGNAL",
                        help="the signal that means: snapshot now, requeue if --requeue, exit 0 (default USR1, as "
                        "#SBATCH --signal=USR1@90 sends it)")
    parser.add_argument("--on-memory-limit", choices=("snapshot", "pause", "warn"), default="snapshot",
                        help="when memory's trend reaches its ceiling (a cgroup's limit, the machine's RAM, a GPU's) within "
                        "a snapshot's time: snapshot and pause (default), pause, or only warn")
    parser.add_argument("--paused", action="store_true", help="run setup, then wait paused for the first command")
    saves = parser.add_mutually_exclusive_group()  # how saves are found, or not at all
    saves.add_argument("--no-watch", action="store_true", help="do not watch the folder for saves (reload with r)")
    saves.add_argument("--poll-saves", type=poll_seconds, default=None, metavar="SECONDS",
                        help="find saves by looking at the files the session runs every SECONDS, not by file events; "
                        "the default where the project is on a network filesystem (NFS, Lustre, sshfs...), whose saves "
                        "from other machines give no file event (1 s there); 0: file events even there")
    parser.add_argument("--training-nice", type=nice_increment, default=0, metavar="N",
                        help="lower the training thread's CPU priority by N (0-19): keys reach the screen sooner "
                        "when training saturates the CPU, at some cost in steps/s (default 0)")
    parser.add_argument("--no-gc-freeze", action="store_true",
                        help="do not gc.freeze() what setup() leaves alive (full collections then walk it all)")
    parser.add_argument("--no-mouse", action="store_true", help="TUI: keyboard only, no mouse capture")
    parser.add_argument("--theme", metavar="NAME", help="TUI theme for this run: vram-dark, vram-light, vram-high-contrast, "
                        "vram-ansi, or a theme file's name (default: the one last picked in the palette)")
    parser.add_argument("--detach", action="store_true",
                        help="start the session in the background and return (attach later: vram-bench attach NAME)")
    parser.add_argument("--nproc-per-node", type=positive_int, metavar="N",
                        help="train on N processes through torch.distributed.run (torchrun): one per GPU, or gloo on CPU; "
                        "every rank applies each saved change at the same step")
    parser.add_argument("--nnodes", metavar="N[:M]", help="with --nproc-per-node: torchrun's --nnodes (several machines)")
    parser.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="with --nnodes: torchrun's rendezvous endpoint")
    parser.add_argument("--max-restarts", type=int, default=0, metavar="N",
                        help="with --nproc-per-node: torchrun restarts every rank up to N times after a failure "
                        "(add --resume auto to continue from the last snapshot)")
    parser.add_argument("--collective-timeout", type=float, default=300.0, metavar="SECONDS",
                        help="under torchrun: how long a rank waits in a training collective for a rank that failed before "
                        "its step errors and every rank pauses (default 300)")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks for errors")
    parser.add_argument("--session-name", help=argparse.SUPPRESS)  # set by `run` for the session process it starts


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def poll_seconds(text: str) -> float:
    """--poll-saves: how often to look at the files, 0 for file events; a typo is the user's, said at once."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected seconds (e.g. 1 or 0.5), or 0 for file events, not {text!r}") from None
    if not (value == 0 or 0.05 <= value <= 60):
        raise argparse.ArgumentTypeError(f"between 0.05 and 60 seconds, or 0 for file events, not {text}")
    return value


def nice_increment(text: str) -> int:
    """An argparse type for --training-nice: how much lower the training thread's priority is."""
    value = _whole_number(text)
    if not 0 <= value <= 19:
        raise argparse.ArgumentTypeError("must be between 0 (off) and 19")
    return value


def duration(text: str) -> float:
    """An argparse type for --time-limit: 3h50m, 90m, 20s, 1d2h, or Slurm's HH:MM:SS."""
    from workbench.engine.time_limit import parse_duration

    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return seconds


def signal_name(text: str) -> str:
    """An argparse type for --requeue-signal: USR1, SIGUSR2, ... (a signal that may be caught)."""
    import signal

    name = text.upper().removeprefix("SIG")
    if name in ("KILL", "STOP") or not hasattr(signal, f"SIG{name}"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a signal that can be caught (try USR1 or USR2)")
    return name


def positive_int(text: str) -> int:
    """An argparse type for counts (steps, snapshots kept, versions)."""
    value = _whole_number(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def build_parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    top = argparse.ArgumentParser(
        prog="vram-bench",
        description="A terminal workbench for PyTorch training: load the model once, hot-swap the training code on save.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="vram-bench [options]  |  vram-bench run PATH [options]  |  vram-bench ls | attach | stop | serve [NAME]",
    )
    top.add_argument("--version", action="version", version=f"vram-bench {workbench.__version__}")
    top.add_argument("--sample", choices=sorted(SAMPLES), metavar="NAME", default=DEFAULT_SAMPLE,
                     help="which sample project to open: " + "; ".join(f"{k}: {v}" for k, v in SAMPLES.items()))
    _add_run_options(top)
    run = argparse.ArgumentParser(
        prog="vram-bench run",
        description="Run a project: PATH is its entry file (or a folder with a train.py).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="vram-bench run PATH [options] [-- PROJECT ARGS]",
    )
    run.add_argument("path", help="the project's entry file, e.g. train.py")
    _add_run_options(run)
    return top, run


def split_script_args(args: list[str]) -> tuple[list[str], list[str]]:
    """vram-bench's own arguments, and the project's: everything after the first `--`."""
    if "--" not in args:
        return args, []
    cut = args.index("--")
    return args[:cut], args[cut + 1 :]


SESSION_COMMANDS = {  # the subcommands that speak to running sessions: module, function
    "ls": ("workbench.cli.sessions", "ls_main"),
    "attach": ("workbench.cli.sessions", "attach_main"),
    "stop": ("workbench.cli.sessions", "stop_main"),
    "serve": ("workbench.frontends.tui.serve", "serve_main"),
}


def main(argv: list[str] | None = None) -> int:
    hold_blas_threads_steady()  # before anything imports torch
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == "load-bench":
        from workbench.tools.loadbench import main as load_bench

        return load_bench(args_list[1:])
    if args_list and args_list[0] == "runs":
        from workbench.cli.runs import main as list_runs

        return list_runs(args_list[1:])
    if args_list and args_list[0] in SESSION_COMMANDS:
        import importlib

        module, function = SESSION_COMMANDS[args_list[0]]
        return getattr(importlib.import_module(module), function)(args_list[1:])
    top, run = build_parsers()
    if args_list and args_list[0] == "run":
        ours, script_args = split_script_args(args_list[1:])
        args, unknown = run.parse_known_args(ours)
        if unknown:
            run.error(
                f"unrecognized arguments: {' '.join(unknown)}. Arguments for the project itself go after --: "
                f"vram-bench run {args.path} -- {' '.join(unknown)}"
            )
        args.script_args = script_args
    else:
        args = top.parse_args(args_list)
        args.path, args.script_args = None, []
    args.argv = args_list
    try:
        return _run(args)
    except UserError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"vram-bench: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _run(args: argparse.Namespace) -> int:
    # Imports that pull in torch wait until the arguments are known good (--help stays instant).
    from workbench.engine.project import resolve_entry
    from workbench.cli.samples import sample_entry
    from workbench.engine.session import Session, resolve_device

    if args.path is None:
        try:
            entry, note = sample_entry(args.sample)
        except FileNotFoundError as exc:
            raise UserError(str(exc), hint="Reinstall vram-bench, or run your own project: vram-bench run train.py.") from None
        if note:
            print(f"vram-bench: {note}", file=sys.stderr)
    else:
        entry = Path(args.path)
    from workbench.engine.distributed import rank_device, rank_info_from_env

    ranks = rank_info_from_env()
    if args.nproc_per_node is not None and ranks is None and (args.headless or args.session_name):
        # Headless in the foreground, or the detached session process: this process becomes torchrun's launcher.
        # (A plain `run` starts the detached one first, then attaches the app to rank 0's socket.)
        from workbench.cli.launch import launch_ranks

        args.entry = entry
        return launch_ranks(args)  # this process becomes torchrun's launcher; each rank runs this command again
    device = rank_device(ranks, args.device) if ranks is not None else resolve_device(args.device)
    if args.headless or args.session_name or args.detach:
        tui_settings = None  # no app in this process (the session process never imports Textual)
    else:
        from workbench.frontends.tui.settings import tui_settings as load_tui_settings

        tui_settings = load_tui_settings(args.theme)
    entry = resolve_entry(entry)
    if args.resume and args.resume not in ("latest", "auto"):
        args.resume = str(Path(args.resume).expanduser().absolute())  # typed relative to here, before the chdir
    config = _session_config(args, device)
    if args.session_name:
        return _session_process(entry, args, config)
    if args.detach:
        return _start_detached(entry, args)
    if args.headless:
        from workbench.engine.fdcapture import ProtocolStdout
        from workbench.frontends.headless import run_headless

        with ProtocolStdout() as protocol, _process_groups(ranks, device, args.collective_timeout) as groups:
            with _default_group_at_import(groups):
                project, early, resume = _load_as_a_script(entry, args)
            role = groups.role() if groups is not None else None  # the control group, after the import
            session = Session(project, replace(config, resume=resume), stdout_passthrough=sys.stderr, early_output=early,
                              ranks=role)
            if session.is_main:
                code = run_headless(session, protocol.stream, sys.stdin)
            else:  # the other ranks: no front end; their events go to their own events-rankN.jsonl
                from workbench.cli.session_process import serve_nothing

                code = serve_nothing(session)
        if session.is_main:
            _report_setup_failure(session, args.debug)
            _report_final_snapshot(session)
        return code

    return _start_and_attach(entry, args, tui_settings)


def _default_group_at_import(groups):  # type: ignore[no-untyped-def]
    """Under torchrun, the default process group made before the project's import (a no-op context otherwise)."""
    from workbench.engine.import_time_group import default_group_at_import as made_first

    return made_first(groups)


def _process_groups(ranks, device, collective_timeout: float):  # type: ignore[no-untyped-def]
    """Under torchrun: the process groups for the session's lifetime (a no-op context otherwise)."""
    import contextlib
    from datetime import timedelta

    from workbench.engine.distributed import ProcessGroups

    if ranks is None:
        return contextlib.nullcontext(None)
    return ProcessGroups(ranks, device, collective_timeout=timedelta(seconds=collective_timeout)).running()


def _start_session_process(entry: Path, args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """Start the project's session process (refused if one runs already); its registry entry, or None where this node
    trains ranks only (several machines, rank 0 on another)."""
    from workbench.protocol import registry
    from workbench.cli.session_process import refuse_second_session, start_detached

    root = entry.parent.resolve()
    refuse_second_session(root, _say)
    return start_detached(args.argv, registry.choose_name(root), _say)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _start_and_attach(entry: Path, args: argparse.Namespace, tui_settings: dict) -> int:
    """`run` and the bare `vram-bench`: the session in a process of its own, then the app attached to it."""
    from workbench.cli.session_process import session_of
    from workbench.frontends.attach import attach_app

    running = session_of(entry.parent.resolve(), _say) if args.path is None else None
    if running is not None:  # a bare `vram-bench` again: the sample's session is already there, so open it
        _say(f"vram-bench: the sample's session {running.name} is already running: attaching to it")
        return attach_app(running, mouse=not args.no_mouse, settings=tui_settings)
    started = _start_session_process(entry, args)
    if started is None:  # several machines: this node trains ranks only, and the session is on rank 0's (said)
        return 0
    return attach_app(started, mouse=not args.no_mouse, settings=tui_settings)


def _start_detached(entry: Path, args: argparse.Namespace) -> int:
    """`run --detach`: start the session process, say how to reach it, return."""
    started = _start_session_process(entry, args)
    if started is None:  # several machines: this node trains ranks only, and the session is on rank 0's (said)
        return 0
    name = started.name
    pid = started.facts.pid if started.facts else "?"
    _say(f"vram-bench: session {name} runs in the background (pid {pid}); attach: vram-bench attach {name}; "
        f"end it: vram-bench stop {name}")
    return 0


def _session_process(entry: Path, args: argparse.Namespace, config) -> int:  # type: ignore[no-untyped-def]
    """In the detached session process: load the project, serve its socket until the session ends."""
    from workbench.cli.session_process import serve, serve_nothing
    from workbench.engine.distributed import rank_info_from_env
    from workbench.engine.session import Session

    ranks = rank_info_from_env()
    with _process_groups(ranks, config.device, args.collective_timeout) as groups:
        with _default_group_at_import(groups):
            project, early, resume = _load_as_a_script(entry, args)
        session = Session(project, replace(config, resume=resume, write_event_log=True, memory_event_interval=1.0),
                          stdout_passthrough=sys.stderr, early_output=early, ranks=groups.role() if groups else None)
        if session.is_main:  # rank 0 (or the only process) hosts the socket; the other ranks have no front end
            code = serve(session, args.session_name)
        else:
            code = serve_nothing(session, detached=True)
    if not session.is_main:
        return code
    _report_final_snapshot(session)
    if _report_setup_failure(session, args.debug):
        return 2
    return code


def _load_as_a_script(entry: Path, args: argparse.Namespace, early: EarlyOutput | None = None):  # type: ignore[no-untyped-def]
    """Import the project as `python train.py ARGS` would run it: in its folder, with its arguments.

    What it prints meanwhile is kept for the session's log; if the import fails, it is shown
    on stderr above the error, where the user would have seen it.
    """
    from workbench.engine.project import load_project

    early = early or EarlyOutput()
    os.chdir(entry.parent)  # the project's relative paths ("data/input.txt") mean what they mean to it
    sys.argv = [str(entry), *args.script_args]  # for the whole run: setup() and step() may read it too
    try:
        with early.capture():
            project = load_project(entry, args.script_args)
    except BaseException:
        early.replay_to_stderr()
        raise
    return project, early, _check_resume(args, project)


def _session_config(args: argparse.Namespace, device):  # type: ignore[no-untyped-def]
    from workbench.engine.session import SessionConfig

    return SessionConfig(
        device=device,
        max_steps=args.max_steps,
        exit_at_max_steps=args.headless,
        exit_on_setup_failure=args.headless,
        start_paused=args.paused,
        watch=not args.no_watch,
        poll_seconds=args.poll_saves,
        write_event_log=not args.headless,
        eval_every=args.eval_every,
        snapshot_every=args.snapshot_every,
        max_history=args.history,
        record_memory=args.record_memory,
        memory_interval=1.0 / max(args.sample_hz, 0.1),
        memory_window=args.memory_window,
        resume_partial=args.resume_partial,
        snapshot_keep=args.keep_snapshots,
        freeze_gc=not args.no_gc_freeze,
        training_nice=args.training_nice,
        tensorboard=args.tensorboard if args.tensorboard is not None else _tensorboard_setting(),
        time_limit=_time_limit(args),
        requeue=args.requeue,
        requeue_signal=args.requeue_signal,
        on_memory_limit=args.on_memory_limit,
    )


def _time_limit(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """--time-limit, counted from now; else the Slurm job's end, when it runs under Slurm."""
    from workbench.engine.time_limit import TimeLimit, slurm_time_limit

    if args.time_limit is not None:
        return TimeLimit.after(args.time_limit, f"--time-limit {args.time_limit:.0f} s")
    return slurm_time_limit()


def _tensorboard_setting() -> bool:
    from workbench.config import load_config

    return load_config().tensorboard


def _check_resume(args: argparse.Namespace, project) -> Path | None:  # type: ignore[no-untyped-def]
    """Find and check the snapshot before any UI starts: a missing or damaged one is a one-line error.

    `auto` (for batch jobs that requeue themselves): the latest snapshot if there is one, else a fresh start."""
    if not args.resume:
        if args.resume_partial:
            raise UserError("--resume-partial only makes sense with --resume latest|auto|PATH.")
        return None
    from workbench.engine.actions.snapshot import find_snapshot, load_snapshot
    from workbench.engine.runs import latest_snapshot
    from workbench.engine.state_folder import choose_state_folder

    state_dir = choose_state_folder(project.root)[0]
    if args.resume == "auto":
        path = latest_snapshot(state_dir)
        if path is None:
            print("vram-bench: --resume auto: no snapshot yet, so this run starts fresh", file=sys.stderr)
            return None
    else:
        path = find_snapshot(state_dir, args.resume)
    load_snapshot(path)  # every record's CRC checked, then mapped: a damaged file fails here
    return path


def _report_final_snapshot(session) -> None:  # type: ignore[no-untyped-def]
    """What the quit's final snapshot did, as it happened (a failure is an error, and the exit status is 1)."""
    final = session.worker.final_snapshot
    if final is not None:
        print(f"vram-bench: {'' if final.ok else 'error: '}{final.sentence()}", file=sys.stderr)


def _report_setup_failure(session, debug: bool) -> bool:  # type: ignore[no-untyped-def]
    """After the session: one line on stderr if setup() failed (and its traceback with --debug)."""
    worker = session.worker
    if not worker.setup_error:
        return False
    if debug and worker.setup_traceback:
        print(worker.setup_traceback, file=sys.stderr, end="")
    where = worker.setup_error_location or session.project.relative(session.project.entry)
    print(f"vram-bench: error: {where}: {worker.setup_error}. Fix it and run again (--debug shows the traceback).", file=sys.stderr)
    return True
