"""Summarise a py-spy profile (`py-spy record --format raw --threads`): samples per thread and each
thread's functions by inclusive samples (a function counted once per sample, however deep it recurs).

    python benchmarks/pyspy_summary.py PROFILE[.gz] [--top 25]

py-spy's raw format is one line per distinct stack: frames separated by ';' (with --threads the first
is "thread (id): name"), then a space and the sample count. Without --idle, py-spy leaves out samples
of threads waiting in the kernel (a lock, the GIL, a socket); with --gil it keeps only the thread that
holds the GIL.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import re
import sys
from pathlib import Path

_LINE = re.compile(r":\d+\)$")


def read_stacks(path: Path) -> list[tuple[list[str], int]]:
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line.strip():
                continue
            stack, count = line.rsplit(" ", 1)
            out.append((stack.split(";"), int(count)))
    return out


def summarise(stacks: list[tuple[list[str], int]], top: int = 25) -> dict[str, dict]:
    """Per thread (the first frame, its id dropped): total samples and the `top` functions by inclusive
    samples, each as (function with its file, samples)."""
    threads: dict[str, dict] = {}
    for frames, n in stacks:
        name = re.sub(r"^thread \(\d+\): ", "", frames[0])
        t = threads.setdefault(name, {"samples": 0, "inclusive": collections.Counter()})
        t["samples"] += n
        for fn in {_LINE.sub(")", f) for f in frames[1:]}:
            t["inclusive"][fn] += n
    return {name: {"samples": t["samples"], "top": t["inclusive"].most_common(top)}
            for name, t in sorted(threads.items(), key=lambda kv: -kv[1]["samples"])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    for name, t in summarise(read_stacks(args.profile), args.top).items():
        print(f"== {name}: {t['samples']} samples")
        for fn, n in t["top"]:
            print(f"{n:7d} {100 * n / t['samples']:5.1f}%  {fn}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
