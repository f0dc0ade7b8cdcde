"""streamscribe's websocket service: realtime speech-to-text over `/v1/realtime`.

It speaks two dialects on one path — vLLM's (`vllm_dialect.py`) and OpenAI's Realtime transcription
(`openai_dialect.py`) — plus, on the same port, OpenAI's file transcription API (`POST /v1/audio/transcriptions`:
`transcriptions.py`, read by `http_connection.py`), HTTP GET routes (`http.py`), API keys and Origin checks
(`auth.py`), Prometheus metrics (`metrics.py`), server-side VAD (`vad.py`) and load-based admission
(`admission.py`, with its start-up step-cost calibration, `calibration.py`, and the event loop's lag, `loop_lag.py`).

It talks to the engine only through `realtime.serving` (the `TranscriptionEngine` protocol and its
events); beyond that it uses `realtime.model_store` to load models (in `engine_factory.py`),
`realtime.audio` for PCM and file decoding and resampling, `realtime.config` constants, and `realtime.timestamps` /
`realtime.subtitles` for word times and subtitles (shared with the offline CLI).

    python -m stream_server --model default --port 8000

Clients: `client.py` (live transcription of a file or a pipe: `python -m stream_server.client FILE|-`, or an upload
with `--upload` through `upload_client.py`) and the load tester (`loadtest.py`); they speak the protocols only and
import nothing of the engine.
"""
