"""The long run: `python tests/differential --count 3000` (random seeds), or `--first 0 --count 300` (CI's set);
`--family script` runs the script-style family (tests/differential/script.py) instead of the two-file one.

Prints the summary and every silent mismatch or harness problem in full (seed, edits as diffs,
events, values); exit code 1 when there is one. A mismatch found here becomes a named case in
tests/test_differential.py's REGRESSIONS once fixed.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a folder: import `differential` from tests/

from differential.generator import FAMILIES, SAVES, generate  # noqa: E402
from differential.report import explain, failures, summary  # noqa: E402
from differential.runner import Harness  # noqa: E402


def _between(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    try:
        between = (int(low), int(high or low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give MIN-MAX, e.g. 12-30") from None
    if not 1 <= between[0] <= between[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: 1 <= MIN <= MAX")
    return between


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/differential", description=__doc__)
    parser.add_argument("--count", type=int, default=1000, help="sequences to run (default 1000)")
    parser.add_argument("--first", type=int, default=None, help="first seed (default: a random one, printed)")
    parser.add_argument("--progress", type=int, default=100, help="print a line every N sequences (0: never)")
    parser.add_argument("--family", choices=FAMILIES, default="two_file", help="the project family (default two_file)")
    parser.add_argument("--ranks", type=int, choices=(1, 2), default=1,
                        help="2: each sequence under torchrun on 2 ranks, each judged (tests/differential/ranks.py)")
    parser.add_argument("--saves", type=_between, default=SAVES, metavar="MIN-MAX",
                        help="saves a sequence (default 1-5); a long run: 12-30 (its seeds are other sequences)")
    parser.add_argument("--running", action="store_true",
                        help="with --ranks 2: every save and command comes while the ranks train")
    args = parser.parse_args(argv)
    if args.running and args.ranks != 2:
        parser.error("--running needs --ranks 2")
    first = args.first if args.first is not None else random.randrange(10**6, 10**9)
    how = (" on 2 ranks" if args.ranks == 2 else "") + (", running" if args.running else "") + \
        (f", {args.saves[0]}-{args.saves[1]} saves" if args.saves != SAVES else "")
    print(f"{args.family} family{how}, seeds {first} to {first + args.count - 1}", flush=True)
    started = time.monotonic()
    results = []
    with Harness(args.ranks, args.running) as harness:
        for number, seed in enumerate(range(first, first + args.count), start=1):
            result = harness.run(generate(seed, args.family, args.saves))
            results.append(result)
            if result in failures([result]):
                print(explain(result), flush=True)
            if args.progress and number % args.progress == 0:
                print(f"{number} sequences, {len(failures(results))} failing, {time.monotonic() - started:.0f} s", flush=True)
    print(summary(results, time.monotonic() - started))
    return 1 if failures(results) else 0


if __name__ == "__main__":
    sys.exit(main())
