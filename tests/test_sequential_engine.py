"""The simple engine behind the service interface: per-stream results equal the single session."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from conftest import synthetic_audio
from realtime.loader import load_model
from realtime.sequential_engine import SequentialEngine
from realtime.serving import AdmissionError, StreamDone, StreamError, StreamToken
from realtime.session import transcribe
from realtime.tokenizer import load_tokenizer


def test_concurrent_streams_match_single_session(tiny_ckpt):
    path = tiny_ckpt(seed=0)
    model, _ = load_model(path)
    tok = load_tokenizer(path)
    eng = SequentialEngine(model, tok, max_streams=3)
    eng.start()
    try:
        clips = [synthetic_audio(s, seed=i) for i, s in enumerate((1.0, 2.5, 1.7))]
        events: dict[int, list] = {}
        done = threading.Event()

        def cb(ev):
            events.setdefault(ev.stream_id, []).append(ev)
            if sum(isinstance(e, StreamDone) for evs in events.values() for e in evs) == len(clips):
                done.set()

        ids = [eng.open_stream(cb, delay_ms=480) for _ in clips]
        with pytest.raises(AdmissionError, match="full"):
            eng.open_stream(cb)
        rng = np.random.default_rng(0)
        pos = [0] * len(clips)
        while any(p < c.size for p, c in zip(pos, clips)):
            for i, c in enumerate(clips):
                n = int(rng.integers(1, 4000))
                if pos[i] < c.size:
                    eng.push_audio(ids[i], c[pos[i]: pos[i] + n])
                    pos[i] += n
        for sid in ids:
            eng.finish_stream(sid)
        with pytest.raises(StreamError, match="finished"):
            eng.push_audio(ids[0], np.zeros(10, np.float32))
        assert done.wait(60)
        for sid, clip in zip(ids, clips):
            ref = transcribe(model, tok, clip, delay_ms=480)
            evs = events[sid]
            assert isinstance(evs[-1], StreamDone) and evs[-1].text == ref.text
            assert [e.token_id for e in evs if isinstance(e, StreamToken)] == ref.token_ids
            assert "".join(e.text for e in evs if isinstance(e, StreamToken)) == ref.text
        for sid in ids:
            eng.close_stream(sid)
        assert eng.stats().active_streams == 0
        with pytest.raises(StreamError, match="unknown"):
            eng.push_audio(ids[0], np.zeros(10, np.float32))
    finally:
        eng.stop()
