"""A transformers model built from its config: construction time plain, and as a resume's or rebuild's setup() does.

A resume fills every parameter from the snapshot and a rebuild carries them over, so vram-bench builds the model
inside `skipping_init()` (workbench/engine/init_skipping.py) and its random initialization is deferred, then
dropped. transformers routes torch.nn.init through initializers of its own while it builds a model, and until
d16c7d5 those were not deferred: a resume of a model built from its config ran the whole initialization.

Each variant runs in a fresh process (`--repeat` rounds, order rotated, medians): the model built plainly, and built
inside `skipping_init()` with the workbench at `--code` (a checkout; several may be given, to compare versions).
Needs `transformers` (not a vram-bench dependency): `pip install transformers`.

    python bench/library_init.py [--model gpt2|llama] [--repeat 5] [--code /path/to/checkout ...]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch, transformers
from workbench.engine.init_skipping import skipping_init
model, skipping = sys.argv[2], sys.argv[3] == "skip"
# The classes are taken before setup() runs, as a project's `from transformers import ...` takes them: transformers
# imports lazily, and a first import inside setup() would take the initializers as they are then.
if model == "gpt2":
    config, cls = transformers.GPT2Config(), transformers.GPT2LMHeadModel  # 124M parameters
else:
    config = transformers.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=12,
                                      num_attention_heads=16, num_key_value_heads=16, vocab_size=32000)
    cls = transformers.LlamaForCausalLM
build = lambda: cls(config)
torch.manual_seed(0)
started = time.perf_counter()
if skipping:
    with skipping_init() as log:
        built = build()
    settled = [s.reason for s in log.settled]
else:
    built, settled = build(), []
seconds = time.perf_counter() - started
parameters = sum(p.numel() for p in built.parameters())
print(json.dumps({"seconds": seconds, "parameters": parameters, "settled": settled}))
"""


def run(code: str, model: str, mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, code, model, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("gpt2", "llama"), default="gpt2")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--code", nargs="*", default=[str(REPO)], help="workbench checkouts to compare")
    args = parser.parse_args()
    variants = [("plain", args.code[0], "plain")] + [(f"skipping ({code})", code, "skip") for code in args.code]
    times: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    seen: dict[str, dict] = {}
    for round_ in range(args.repeat):
        for name, code, mode in variants[round_ % len(variants):] + variants[:round_ % len(variants)]:
            result = run(code, args.model, mode)
            times[name].append(result["seconds"])
            seen[name] = result
    print(f"{args.model}: {seen['plain']['parameters'] / 1e6:.0f}M parameters; {platform.node()}, "
          f"{platform.processor() or platform.machine()}, Python {platform.python_version()}; medians of {args.repeat}")
    plain = statistics.median(times["plain"])
    for name, _, _ in variants:
        median = statistics.median(times[name])
        settled = seen[name]["settled"]
        print(f"  {name}: {median:.3f} s ({min(times[name]):.3f}-{max(times[name]):.3f}), {median / plain:.3f}x plain"
              + (f"; the initialization ran when setup() did {settled[0]}" if settled else ""))


if __name__ == "__main__":
    main()
