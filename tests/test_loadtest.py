"""The load tester against the real server (default model, CPU), and its SLO search on made-up numbers."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import soundfile as sf

from conftest import synthetic_audio
from realtime.serving import TranscriptionEngine
from stream_server import loadtest
from stream_server.background import ServerThread
from stream_server.engine_factory import build_engine
from stream_server.loadtest import ClientConfig, LevelSummary, passes_slo, search_capacity
from stream_server.settings import ServerSettings

SAMPLE = Path(__file__).resolve().parent.parent / "demo" / "samples" / "sample_en.wav"
MODEL = ServerSettings().served_model_names[0]


@pytest.fixture(scope="module")
def engine() -> Iterator[TranscriptionEngine]:
    eng = build_engine("sequential", "default", model_name=MODEL, max_streams=16)
    eng.start()
    yield eng
    eng.stop()


@pytest.fixture(scope="module")
def server(engine: TranscriptionEngine) -> Iterator[ServerThread]:
    with ServerThread(ServerSettings(host="127.0.0.1", port=0), engine) as srv:
        yield srv


@pytest.fixture(scope="module")
def short_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("audio") / "synthetic.wav"
    sf.write(path, synthetic_audio(2.5, seed=3), 16000, subtype="PCM_16")
    return path


def reference_text(url: str, path: Path, dialect: str = "vllm") -> str:
    """One client alone, sending the whole file unpaced: the transcript every load run must reproduce."""
    pcm = loadtest.load_pcm16(path).astype("<i2").tobytes()
    res = asyncio.run(loadtest.transcribe_pcm(ClientConfig(url=url, model=MODEL, dialect=dialect), pcm))
    assert res.completed and res.text == res.delta_text
    return res.text


# ---------------------------------------------------------------------------------------------
# Real runs
# ---------------------------------------------------------------------------------------------
SUMMARY_FIELDS = {
    "streams", "completed", "rejected", "retries", "errors", "tokens", "delay_samples", "delay_p50_ms", "delay_p90_ms",
    "delay_p99_ms", "delay_max_ms", "ttft_p50_ms", "ttft_p99_ms", "final_p50_ms", "final_p99_ms",
    "send_lag_max_ms", "audio_s", "wall_s", "passes_slo",
}


def test_small_run_writes_json_and_matches_single_clients(server: ServerThread, short_wav: Path,
                                                          tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    rc = loadtest.main(["--url", server.ws_url, "--streams", "4", "--rate", "4", "--files", str(SAMPLE),
                        str(short_wav), "--stagger-ms", "0", "--out", str(out), "-q"])
    assert rc == 0
    report = json.loads(out.read_text())
    assert {"config", "slo", "max_streams_within_slo", "tried", "levels", "wall_s"} <= report.keys()
    assert report["config"]["dialect"] == "vllm" and report["config"]["rate"] == 4
    assert report["slo"]["threshold_ms"] == 580  # default delay 480 + 100
    (level,) = report["levels"]
    s = level["summary"]
    assert set(s) == SUMMARY_FIELDS
    assert (s["streams"], s["completed"], s["errors"], s["rejected"]) == (4, 4, 0, 0)
    assert s["delay_samples"] == len(level["delays_ms"]) > 0
    # A token is decided after its audio was sent: a negative delay would be a bookkeeping error.
    assert min(level["delays_ms"]) >= 0
    assert s["delay_p50_ms"] <= s["delay_p99_ms"] <= s["delay_max_ms"]
    assert s["final_p50_ms"] is not None and s["final_p50_ms"] > 0
    assert s["audio_s"] == pytest.approx(2 * 7.748 + 2 * 2.5, abs=0.01)

    refs = {str(SAMPLE): reference_text(server.ws_url, SAMPLE), str(short_wav): reference_text(server.ws_url, short_wav)}
    files = report["config"]["files"]
    for r in level["stream_results"]:
        assert r["errors"] == [] and r["completed"]
        # stream i plays file i % len(files): paced, concurrent and chunked differently, same text
        assert r["text"] == r["delta_text"] == refs[files[r["index"] % len(files)]]
    assert any(refs.values()), "the model produced no text at all"

    if loadtest.plots_available():
        assert (tmp_path / "results_cdf.png").stat().st_size > 0
        assert (tmp_path / "results_vs_streams.png").stat().st_size > 0


def test_uploads_run_beside_the_streams(server: ServerThread, short_wav: Path, tmp_path: Path, capfd) -> None:
    """`--uploads 2`: file transcriptions kept in flight during the level; the report and the table say how many
    ran, how much audio they carried, how fast, and whether any failed."""
    out = tmp_path / "mixed.json"
    rc = loadtest.main(["--url", server.ws_url, "--streams", "2", "--files", str(short_wav), "--uploads", "2",
                        "--upload-files", str(short_wav), "--stagger-ms", "0", "--out", str(out), "--no-plots", "-q"])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["config"]["uploads"] == 2
    (level,) = report["levels"]
    u = level["uploads"]
    assert u["in_flight"] == 2 and u["completed"] >= 2 and u["errors"] == 0
    assert u["audio_s"] == pytest.approx(2.5 * u["completed"], abs=0.01) and u["x_real_time"] > 0
    assert level["summary"]["completed"] == 2 and level["summary"]["errors"] == 0
    assert f"beside 2 streams: {u['completed']} uploads (2 in flight)" in capfd.readouterr().out


def test_clients_spread_over_processes(server: ServerThread, short_wav: Path, tmp_path: Path) -> None:
    """`--processes 2`: the level's streams run in two worker processes (stream i in worker i mod 2) and come
    back as one level: every stream, in index order, each with its file's text and its delays."""
    out = tmp_path / "results.json"
    rc = loadtest.main(["--url", server.ws_url, "--streams", "3", "--rate", "4", "--files", str(SAMPLE),
                        str(short_wav), "--stagger-ms", "0", "--processes", "2", "--out", str(out), "--no-plots",
                        "-q"])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["config"]["processes"] == 2
    (level,) = report["levels"]
    assert (level["summary"]["completed"], level["summary"]["errors"]) == (3, 0)
    assert [r["index"] for r in level["stream_results"]] == [0, 1, 2]
    refs = [reference_text(server.ws_url, SAMPLE), reference_text(server.ws_url, short_wav)]
    for r in level["stream_results"]:
        assert r["text"] == r["delta_text"] == refs[r["index"] % 2]
        assert r["delay_samples"] > 0
    assert level["summary"]["delay_samples"] == len(level["delays_ms"]) == sum(
        r["delay_samples"] for r in level["stream_results"])
    assert min(level["delays_ms"]) >= 0


def test_openai_dialect_run(server: ServerThread, short_wav: Path) -> None:
    cfg = ClientConfig(url=server.ws_url, dialect="openai", model=MODEL, rate=4)
    pcm = loadtest.load_pcm16(short_wav)
    level = asyncio.run(loadtest.run_level(cfg, [pcm], 1, slo_ms=580))
    (r,) = level.streams
    assert r.completed and r.errors == [], r.errors
    assert r.text == r.delta_text == reference_text(server.ws_url, short_wav)
    # streamscribe adds audio_end_ms to OpenAI deltas, so text tokens get delays too
    assert r.delays_ms and min(r.delays_ms) >= 0


def test_rejections_are_counted(engine: TranscriptionEngine, short_wav: Path) -> None:
    settings = ServerSettings(host="127.0.0.1", port=0, max_sessions=2)
    pcm = loadtest.load_pcm16(short_wav)
    with ServerThread(settings, engine) as srv:
        cfg = ClientConfig(url=srv.ws_url, model=MODEL, rate=2)
        level = asyncio.run(loadtest.run_level(cfg, [pcm] * 4, 4, slo_ms=580))
    s = level.summary
    assert (s.streams, s.completed, s.rejected) == (4, 2, 2)
    assert not s.passes_slo
    rejected = [r for r in level.streams if r.rejected]
    assert all(any("server_full" in e for e in r.errors) for r in rejected)


def test_refused_streams_retry_when_asked(engine: TranscriptionEngine, short_wav: Path) -> None:
    """--retry-busy: a stream refused for room connects again until it is admitted (here, once the two streams
    before it have finished), so all four complete and none counts as rejected; --retry-for bounds the waiting."""
    settings = ServerSettings(host="127.0.0.1", port=0, max_sessions=2)
    pcm = loadtest.load_pcm16(short_wav)
    with ServerThread(settings, engine) as srv:
        cfg = ClientConfig(url=srv.ws_url, model=MODEL, rate=2, retry_busy_s=0.2, retry_for_s=20.0)
        level = asyncio.run(loadtest.run_level(cfg, [pcm] * 4, 4, slo_ms=5000))
        s = level.summary
        assert (s.streams, s.completed, s.rejected, s.errors) == (4, 4, 0, 0) and s.retries >= 2
        assert sorted(r.retries > 0 for r in level.streams) == [False, False, True, True]
        texts = {r.text for r in level.streams}
        assert len(texts) == 1 and texts != {""}  # the retried streams transcribe like the others
        brief = dataclasses.replace(cfg, retry_for_s=0.3)  # gives up before the first two finish
        s = asyncio.run(loadtest.run_level(brief, [pcm] * 4, 4, slo_ms=5000)).summary
        assert (s.completed, s.rejected) == (2, 2) and s.retries >= 2


# ---------------------------------------------------------------------------------------------
# The SLO search on synthetic measurements
# ---------------------------------------------------------------------------------------------
def synthetic(capacity: int, *, error_at: int | None = None):
    """A server that meets the 580 ms SLO up to `capacity` streams and falls behind after it."""
    measured: list[int] = []

    async def measure(n: int) -> LevelSummary:
        measured.append(n)
        p99 = 120.0 + 10 * n if n <= capacity else 5000.0 + n
        errors = 1 if error_at is not None and n >= error_at else 0
        return LevelSummary(streams=n, completed=n, errors=errors, delay_p99_ms=p99)

    return measure, measured


@pytest.mark.parametrize("capacity", [1, 5, 37, 64, 100])
async def test_search_finds_the_largest_passing_count(capacity: int) -> None:
    slo = 120.0 + 10 * capacity  # exactly met at `capacity`
    measure, measured = synthetic(capacity)
    out = await search_capacity(measure, slo, max_streams=256)
    assert out.best == capacity
    assert len(measured) == len(set(measured)), "a stream count was measured twice"
    assert out.tried == measured and not out.exhausted
    assert len(measured) <= 2 * 8 + 1  # doubling to 256, then bisection


async def test_search_edges() -> None:
    measure, _ = synthetic(0)
    assert (await search_capacity(measure, 580, max_streams=64)).best == 0
    measure, measured = synthetic(1000)
    out = await search_capacity(measure, 1e9, max_streams=48)
    assert out.best == 48 and measured[-1] == 48
    measure, _ = synthetic(100, error_at=20)  # fast but failing streams are not capacity
    assert (await search_capacity(measure, 1e9, max_streams=256)).best == 19


async def test_ramp_stops_at_the_first_miss() -> None:
    measure, measured = synthetic(40)
    out = await search_capacity(measure, 580, levels=[8, 1, 2, 4, 16, 32, 64, 128])
    assert out.best == 32
    assert measured == [1, 2, 4, 8, 16, 32, 64]  # ascending; 128 never run


async def test_search_respects_its_time_budget() -> None:
    now = [0.0]

    async def measure(n: int) -> LevelSummary:
        now[0] += 10.0  # each level takes 10 s
        return LevelSummary(streams=n, completed=n, delay_p99_ms=100.0)

    out = await search_capacity(measure, 580, max_streams=1024, deadline=35.0, clock=lambda: now[0])
    assert out.exhausted and out.tried == [1, 2, 4, 8] and out.best == 8


def test_slo_rule() -> None:
    ok = LevelSummary(streams=4, completed=4, delay_p99_ms=580.0)
    assert passes_slo(ok, 580)
    assert not passes_slo(LevelSummary(streams=4, completed=4, delay_p99_ms=580.5), 580)
    assert not passes_slo(LevelSummary(streams=4, completed=3, delay_p99_ms=100.0), 580)
    assert not passes_slo(LevelSummary(streams=4, completed=4, rejected=1, delay_p99_ms=100.0), 580)
    assert not passes_slo(LevelSummary(streams=4, completed=4, delay_p99_ms=None), 580)


def test_client_keepalive_is_off_only_for_uploads_faster_than_real_time() -> None:
    """Paced clients keep the websockets library's pings; a client sending faster than real time (or everything at
    once) has its pings held behind its audio by the server's backpressure, so it leaves keepalive to the server."""
    assert loadtest.client_keepalive(1.0) == {} and loadtest.client_keepalive(0.5) == {}
    assert loadtest.client_keepalive(20.0) == {"ping_interval": None}
    assert loadtest.client_keepalive(None) == {"ping_interval": None}


def test_percentile_and_stream_audio() -> None:
    assert loadtest.percentile([], 50) is None
    assert loadtest.percentile(list(range(1, 101)), 99) == 99
    assert loadtest.percentile([5.0], 99) == 5.0
    a, b = np.arange(10, dtype=np.int16), np.arange(100, 104, dtype=np.int16)
    assert loadtest.stream_audio([a, b], 1, None) is b
    # --duration repeats the files in turn from the stream's own file and cuts to length
    np.testing.assert_array_equal(loadtest.stream_audio([a, b], 1, 15 / 16000), np.r_[b, a, b[:1]])


def test_send_log_maps_audio_to_the_append_that_completed_it() -> None:
    log = loadtest._SendLog()
    log.add(1280, 1.0)
    log.add(2560, 2.0)
    assert log.sent_at(1) == log.sent_at(1280) == 1.0  # [0, 1280) all left with the first append
    assert log.sent_at(1281) == log.sent_at(2560) == 2.0
    assert log.sent_at(2561) is None and log.total == 2560
