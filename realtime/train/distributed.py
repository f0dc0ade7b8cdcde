"""Data-parallel training: one process per GPU (NCCL), or per CPU process (gloo, for tests).

    reports = train_data_parallel(config, world=4, deadline=time.time() + 420, hooks=hooks)

Each rank builds its own `Trainer` with `rank`/`world` set (its part of the shards, its own batches,
DDP-averaged gradients); the time budget is agreed among the ranks, so all of them stop after the
same step. Rank 0 alone runs the hooks: `on_checkpoint` after each checkpoint and `on_end` after the
last step (the caller's exports). Every rank writes `OUT/rank{r}.json` with its step count and a
checksum of its weights, so the caller can check that the replicas stayed identical. If one rank
dies, the others are stopped (they would wait in a collective for ever) and the error names it.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import torch

from .train import TrainConfig, Trainer

logger = logging.getLogger(__name__)


class RankHooks(Protocol):
    """What rank 0 does with the trainer (must be picklable: it travels to a spawned process)."""

    def on_checkpoint(self, trainer: Trainer) -> None: ...

    def on_end(self, trainer: Trainer) -> None: ...


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def report_path(out: str | Path, rank: int) -> Path:
    return Path(out) / f"rank{rank}.json"


def weight_checksum(model: torch.nn.Module) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def _rank_main(rank: int, world: int, port: int, tc: TrainConfig, deadline: float | None,
               hooks: RankHooks | None, log_path: str | None) -> None:
    import torch.distributed as dist

    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, stream=sys.stderr,
                        format=f"%(asctime)s [rank {rank}] %(message)s")
    if log_path and rank == 0:  # rank 0's lines (progress every 10th log step, profile) into the run's log
        handler = logging.FileHandler(log_path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logging.getLogger().addHandler(handler)
        progress = logging.getLogger("realtime.train.progress")
        progress.propagate = False
        progress.addHandler(handler)
    torch.set_num_threads(1)  # the host thread only feeds its GPU; other cores synthesise
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if tc.device.startswith("cuda"):
        torch.cuda.set_device(rank)
        # the device named up front: NCCL binds it at once instead of guessing it from the rank
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    finished = False
    try:
        tc = replace(tc, rank=rank, world=world)
        trainer = Trainer(tc)
        trainer.wait_for_data()
        if deadline is not None:
            tc.max_minutes = max(0.5, (deadline - time.time()) / 60)  # agreed (minimum) inside train()
        trainer.train(on_checkpoint=hooks.on_checkpoint if hooks is not None and rank == 0 else None)
        report = {"rank": rank, "step": trainer.step, "train_s": trainer.train_s,
                  "checksum": weight_checksum(trainer.model), "shards": len(trainer.corpus.by_shard)}
        if hooks is not None and rank == 0:
            hooks.on_end(trainer)
        tmp = report_path(tc.out, rank).with_suffix(".tmp")
        tmp.write_text(json.dumps(report))
        os.replace(tmp, report_path(tc.out, rank))  # whole or absent: the parent reads it as the rank's result
        dist.barrier()  # no rank tears down its connections while another still uses them
        finished = True
    finally:
        dist.destroy_process_group()
    if finished:
        # The work is done and reported. Skip the interpreter's teardown: a CI run once saw a rank abort there
        # ("terminate called without an active exception", exit code -6) after training had ended.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def supervise(procs: Sequence[Any], reported: Callable[[int], bool], poll_s: float = 1.0,
              grace_s: float = 10.0) -> None:
    """Wait for the rank processes. Raises when one fails before reporting its result (`reported(rank)`); a rank
    that dies after reporting (in teardown) is only logged, and once every rank has reported, the others get
    `grace_s` to exit before the caller stops them (a peer that died leaves them in the closing barrier)."""

    def failed_unreported() -> list[Any]:
        return [p for r, p in enumerate(procs) if p.exitcode not in (None, 0) and not reported(r)]

    all_reported_at = None
    while any(p.is_alive() for p in procs):
        if failed := failed_unreported():
            raise RuntimeError(f"training rank {failed[0].name} failed (exit code {failed[0].exitcode}); "
                               "the other ranks were stopped")
        if all(reported(r) for r in range(len(procs))):
            all_reported_at = all_reported_at or time.monotonic()
            if time.monotonic() - all_reported_at > grace_s:
                break
        time.sleep(poll_s)
    if failed := failed_unreported():
        raise RuntimeError(f"training rank {failed[0].name} failed (exit code {failed[0].exitcode})")
    for p in procs:
        if p.exitcode not in (None, 0):
            logger.warning("rank %s ended with exit code %s after reporting its result; the result stands",
                           p.name, p.exitcode)


def train_data_parallel(tc: TrainConfig, world: int, deadline: float | None = None,
                        hooks: RankHooks | None = None, log_path: str | None = None, poll_s: float = 1.0
                        ) -> list[dict]:
    """Train on `world` ranks until the budget (`deadline`, wall clock) or `tc.max_steps`; returns
    the ranks' reports. Raises if a rank fails or the ranks end with different weights. Rank 0 also
    logs into `log_path`."""
    Path(tc.out).mkdir(parents=True, exist_ok=True)
    for old in Path(tc.out).glob("rank*.json"):
        old.unlink()
    port = _free_port()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, tc, deadline, hooks, log_path), name=f"rank{r}")
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        supervise(procs, lambda r: report_path(tc.out, r).exists(), poll_s)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(10)
    reports = [json.loads(report_path(tc.out, r).read_text()) for r in range(world)]
    steps = {r["step"] for r in reports}
    sums = [r["checksum"] for r in reports]
    if len(steps) != 1 or max(sums) - min(sums) > 1e-9 * max(1.0, abs(sums[0])):
        raise RuntimeError(f"data-parallel ranks diverged: steps {sorted(steps)}, weight checksums {sums}")
    logger.info("%d rank(s) agree: %d steps, weight checksum %.6f", world, reports[0]["step"], sums[0])
    return reports
