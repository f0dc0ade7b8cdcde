"""What the server's event-loop lag probe (`stream_server/loop_lag.py`) costs: process CPU time of an otherwise idle
event loop over SECONDS, with and without the probe, alternated REPEATS times (forty-first session).

    python benchmarks/loop_lag_cost.py [--seconds 10] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stream_server.loop_lag import LoopLag  # noqa: E402


async def cpu_seconds(seconds: float, probe: bool) -> float:
    task = asyncio.create_task(LoopLag().run()) if probe else None
    c0 = time.process_time()
    await asyncio.sleep(seconds)
    c1 = time.process_time()
    if task is not None:
        task.cancel()
    return c1 - c0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    asyncio.run(cpu_seconds(0.5, True))  # warm-up: imports and the first loop's set-up are not the probe's cost
    runs: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.repeats):
        for probe in (False, True):
            runs[probe].append(asyncio.run(cpu_seconds(args.seconds, probe)))
    for probe in (False, True):
        ms = [s * 1000 for s in runs[probe]]
        print(f"{'with the probe' if probe else 'idle loop     '}: CPU {statistics.median(ms):.1f} ms in "
              f"{args.seconds:g} s (median of {args.repeats}: {', '.join(f'{m:.1f}' for m in ms)})")
    extra = statistics.median(runs[True]) - statistics.median(runs[False])
    print(f"the probe costs {extra / args.seconds * 100:.3f}% of one core")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
