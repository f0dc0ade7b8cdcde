"""Run a `StreamServer` on a background thread with its own event loop (tests, tools, notebooks).

    with ServerThread(settings, engine) as srv:
        url = srv.ws_url   # ws://127.0.0.1:PORT/v1/realtime
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

from realtime.serving import TranscriptionEngine

from .server import StreamServer
from .settings import REALTIME_PATH, ServerSettings


class ServerThread:
    def __init__(self, settings: ServerSettings, engine: TranscriptionEngine, *, owns_engine: bool = False) -> None:
        self.settings = settings
        self.engine = engine
        self.owns_engine = owns_engine
        self.server: StreamServer | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop: asyncio.Event | None = None

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    @property
    def http_url(self) -> str:
        return f"{self.settings.http_scheme}://{self.settings.host}:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"{self.settings.ws_scheme}://{self.settings.host}:{self.port}{REALTIME_PATH}"

    def start(self) -> ServerThread:
        self._thread = threading.Thread(target=self._run, name="stream-server", daemon=True)
        self._thread.start()
        self._ready.wait(60)
        if self._error is not None:
            raise RuntimeError("server failed to start") from self._error
        if self.server is None:
            raise RuntimeError("server did not start within 60 s")
        return self

    def _run(self) -> None:
        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self.server = StreamServer(self.settings, self.engine, owns_engine=self.owns_engine)
            try:
                await self.server.start()
            except BaseException as exc:
                self._error = exc
                self.server = None
                self._ready.set()
                return
            self._ready.set()
            try:
                await self._stop.wait()
            finally:
                await self.server.stop()

        asyncio.run(main())

    def call(self, fn, *args):
        """Run `fn(*args)` on the server's loop and return its result (for inspecting state)."""
        assert self.loop is not None
        fut = asyncio.run_coroutine_threadsafe(self._call(fn, *args), self.loop)
        return fut.result(10)

    @staticmethod
    async def _call(fn, *args):
        return fn(*args)

    def shut_down(self) -> concurrent.futures.Future[None]:
        """Start the server's graceful shutdown (`StreamServer.shut_down`) and return at once; the future is done
        when it is. `stop()` then ends the thread."""
        assert self.loop is not None and self.server is not None
        return asyncio.run_coroutine_threadsafe(self.server.shut_down(), self.loop)

    def stop(self) -> None:
        if self.loop is not None and self._stop is not None and self._thread is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(30)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
