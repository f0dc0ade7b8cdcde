"""Server settings: one dataclass filled from the command line (or directly by tests)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path

DEMO_DIR = Path(__file__).resolve().parent.parent / "demo"
REALTIME_PATH = "/v1/realtime"


@dataclass
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_names: tuple[str, ...] = ("streamscribe-default",)
    api_keys: tuple[str, ...] = ()
    allow_no_auth: bool = False  # serve a non-loopback host without keys (refused otherwise)
    allowed_origins: tuple[str, ...] | None = None  # None: same host + localhost
    max_sessions: int = 64
    # sessions one client may hold at once (0: no limit); a client is its API key when keys are set, else its
    # address (behind a proxy every client has the proxy's address: use keys there)
    max_sessions_per_client: int = 0
    # A message above this gets an error event (the session goes on); the transport drops the
    # connection only above `transport_max_factor` times it (so a runaway client costs bounded memory).
    max_message_bytes: int = 1 << 20
    transport_max_factor: int = 4
    # POST /v1/audio/transcriptions: the largest request body (the file and the form around it)
    max_upload_bytes: int = 25 << 20
    # ... and the most audio it may hold: compressed silence packs days into a few MB, and the decoded audio (16 kHz
    # mono float32: 230 MB an hour) is held while it is transcribed
    max_upload_seconds: float = 3600.0
    # uploads transcribed at once (each also counts as a session); more get 503 `server_busy`, so that files cannot
    # take every session slot, nor the memory of max_sessions decoded files, from live callers
    max_uploads: int = 8
    # new sessions and uploads get `server_busy` while the engine's recent steps (median of the last 2 s) take longer
    # than this: a batched step decodes 80 ms of audio for every stream, so past 80 ms live streams fall behind and
    # one more would slow them all (0: no such limit)
    max_step_ms: float = 64.0
    # before listening, run paced noise through the engine at doubling stream counts so that `max_step_ms`'s
    # foreseen check has a step-cost line for the first burst (`calibration.py`). The command line turns it on
    # (`--no-calibrate` turns it off); off here, so that a test's server starts at once.
    calibrate_on_start: bool = False
    # new sessions and uploads also get `server_busy` while the event loop runs timers later than this (median of the
    # last 2 s; `loop_lag.py`): the host side is saturated though the engine's steps may still be short (0: no limit).
    # The command line's default is 100 ms (set from a GPU burst, stream_server/README.md); 0 here, so that a test's
    # server on a loaded CI box never refuses a session for its host's load
    max_loop_lag_ms: float = 0.0
    # vLLM dialect: a `transcription.delta` for every token, most of them empty, as vLLM sends them (True), or only
    # for tokens with text (False, `--no-empty-deltas`): the same transcript for a client that concatenates deltas,
    # with up to a third less host work per audio message (benchmarks/host_path_cost.py), but no event every 80 ms
    vllm_empty_deltas: bool = True
    idle_timeout_s: float = 30.0  # no client message and nothing in flight for this long -> idle_timeout
    ping_interval_s: float | None = 20.0
    ping_timeout_s: float | None = 20.0
    close_timeout_s: float = 5.0  # how long a closing handshake may take before the TCP connection is cut
    # Backpressure: stop reading a socket while the engine has more than this much of the session's
    # audio undecoded, or while this many bytes wait to be sent to it. Audio is never dropped.
    max_pending_audio_s: float = 2.0
    send_queue_high_bytes: int = 4 << 20
    # Audio a client may leave waiting for a commit (vLLM dialect, before an utterance starts).
    max_buffered_audio_s: float = 120.0
    # An engine that makes no progress on a session's queued work for this long is reported
    # (error event `engine_stalled`) and the session is closed, rather than hanging silently.
    engine_stall_timeout_s: float = 60.0
    stats_interval_s: float = 1.0
    # Graceful shutdown (SIGTERM / SIGINT; `StreamServer.shut_down`): new sessions are refused and /health reports
    # "draining" at once; live sessions go on as usual for up to `drain_timeout_s`; then every turn still running is
    # ended as the client's final commit would end it, its transcript is sent (waiting at most `shutdown_flush_s`)
    # and the session is closed with 1001 (going away). A second signal stops at once.
    drain_timeout_s: float = 10.0
    shutdown_flush_s: float = 15.0
    demo_dir: Path = field(default_factory=lambda: DEMO_DIR)
    # several server processes on one port (`--workers`): the kernel spreads new connections over them
    reuse_port: bool = False
    # TLS on the port itself (wss:// and https://): a PEM certificate chain, and its key unless the chain file holds it
    tls_certfile: Path | None = None
    tls_keyfile: Path | None = None

    @property
    def auth_enabled(self) -> bool:
        return bool(self.api_keys)

    @property
    def tls_enabled(self) -> bool:
        return self.tls_certfile is not None

    @property
    def ws_scheme(self) -> str:
        return "wss" if self.tls_enabled else "ws"

    @property
    def http_scheme(self) -> str:
        return "https" if self.tls_enabled else "http"

    def ssl_context(self) -> ssl.SSLContext | None:
        """The server's TLS context (None without a certificate); ValueError naming the file when it cannot load."""
        if self.tls_certfile is None:
            if self.tls_keyfile is not None:
                raise ValueError("a TLS key file was given without its certificate (--ssl-certfile)")
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.tls_certfile, self.tls_keyfile)
        except (OSError, ssl.SSLError) as exc:
            files = str(self.tls_certfile) + (f" / {self.tls_keyfile}" if self.tls_keyfile else "")
            raise ValueError(f"cannot load the TLS certificate and key from {files}: {exc}") from None
        return ctx
