"""`vram-bench run train.py --nproc-per-node N`: this process becomes torchrun's launcher.

torch.distributed.run starts N processes per node, each running this same command (without the
launcher's options) as `python -m workbench run ...`; each finds its rank in its environment
(workbench/engine/distributed.py). Nothing here re-implements the launcher: restarts, rendezvous
across nodes and signal forwarding are torchrun's.
"""

from __future__ import annotations

import argparse
import os
import sys

LAUNCHER_OPTIONS = {"--nproc-per-node", "--nnodes", "--rdzv-endpoint", "--max-restarts"}
# With restarts, each attempt's ranks need a store of their own. By default torchrun's ranks share its rendezvous
# store across attempts, so a restarted rank can read a dead rank's address left by the attempt before and fail to
# connect its process groups (pytorch/pytorch#135712; seen with gloo on torch 2.13). Unshared, rank 0 of each
# attempt hosts a fresh store.
UNSHARED_STORE = ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")


def worker_argv(argv: list[str]) -> list[str]:
    """The command each rank runs: this one without the launcher's own options (`--opt V` or `--opt=V`)."""
    return _without(argv, LAUNCHER_OPTIONS)


def _without_sample(argv: list[str]) -> list[str]:
    """`--sample NAME` is the top-level command's: `run` has no such option (argparse would read it as --sample-hz)."""
    return _without(argv, {"--sample"})


def _without(argv: list[str], options: set[str]) -> list[str]:
    """`argv` less each of `options` with its value, up to a `--` (the project's own arguments stay as they are)."""
    kept: list[str] = []
    skip = False
    for i, word in enumerate(argv):
        if skip:
            skip = False
            continue
        if word == "--":
            kept.extend(argv[i:])
            break
        if word.split("=", 1)[0] in options:
            skip = "=" not in word
            continue
        kept.append(word)
    return kept


def torchrun_argv(args: argparse.Namespace) -> list[str]:
    """torch.distributed.run's arguments for this command."""
    launcher = ["--nproc-per-node", str(args.nproc_per_node), "--max-restarts", str(args.max_restarts)]
    if args.nnodes is not None:
        launcher += ["--nnodes", args.nnodes]
        if args.rdzv_endpoint is not None:
            launcher += ["--rdzv-backend", "c10d", "--rdzv-endpoint", args.rdzv_endpoint]
    else:
        launcher.append("--standalone")  # one node: torchrun picks a free port
    command = worker_argv(list(args.argv))
    if not command or command[0] != "run":
        # The bare `vram-bench [--sample NAME] --nproc-per-node N`: each rank runs the sample's entry file.
        command = ["run", str(args.entry), *_without_sample(command)]
    return [*launcher, "-m", "workbench", *command]


def launch_ranks(args: argparse.Namespace) -> int:
    """Run torchrun in this process (headless in the foreground, or the detached session process); the job's status."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    if args.max_restarts > 0:
        os.environ.setdefault(*UNSHARED_STORE)
    forward_requeue_signal(args.requeue_signal)
    try:
        torchrun(torchrun_argv(args))
    except ChildFailedError as exc:
        print(f"vram-bench: error: {failure_report(exc.failures)}", file=sys.stderr)
        return job_status(exc.failures)
    except SignalException as exc:  # SIGTERM/SIGHUP/SIGINT to the launcher: forwarded to every rank, which stop cleanly
        print(f"vram-bench: {exc.sigval.name} forwarded to every rank; each stopped after its final snapshot", file=sys.stderr)
        return 0
    return 0


def forward_requeue_signal(name: str) -> None:
    """The requeue signal (`--requeue-signal`, SIGUSR1 by default: a batch scheduler's "time is nearly up", which
    Slurm's `--signal=B:USR1@120` sends to the batch shell's process, this launcher) is passed on to every rank, which
    then writes its final snapshot and ends with the rest at one boundary, as for one process. torchrun forwards
    SIGTERM, SIGINT, SIGHUP and SIGQUIT only: SIGUSR1's default action killed the launcher, and its ranks ended as
    for a lost launcher (exit 1, no requeue)."""
    import signal

    import psutil

    def forward(signum: int, frame: object) -> None:
        for child in psutil.Process().children():
            try:
                child.send_signal(signum)
            except psutil.Error:
                pass  # a rank ending by itself just now

    signal.signal(getattr(signal, f"SIG{name}"), forward)


def job_status(failures: dict[int, object]) -> int:
    """2 when the ranks that ended on their own all ended with 2 (setup() failed, a resume loaded nothing: the
    status one process gives), the others being those torchrun then stopped with a signal; otherwise 1."""
    codes = {getattr(failure, "exitcode", None) for failure in failures.values()}
    own = {code for code in codes if not (isinstance(code, int) and code < 0)}
    return 2 if own == {2} else 1


def failure_report(failures: dict[int, object]) -> str:
    """torchrun's failures as one line: which rank ended how (`rank 1 was killed by SIGKILL`)."""
    import signal

    parts = []
    for rank, failure in sorted(failures.items()):
        code = getattr(failure, "exitcode", None)
        if isinstance(code, int) and code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        parts.append(f"rank {rank} {how}")
    return "; ".join(parts) + " (each rank's events are in the run folder: events.jsonl, events-rankN.jsonl)"
