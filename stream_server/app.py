"""Command line: build the engine, check the security settings, run the server until a signal.

    python -m stream_server --model default --host 127.0.0.1 --port 8000
    python -m stream_server --model /models/voxtral --device cuda --host 0.0.0.0 --api-key "$KEY"

API keys can also come from the environment (`STREAMSCRIBE_API_KEYS`, comma-separated), which keeps
them out of the process list. Binding a non-loopback host without a key is refused unless
`--allow-no-auth` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from realtime.model_store import DEFAULT_MODEL_NAME

from .auth import is_loopback_host
from .engine_factory import DTYPES, ENGINES, build_engine
from .settings import DEMO_DIR, ServerSettings

logger = logging.getLogger("stream_server")

API_KEYS_ENV = "STREAMSCRIBE_API_KEYS"


def _fraction(text: str) -> float:
    v = float(text)
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return v


def _nonneg_float(text: str) -> float:
    v = float(text)
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return v


def _positive_float(text: str) -> float:
    v = float(text)
    if not 0 < v < float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def _nonneg_int(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return v


def _positive_int(text: str) -> int:
    v = int(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m stream_server", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default", help="checkpoint folder, or 'default' for the embedded model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda when available)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                   help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--engine", choices=ENGINES, default="batched",
                   help="batched: all streams decoded together each step (paged KV, CUDA graphs); "
                        "sequential: one session after another (reference)")
    p.add_argument("--no-cuda-graphs", action="store_true", help="run the batched engine's steps eagerly")
    p.add_argument("--no-encoder-stream", action="store_true",
                   help="keep the batched engine's encoder on the main CUDA stream (by default the next token's "
                        "encoder runs on its own stream, beside the LM step)")
    p.add_argument("--threads", type=_positive_int, default=None,
                   help="torch intra-op threads (default: 1 on cpu, torch's default on cuda)")
    p.add_argument("--drafter", default=None,
                   help="Eagle drafter folder (speculative/): verify several frames per step when audio is backlogged")
    p.add_argument("--num-speculative-tokens", type=_positive_int, default=None,
                   help="drafts per stream per step (default: on a GPU the count the drafter's config records for "
                        "GPUs, else the drafts it was trained for; on the CPU the latter, at most 6; 6 for older "
                        "parallel or two-pass drafters, 4 for chained ones)")
    p.add_argument("--tree-nodes", type=_positive_int, default=None,
                   help="verify a tree of this many drafts per round instead of one chain (parallel drafters; "
                        "more tokens accepted per round, a little more work per round)")
    p.add_argument("--tree-max-streams", type=_positive_int, default=1,
                   help="with --tree-nodes: verify the tree only in steps where at most this many streams draft, "
                        "the chain in busier steps (default 1: a tree paid at batch 1, not at 16 or 64)")
    p.add_argument("--max-verify-rows", type=_positive_int, default=None,
                   help="with --drafter: the most verify rows a step takes across its streams; in busier steps "
                        "every stream drafts fewer, or none (default: 32 on the CPU, where 64 uploads at once "
                        "decoded 2.4x faster with a cap than with 6 drafts each; no limit on CUDA)")
    p.add_argument("--max-session-seconds", type=_nonneg_float, default=0.0,
                   help="end sessions at this length (0: unlimited; a bound lets more streams fit in KV memory)")
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="names clients may ask for (default: the --model argument)")
    p.add_argument("--api-key", action="append", default=[],
                   help=f"accepted API key (repeatable; also ${API_KEYS_ENV}, comma-separated)")
    p.add_argument("--allow-no-auth", action="store_true", help="serve a non-loopback host without API keys")
    p.add_argument("--allowed-origins", nargs="+", default=None,
                   help="browser origins allowed besides the server's own (scheme://host[:port], or *); "
                        "default: the server's own and localhost")
    p.add_argument("--max-sessions", type=_positive_int, default=64)
    p.add_argument("--max-sessions-per-client", type=_nonneg_int, default=0,
                   help="sessions one client may hold at once (0: no limit): per API key when keys are set, else "
                        "per client address")
    p.add_argument("--idle-timeout", type=_nonneg_float, default=30.0, help="seconds (0 disables)")
    p.add_argument("--max-message-bytes", type=_positive_int, default=1 << 20)
    p.add_argument("--max-upload-mb", type=_positive_float, default=25.0,
                   help="largest file POST /v1/audio/transcriptions takes, in MiB (OpenAI's limit: 25)")
    p.add_argument("--max-uploads", type=_positive_int, default=8,
                   help="file transcriptions at once (each also takes a session slot); more get 503 server_busy")
    p.add_argument("--max-step-ms", type=_nonneg_float, default=64.0,
                   help="refuse new sessions and uploads (server_busy) while the engine's recent steps take longer "
                        "than this (median of the last 2 s; a step decodes 80 ms of audio for every stream), or "
                        "would with every open session and the new one (a line fitted to the engine's steps); "
                        "0 disables")
    p.add_argument("--max-loop-lag-ms", type=_nonneg_float, default=100.0,
                   help="refuse new sessions and uploads (server_busy) while the event loop runs timers later than "
                        "this (median of the last 2 s): the process's host side (websockets, audio parsing, "
                        "deltas) is saturated, whatever the engine's step (default 100); 0 disables")
    p.add_argument("--no-empty-deltas", action="store_true",
                   help="vLLM dialect: send transcription.delta only for tokens with text (vLLM sends one for every "
                        "80 ms token, most of them empty; concatenated, the text is the same, and the host work per "
                        "audio message falls by up to a third)")
    p.add_argument("--no-calibrate", action="store_true",
                   help="start without measuring the engine's step cost (by default, before listening, paced noise "
                        "runs through it at 1, 2, 4, ... streams for a few seconds, so that --max-step-ms foresees the "
                        "first burst of clients; without it the first burst is admitted whole)")
    p.add_argument("--max-upload-minutes", type=_positive_float, default=60.0,
                   help="the most audio an upload may hold (decoded, it takes 230 MB of memory an hour)")
    p.add_argument("--max-pending-audio", type=_nonneg_float, default=2.0,
                   help="seconds of undecoded audio per session before reading pauses")
    p.add_argument("--ping-interval", type=_nonneg_float, default=20.0, help="seconds (0 disables keepalive)")
    p.add_argument("--ping-timeout", type=_nonneg_float, default=20.0)
    p.add_argument("--drain-timeout", type=_nonneg_float, default=10.0,
                   help="on SIGTERM/SIGINT: seconds live sessions may go on before the server finishes their turns, "
                        "sends the transcripts and closes them (new sessions are refused at once; a second signal "
                        "stops at once)")
    p.add_argument("--shutdown-flush-timeout", type=_nonneg_float, default=15.0,
                   help="on shutdown: seconds to wait for the engine to finish a session's turns")
    p.add_argument("--ssl-certfile", type=Path, default=None,
                   help="serve TLS on the port (wss://, https://; a browser needs it for the microphone on any host "
                        "but localhost): PEM certificate chain")
    p.add_argument("--ssl-keyfile", type=Path, default=None,
                   help="its private key (PEM), unless the certificate file holds it")
    p.add_argument("--demo-dir", type=Path, default=DEMO_DIR)
    p.add_argument("--workers", type=_positive_int, default=1,
                   help="server processes on the one port, each with its own engine on the device (the kernel "
                        "spreads connections; each admits up to --max-sessions): past a few hundred paced streams "
                        "one process is bound by its interpreter lock")
    p.add_argument("--reuse-port", action="store_true",
                   help="bind with SO_REUSEPORT, so that several servers share the port (what --workers does)")
    p.add_argument("--kv-memory-fraction", type=_fraction, default=0.9,
                   help="share of the free GPU memory the engine's KV caches may take (--workers splits it)")
    p.add_argument("--ready-file", type=Path, default=None, help=argparse.SUPPRESS)  # for the --workers supervisor
    p.add_argument("--log-level", default="INFO")
    return p


def settings_from_args(args: argparse.Namespace, env: dict[str, str] | None = None) -> ServerSettings:
    """Validated settings; raises SystemExit with a message for unsafe or invalid combinations."""
    env = os.environ if env is None else env
    keys = [k for k in args.api_key if k]
    keys += [k.strip() for k in env.get(API_KEYS_ENV, "").split(",") if k.strip()]
    if not keys and not is_loopback_host(args.host) and not args.allow_no_auth:
        raise SystemExit(f"refusing to serve {args.host} without an API key: pass --api-key (or set {API_KEYS_ENV}), "
                         "or --allow-no-auth to serve it open")
    names = tuple(args.served_model_name or [DEFAULT_MODEL_NAME if args.model == "default" else args.model])
    settings = ServerSettings(
        host=args.host, port=args.port, served_model_names=names, api_keys=tuple(keys),
        allow_no_auth=args.allow_no_auth,
        allowed_origins=tuple(args.allowed_origins) if args.allowed_origins else None,
        max_sessions=args.max_sessions, max_sessions_per_client=args.max_sessions_per_client,
        idle_timeout_s=args.idle_timeout if args.idle_timeout > 0 else float("inf"),
        max_message_bytes=args.max_message_bytes, max_pending_audio_s=args.max_pending_audio,
        max_upload_bytes=int(args.max_upload_mb * (1 << 20)), max_uploads=args.max_uploads,
        max_step_ms=args.max_step_ms, calibrate_on_start=not args.no_calibrate, max_loop_lag_ms=args.max_loop_lag_ms,
        vllm_empty_deltas=not args.no_empty_deltas,
        # an upload is one engine stream: no longer than a session may be
        max_upload_seconds=min(args.max_upload_minutes * 60, args.max_session_seconds or float("inf")),
        ping_interval_s=args.ping_interval or None, ping_timeout_s=args.ping_timeout or None,
        drain_timeout_s=args.drain_timeout, shutdown_flush_s=args.shutdown_flush_timeout,
        demo_dir=args.demo_dir, reuse_port=args.reuse_port,
        tls_certfile=args.ssl_certfile, tls_keyfile=args.ssl_keyfile,
    )
    try:
        settings.ssl_context()  # a bad certificate stops here with its reason, before a model is loaded
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    if keys and not settings.tls_enabled and not is_loopback_host(args.host):
        logger.warning("serving %s without TLS: API keys and audio cross the network in clear text (pass "
                       "--ssl-certfile, or terminate TLS in a proxy in front of this port)", args.host)
    return settings


async def serve_until_signal(settings: ServerSettings, engine, ready_file: Path | None = None) -> None:
    from .server import StreamServer
    from .workers import mark_ready

    server = StreamServer(settings, engine)
    await server.start()
    url = f"{settings.ws_scheme}://{settings.host}:{server.port}/v1/realtime"
    print(f"streamscribe listening on {url}", file=sys.stderr, flush=True)
    base = f"{settings.http_scheme}://{settings.host}:{server.port}"
    print(f"streamscribe: demo page {base}/, file uploads POST {base}/v1/audio/transcriptions", file=sys.stderr,
          flush=True)
    mark_ready(ready_file)
    signals = asyncio.Queue[int]()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, signals.put_nowait, sig)
        except (NotImplementedError, RuntimeError):  # not on the main thread / platform
            pass
    try:
        await signals.get()
        # graceful: live sessions get their transcripts (`StreamServer.shut_down`); a second signal cuts it short
        drain = asyncio.create_task(server.shut_down(), name="shut-down")
        second = asyncio.create_task(signals.get())
        await asyncio.wait({drain, second}, return_when=asyncio.FIRST_COMPLETED)
        if not drain.done():
            logger.warning("second signal: stopping without waiting for live sessions")
            drain.cancel()
        second.cancel()
    finally:
        await server.stop()


def configure_threads(device: str, threads: int | None) -> int:
    """Set torch's intra-op threads: `threads`, or 1 when serving on the CPU. Returns the count.

    One engine step multiplies small matrices (a few rows per stream): extra intra-op threads mostly
    spin. Measured with the default model, 4 streams on the 2-core box: 0.154 CPU-s per stream-second
    with 1 thread, 0.259 with 2 (benchmarks/bench_cpu_engine.py); one thread also leaves a core to the
    network side."""
    import torch

    wanted = threads or (1 if device == "cpu" else None)
    if wanted:
        torch.set_num_threads(wanted)
    return torch.get_num_threads()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings_from_args(args)
    if args.workers > 1:
        from .workers import run_workers

        return run_workers(list(sys.argv[1:] if argv is None else argv), workers=args.workers, host=args.host,
                           port=args.port, kv_memory_fraction=args.kv_memory_fraction, scheme=settings.ws_scheme,
                           stop_timeout_s=args.drain_timeout + args.shutdown_flush_timeout + 30)
    import torch

    device = args.device
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    configure_threads(device, args.threads)
    engine = build_engine(args.engine, args.model, model_name=settings.served_model_names[0], device=device,
                          dtype=args.dtype, max_streams=2 * settings.max_sessions, cuda_graphs=not args.no_cuda_graphs,
                          encoder_stream=not args.no_encoder_stream,
                          max_session_seconds=args.max_session_seconds or None, drafter=args.drafter,
                          num_speculative_tokens=args.num_speculative_tokens, tree_nodes=args.tree_nodes,
                          tree_max_streams=args.tree_max_streams, max_verify_rows=args.max_verify_rows,
                          kv_memory_fraction=args.kv_memory_fraction)
    asyncio.run(serve_until_signal(settings, engine, args.ready_file))
    return 0
