"""`python -m stream_server --workers N`: N server processes on one port, each with its own engine.

One server process runs its websocket sessions on an event loop and its engine on a thread of the same
interpreter, so at a few hundred paced streams the two take turns on one interpreter lock (`docs/
benchmarks.md`, issue 4). Here a supervisor starts N ordinary server processes bound to the same port
with SO_REUSEPORT; the kernel spreads new connections over them, and each process has its own lock,
loop and engine (on the same device).

- Workers start one after another, each once the one before is listening, so that a GPU engine sizes its
  KV cache against the memory the earlier ones left: worker k of N takes `kv_memory_fraction / (N - k)`
  of the free memory it finds.
- Each worker admits up to `--max-sessions` sessions itself: the kernel picks a worker by a hash of the
  connection, not by load, so a worker sized for a share of the total could refuse a session while another
  has room.
- `/health` and `/metrics` answer for the worker the request reached (`/health` names its `pid`).
- A signal to the supervisor stops every worker gracefully (one SIGTERM each: live sessions get their
  transcripts, `--drain-timeout`); a second signal stops them at once. Workers run in their own process
  session, so a terminal's Ctrl-C reaches only the supervisor and each worker sees one signal, not two. A worker
  that exits on its own stops the others, and the supervisor exits with an error. A supervisor killed outright
  (SIGKILL) takes its workers with it: on Linux each worker asks the kernel for a SIGTERM when its parent dies.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

logger = logging.getLogger("stream_server.workers")


def free_port(host: str) -> int:
    """A port the workers can share, for `--port 0` (picked here, since each worker would pick its own)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def worker_argv(argv: list[str], *, port: int, ready_file: Path, kv_fraction: float) -> list[str]:
    """The command line of one worker: the supervisor's own arguments, then the worker's overrides (for
    argparse the last occurrence of an option wins)."""
    return [sys.executable, "-m", "stream_server", *argv, "--workers", "1", "--port", str(port), "--reuse-port",
            "--ready-file", str(ready_file), "--kv-memory-fraction", repr(kv_fraction)]


def run_workers(argv: list[str], *, workers: int, host: str, port: int, kv_memory_fraction: float,
                start_timeout_s: float = 600.0, stop_timeout_s: float = 60.0, scheme: str = "ws") -> int:
    """Start `workers` server processes for the command line `argv` and supervise them until a signal
    (exit 0) or a worker's own exit (exit 1). Stopping waits up to `stop_timeout_s` for the workers' graceful
    shutdown before killing them."""
    port = port or free_port(host)
    procs: list[subprocess.Popen] = []
    stopping = False
    signals = 0

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping, signals
        stopping = True
        signals += 1
        if signals > 1:  # a second signal: the workers stop at once (their own second-signal rule)
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    rc = 0
    with tempfile.TemporaryDirectory(prefix="streamscribe-workers-") as tmp:
        try:
            for k in range(workers):
                ready = Path(tmp) / f"worker{k}.ready"
                procs.append(subprocess.Popen(worker_argv(argv, port=port, ready_file=ready,
                                                          kv_fraction=kv_memory_fraction / (workers - k)),
                                              start_new_session=True,
                                              preexec_fn=functools.partial(_die_with_parent, os.getpid())))
                deadline = time.monotonic() + start_timeout_s
                while not ready.exists():
                    if stopping:
                        return 0
                    if procs[-1].poll() is not None:
                        logger.error("worker %d exited while starting (code %s)", k, procs[-1].returncode)
                        return 1
                    if time.monotonic() > deadline:
                        logger.error("worker %d did not start listening within %.0f s", k, start_timeout_s)
                        return 1
                    time.sleep(0.05)
            print(f"streamscribe listening on {scheme}://{host}:{port}/v1/realtime ({workers} workers, pids "
                  f"{' '.join(str(p.pid) for p in procs)})", file=sys.stderr, flush=True)
            while not stopping:
                for k, p in enumerate(procs):
                    if p.poll() is not None:
                        logger.error("worker %d (pid %d) exited with code %s: stopping the others", k, p.pid,
                                     p.returncode)
                        rc = 1
                        stopping = True
                time.sleep(0.2)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + stop_timeout_s
            for p in procs:
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    logger.error("worker pid %d did not stop within %.0f s: killed", p.pid, stop_timeout_s)
                    p.kill()
                    p.wait()
    return rc


def _die_with_parent(supervisor: int) -> None:
    """In a worker, before it runs: SIGTERM it (a graceful stop) when the supervisor (pid `supervisor`) dies, even by
    SIGKILL, so that no worker is left holding the port. Linux only (prctl); elsewhere workers outlive a killed
    supervisor."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != supervisor:  # it died before the prctl (we were adopted): no signal would ever come
        os.kill(os.getpid(), signal.SIGTERM)


def mark_ready(path: Path | None) -> None:
    """A worker tells its supervisor that it listens (atomically: the file appears whole)."""
    if path is None:
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(os.getpid()))
    tmp.replace(path)
