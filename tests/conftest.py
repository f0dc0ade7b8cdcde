"""Shared fixtures: tiny checkpoints written once per test session, synthetic audio, the reference."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from realtime.testing.tiny_checkpoint import write_tiny_checkpoint

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped on CPU-only machines)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def synthetic_audio(seconds: float, seed: int = 0, rate: int = 16000) -> np.ndarray:
    """Speech-like test signal: voiced bursts (harmonics with a moving pitch) and noise, with pauses."""
    rng = np.random.default_rng(seed)
    n = int(round(seconds * rate))
    t = np.arange(n) / rate
    out = np.zeros(n, dtype=np.float64)
    pos = 0
    while pos < n:
        dur = int(rng.uniform(0.08, 0.35) * rate)
        seg = slice(pos, min(n, pos + dur))
        kind = rng.integers(0, 3)
        if kind == 0:
            f0 = rng.uniform(90, 250) * (1 + 0.2 * np.sin(2 * np.pi * rng.uniform(1, 4) * t[seg]))
            phase = 2 * np.pi * np.cumsum(f0) / rate
            out[seg] = sum(np.sin(k * phase) / k for k in range(1, 6)) * rng.uniform(0.05, 0.4)
        elif kind == 1:
            out[seg] = rng.standard_normal(seg.stop - seg.start) * rng.uniform(0.01, 0.2)
        pos += dur
    return out.astype(np.float32)


SHARD_WORDS = ["yes", "no", "stop", "go", "left", "right", "up", "down"]


def synthetic_shard(seed: int, split: str = "train", n: int = 12):
    """A training shard of `n` utterances of 2-4 command words over the synthetic test signal, with
    word times (realtime.train.synth.Shard); for the training-pipeline tests."""
    from realtime.train.synth import Shard, Utterance
    from realtime.train.targets import TimedWord

    rng = np.random.default_rng(seed)
    shard = Shard(f"synthetic:{seed}", f"spk{seed}", split)
    for i in range(n):
        k = int(rng.integers(2, 5))
        words = [SHARD_WORDS[j] for j in rng.integers(0, len(SHARD_WORDS), k)]
        audio = synthetic_audio(0.35 * k + 0.2, seed=seed * 100 + i)
        timed = [TimedWord(w, 0.1 + 0.35 * j, 0.1 + 0.35 * (j + 1)) for j, w in enumerate(words)]
        shard.utterances.append(Utterance(" ".join(words), audio, timed))
    return shard


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """One torch intra-op thread for a while: tiny matrices run fastest on one, and a second thread
    only spins on an oversubscribed CI machine (10x slower measured on a loaded 2-core box)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Use with `pytestmark = pytest.mark.usefixtures("one_thread")` in modules of tiny models."""
    with single_thread():
        yield


@pytest.fixture(scope="session")
def ckpt_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ckpt")


@pytest.fixture(scope="session")
def tiny_ckpt(ckpt_root: Path):
    """Factory: tiny checkpoint folder for (seed, format, small_windows), written once."""
    cache: dict[tuple, Path] = {}

    # The tekken backend needs mistral-common's dependencies (pydantic, pycountry, ...: 20 MB).
    # Where they are missing (the GPU machine, whose calls carry at most 64 MiB), checkpoints get the
    # equivalent tokenizer.json only; the CPU suite always has them and tests both backends.
    try:
        from mistral_common.tokens.tokenizers.tekken import Tekkenizer  # noqa: F401

        tekken = True
    except ImportError:
        tekken = False

    def make(seed: int = 0, fmt: str = "hf", small_windows: bool = False, tokenizer_json: bool = False) -> Path:
        key = (seed, fmt, small_windows, tokenizer_json)
        if key not in cache:
            out = ckpt_root / f"tiny-{fmt}-s{seed}-{'sw' if small_windows else 'lw'}{'-tj' if tokenizer_json else ''}"
            cache[key] = write_tiny_checkpoint(out, fmt=fmt, seed=seed, small_windows=small_windows,
                                               tokenizer_json=tokenizer_json or not tekken, tekken=tekken)
        return cache[key]

    return make


def padded_for_offline(audio: np.ndarray, delay_tokens: int, left_tokens: int = 32, spt: int = 1280) -> np.ndarray:
    """The reference's offline padding: left pad, zeros to a whole token, then delay+11 tokens."""
    right = (-len(audio)) % spt + (delay_tokens + 11) * spt
    return np.concatenate([np.zeros(left_tokens * spt, np.float32), audio, np.zeros(right, np.float32)])


def run_under_triton_interpreter(script: Path) -> dict[str, str]:
    """Run a test module as a script with TRITON_INTERPRET=1 (it must be set before triton is
    imported, so it cannot be switched on inside this process); the script prints one line
    `RESULTS {json}` mapping check names to "ok" or a traceback."""
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(script)], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS ")]
    if proc.returncode != 0 or not lines:
        pytest.fail(f"interpreter subprocess failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return json.loads(lines[-1][len("RESULTS "):])


def frame_db(audio: np.ndarray) -> np.ndarray:
    """Level of every 10 ms frame, in dB below the loudest."""
    frames = audio[: audio.size // 160 * 160].reshape(-1, 160).astype(np.float64)
    db = 10 * np.log10((frames ** 2).mean(axis=1) + 1e-12)
    return db - db.max()


def speech_bounds(audio: np.ndarray) -> tuple[float, float]:
    """Start of the first and end of the last 10 ms frame above -40 dB of the loudest, in seconds."""
    loud = np.flatnonzero(frame_db(audio) > -40)
    return loud[0] * 0.01, (loud[-1] + 1) * 0.01


def refusal_without_packages(hidden: tuple[str, ...], module: str, error: str, synth: str, available: str) -> str:
    """In a fresh interpreter where the modules `hidden` cannot be imported: import the training pipeline's
    voices, synth and presynth modules (a machine without a TTS engine's packages must), check that
    `module.available()` says no, construct `module.synth()` and return what its `error` said."""
    code = ("import sys\n"
            f"for m in {hidden!r}:\n"
            "    sys.modules[m] = None\n"
            "import realtime.train.presynth, realtime.train.synth, realtime.train.voices\n"
            f"from {module} import {error}, {synth}, {available}\n"
            f"assert not {available}()\n"
            "try:\n"
            f"    {synth}()\n"
            f"except {error} as e:\n"
            "    print('refused:', e)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    return run.stdout


def report_interpreter_checks(checks: dict[str, Callable[[], None]]) -> None:
    """The script side of `run_under_triton_interpreter`: run each named check and print the RESULTS
    line ("ok", or the check's traceback, which the parent test shows)."""
    results = {}
    for name, check in checks.items():
        try:
            check()
            results[name] = "ok"
        except Exception:  # noqa: BLE001 - any failure goes back to the parent test as its traceback
            results[name] = traceback.format_exc()
    print("RESULTS " + json.dumps(results))


@pytest.fixture(scope="module")
def interpreter_results(request: pytest.FixtureRequest) -> dict[str, str]:
    """The calling test module's `RESULTS` line, from running that module under the Triton interpreter."""
    return run_under_triton_interpreter(Path(request.module.__file__).resolve())
