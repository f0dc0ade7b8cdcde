"""Corpus synthesis: tasks of (voice, sentences) -> shards of 16 kHz audio with word times.

    python -m realtime.train.synth --corpus corpus.tsv.gz --out DIR [--hours 2] [--workers N]

A shard (`<name>.npz`, written atomically, so a trainer may read the folder while synthesis runs)
holds one voice's utterances: int16 audio concatenated with offsets, each input word's start/end
in seconds, the texts, and the voice and split. Each utterance draws its own speed and pitch
(engine duration control, so the word times stay exact); noise, reverb and band limits are added
later, at batch time (`augment.py`), so one shard serves many augmentations.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .targets import TimedWord
from .text_corpus import Sentence, read_corpus
from .voices import VoiceSpec, available, catalogue

logger = logging.getLogger(__name__)

RATE = 16000


@dataclass
class Utterance:
    text: str
    audio: np.ndarray  # float32, 16 kHz
    words: list[TimedWord]


@dataclass
class Shard:
    voice: str
    speaker: str
    split: str  # "train" (training voices, train sentences) | "heldout" | "seen" (train voices, test sentences)
    utterances: list[Utterance] = field(default_factory=list)

    def save(self, path: Path) -> None:
        audio = [np.clip(u.audio * 32767.0, -32768, 32767).astype(np.int16) for u in self.utterances]
        offsets = np.cumsum([0] + [a.size for a in audio]).astype(np.int64)
        times = np.array([[w.start, w.end] for u in self.utterances for w in u.words], np.float32).reshape(-1, 2)
        woff = np.cumsum([0] + [len(u.words) for u in self.utterances]).astype(np.int64)
        RawShard(self.voice, self.speaker, self.split, [u.text for u in self.utterances],
                 np.concatenate(audio) if audio else np.zeros(0, np.int16), offsets, times, woff).save(path)

    @staticmethod
    def load(path: Path) -> Shard:
        raw = RawShard.load(path)
        shard = Shard(raw.voice, raw.speaker, raw.split)
        for i, text in enumerate(raw.texts):
            a = raw.audio[raw.offsets[i]:raw.offsets[i + 1]].astype(np.float32) / 32768.0
            shard.utterances.append(Utterance(text, a, raw.words(i)))
        return shard


@dataclass
class RawShard:
    """A shard as stored: int16 audio of all utterances with offsets (what the trainer keeps)."""

    voice: str
    speaker: str
    split: str
    texts: list[str]
    audio: np.ndarray  # int16
    offsets: np.ndarray  # len(texts) + 1
    word_times: np.ndarray  # [n_words, 2] seconds
    word_offsets: np.ndarray  # len(texts) + 1

    def words(self, i: int) -> list[TimedWord]:
        times = self.word_times[self.word_offsets[i]:self.word_offsets[i + 1]]
        return [TimedWord(w, float(s), float(e)) for w, (s, e) in zip(self.texts[i].split(), times)]

    def save(self, path: Path) -> None:
        """Written atomically (a trainer may be reading the folder)."""
        meta = {"voice": self.voice, "speaker": self.speaker, "split": self.split, "texts": self.texts}
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(tmp, audio=self.audio, offsets=self.offsets, word_times=self.word_times,
                 word_offsets=self.word_offsets, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))
        os.replace(tmp, path)

    @staticmethod
    def load(path: Path) -> RawShard:
        with np.load(path) as z:
            meta = json.loads(z["meta"].tobytes().decode())
            return RawShard(meta["voice"], meta["speaker"], meta["split"], meta["texts"], z["audio"], z["offsets"],
                            z["word_times"], z["word_offsets"])


@dataclass(frozen=True)
class Task:
    name: str
    voice: VoiceSpec
    split: str
    texts: tuple[str, ...]
    seed: int


# one synthesiser of each engine per worker process (the espeak library is process-global)
_ENGINES: dict[str, object] = {}


def engine_for(kind: str):  # -> EspeakSynth | FliteSynth | FestivalSynth | RHVoiceSynth | PicoSynth | PiperSynth | KokoroSynth
    if kind not in _ENGINES:
        if kind == "espeak":
            from .espeak import EspeakSynth

            _ENGINES[kind] = EspeakSynth()
        elif kind == "festival":
            from .festival import FestivalSynth

            _ENGINES[kind] = FestivalSynth()
        elif kind == "rhvoice":
            from .rhvoice import RHVoiceSynth

            _ENGINES[kind] = RHVoiceSynth()
        elif kind == "pico":
            from .pico import PicoSynth

            _ENGINES[kind] = PicoSynth()
        elif kind == "piper":
            from .piper import PiperSynth

            _ENGINES[kind] = PiperSynth()
        elif kind == "kokoro":
            from .kokoro import KokoroSynth

            _ENGINES[kind] = KokoroSynth()
        else:
            from .flite import FliteSynth

            _ENGINES[kind] = FliteSynth()
    return _ENGINES[kind]


def run_task(task: Task, out_dir: Path) -> tuple[str, int, float, int]:
    """Synthesise one task into `out_dir/<name>.npz`: (name, utterances, seconds of audio, failures)."""
    rng = np.random.default_rng(task.seed)
    engine = engine_for(task.voice.engine)
    shard = Shard(task.voice.key, task.voice.speaker, task.split)
    failures = 0
    for text in task.texts:
        words = text.split()
        try:
            audio, timed = engine.synthesize(task.voice.render(rng), words)
        except Exception as exc:  # noqa: BLE001 - one bad utterance (engine quirk) must not lose the shard
            failures += 1
            logger.debug("%s: skipped %r: %s", task.voice.key, text, exc)
            continue
        peak = float(np.abs(audio).max()) if audio.size else 0.0
        if peak < 1e-3 or not timed or timed[-1].end <= 0:
            failures += 1
            continue
        # engines differ wildly in level: normalise the peak (gain is re-drawn at batch time)
        shard.utterances.append(Utterance(text, (audio * (0.7 / peak)).astype(np.float32), timed))
    shard.save(out_dir / f"{task.name}.npz")
    secs = sum(u.audio.size for u in shard.utterances) / RATE
    return task.name, len(shard.utterances), secs, failures


def plan_tasks(sentences: list[Sentence], voices: list[VoiceSpec], heldout: list[VoiceSpec], *, train_hours: float,
               eval_per_voice: int, seed: int, per_task: int = 40, seconds_per_word: float = 0.34) -> list[Task]:
    """Evaluation tasks first (small), then training tasks cycling the train sentences; voices are
    drawn by weight. Training hours are estimated from word counts (0.34 s per word, measured)."""
    rng = np.random.default_rng(seed)
    train_text = [s.text for s in sentences if s.split == "train"]
    test_text = [s.text for s in sentences if s.split == "test"]
    tasks: list[Task] = []
    # held-out voices x test sentences, and a few seen voices x test sentences (speaker vs text effect)
    seen_eval = [v for v in voices if v.engine == "flite" or v.is_mbrola][:3]
    for split, group in (("heldout", heldout), ("seen", seen_eval)):
        for vi, v in enumerate(group):
            idx = rng.choice(len(test_text), size=min(eval_per_voice, len(test_text)), replace=False)
            tasks.append(Task(f"{split}-{vi:02d}", v, split, tuple(test_text[i] for i in idx), seed + 7919 * vi))
    weights = np.array([v.weight for v in voices], np.float64)
    weights /= weights.sum()
    order = rng.permutation(len(train_text))
    pos, budget, k = 0, train_hours * 3600.0, 0
    while budget > 0:
        texts = []
        for _ in range(per_task):
            if pos == len(order):
                order, pos = rng.permutation(len(train_text)), 0
            texts.append(train_text[order[pos]])
            pos += 1
        v = voices[int(rng.choice(len(voices), p=weights))]
        tasks.append(Task(f"train-{k:05d}", v, "train", tuple(texts), seed * 1_000_003 + k))
        budget -= sum(len(t.split()) for t in texts) * seconds_per_word
        k += 1
    return tasks


def synthesize(tasks: list[Task], out_dir: Path, workers: int, deadline: float | None = None) -> dict[str, float]:
    """Run tasks on a process pool (spawned: safe next to CUDA); stops submitting at `deadline`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    done, secs, fails, n_utt = 0, 0.0, 0, 0
    ctx = mp.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        pending = {}
        it = iter(tasks)
        for task in it:  # keep a bounded queue so a deadline stops the work promptly
            pending[pool.submit(run_task, task, out_dir)] = task
            if len(pending) >= 2 * workers:
                break
        while pending:
            if deadline is not None and time.time() >= deadline:
                # past the deadline, queued shards that no worker has started are dropped: only the running ones
                # finish (a device call's time limit; the queue holds two shards a worker)
                for queued in [f for f in pending if f.cancel()]:
                    pending.pop(queued)
                if not pending:
                    break
            fut = next(as_completed(pending))
            pending.pop(fut)
            try:
                _, n, s, f = fut.result()
                done, secs, fails, n_utt = done + 1, secs + s, fails + f, n_utt + n
            except Exception:
                logger.exception("synthesis task failed")
            if deadline is None or time.time() < deadline:
                nxt = next(it, None)
                if nxt is not None:
                    pending[pool.submit(run_task, nxt, out_dir)] = nxt
            if done % 20 == 0 or not pending:
                el = time.time() - t0
                print(f"\rsynth: {done}/{len(tasks)} shards, {n_utt} utts, {secs / 3600:.2f} h audio, "
                      f"{secs / max(el, 1e-9):.0f}x realtime, {fails} skipped", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    el = time.time() - t0
    return {"shards": done, "utterances": n_utt, "hours": secs / 3600, "wall_s": el, "failures": fails,
            "x_realtime": secs / max(el, 1e-9)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--hours", type=float, default=1.0, help="training audio to make (estimate)")
    ap.add_argument("--eval-per-voice", type=int, default=60)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-flite", action="store_true")
    ap.add_argument("--no-espeak", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    train_v, held_v = catalogue()
    train_v = available(train_v, espeak=not args.no_espeak, flite=not args.no_flite)
    held_v = available(held_v, espeak=not args.no_espeak, flite=not args.no_flite)
    logger.info("voices: %d training, %d held-out (%s)", len(train_v), len(held_v), ", ".join(v.key for v in held_v))
    tasks = plan_tasks(read_corpus(Path(args.corpus)), train_v, held_v, train_hours=args.hours,
                       eval_per_voice=args.eval_per_voice, seed=args.seed)
    stats = synthesize(tasks, Path(args.out), args.workers)
    stats["voices_train"] = [v.key for v in train_v]
    stats["voices_heldout"] = [v.key for v in held_v]
    (Path(args.out) / "synth_stats.json").write_text(json.dumps(stats, indent=2))
    logger.info("%s", json.dumps({k: v for k, v in stats.items() if not k.startswith("voices")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
