"""WER of a model folder through the shipped decode path (`realtime.session.transcribe`, CPU, fp32).

    python -m realtime.train.evaluate --model DIR --data SHARDS [--real DIR] [--delays 160 480 960 2400]
        [--per-voice 60] [--sweep-per-voice 20] [--workers N] [--json OUT]

Reports, with jiwer: WER per held-out voice at every delay (all `--per-voice` utterances at the
default 480 ms, `--sweep-per-voice` of them at the other delays), WER of seen voices on held-out
sentences (text generalisation alone), and WER on the real recordings (pocketsphinx-testdata:
LibriVox read speech, card names, digits). Work is spread over CPU processes, one torch thread each.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import re
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor, TimeoutError, as_completed
from dataclasses import dataclass
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

POCKETSPHINX_DATA = Path("/usr/share/pocketsphinx/test/data")


@dataclass(frozen=True)
class EvalItem:
    group: str  # "heldout" | "seen" | "real"
    voice: str
    delay_ms: int
    ref: str
    audio: np.ndarray
    # one of the utterances that every delay decodes (`sweep_per_voice`; all real recordings): the default delay's
    # figure over these alone is the one to compare with the other delays' (`sweep_480` in the result)
    swept: bool = False


def normalize_text(text: str) -> str:
    """Lowercase words of letters and apostrophes, numbers spelled out: the model's own alphabet."""
    from .text_corpus import normalize

    return normalize(text)


# -- real recordings ------------------------------------------------------------------------------
def _transcripts(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"\s*(?:<s>)?(.*?)(?:</s>)?\s*\(([^)]+)\)\s*$", line)
        if m:
            out[m.group(2).strip()] = m.group(1).strip()
    return out


def _read_wav16k(path: Path) -> np.ndarray:
    """16-bit mono 16 kHz PCM WAV (all of pocketsphinx-testdata) with the stdlib: the training machine
    has no soundfile; anything else goes through `load_audio_file`."""
    import wave

    with wave.open(str(path)) as w:
        if (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 16000):
            return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768.0
    from ..audio import load_audio_file

    return load_audio_file(path)


def real_recordings(root: Path = POCKETSPHINX_DATA) -> list[tuple[str, str, np.ndarray]]:
    """(name, transcript, 16 kHz audio) of the pocketsphinx-testdata recordings with known text."""
    items: list[tuple[str, str, np.ndarray]] = []
    for sub, tfile in (("librivox", "transcription"), ("cards", "cards.transcription")):
        d = root / sub
        if not (d / tfile).exists():
            continue
        for fid, text in sorted(_transcripts(d / tfile).items()):
            wav = d / f"{Path(fid).name}.wav"
            if wav.exists():
                items.append((f"{sub}/{wav.stem}", text, _read_wav16k(wav)))
    for raw, text in (("goforward.raw", "go forward ten meters"), ("tidigits/dhd.2934z.raw", "two nine three four zero")):
        if (root / raw).exists():
            pcm = np.fromfile(root / raw, dtype="<i2").astype(np.float32) / 32768.0
            items.append((raw, text, pcm))
    return items


# -- workers ---------------------------------------------------------------------------------------
_MODEL = None


def _init_worker(model_dir: str) -> None:
    import torch

    from ..model_store import load_model_and_tokenizer

    torch.set_num_threads(1)
    global _MODEL
    _MODEL = load_model_and_tokenizer(model_dir)


def _decode(item: EvalItem) -> str:
    from ..session import transcribe

    model, tok = _MODEL
    return transcribe(model, tok, item.audio, delay_ms=item.delay_ms).text


EVAL_SHARD_NAME = re.compile(r"(^|-)(heldout|seen)-\d")


def build_items(data: Path, *, delays: list[int], per_voice: int, sweep_per_voice: int, real_dir: Path | None,
                default_delay: int = 480) -> list[EvalItem]:
    from .synth import Shard

    shards: list[tuple[bool, Shard]] = []
    for path in sorted(data.glob("*.npz")):
        # the device's own heldout-NN / seen-NN shards, and carried ones renamed by presynth merge
        # (ev-heldout-NN); the name spares loading every training shard, the split decides
        if not EVAL_SHARD_NAME.search(path.name):
            continue
        shard = Shard.load(path)
        if shard.split in ("heldout", "seen"):
            shards.append((not path.name.startswith(("heldout-", "seen-")), shard))
    # A voice with carried shards (`presynth pack-eval`: the CPU's own draw for that voice) is scored on
    # them alone, so the device's figure for it is the CPU's, on the same utterances, not a mix of two draws.
    carried_voices = {shard.voice for carried, shard in shards if carried}
    items: list[EvalItem] = []
    for carried, shard in shards:
        if shard.voice in carried_voices and not carried:
            continue
        for i, u in enumerate(shard.utterances[:per_voice]):
            for d in delays:
                if d == default_delay or i < sweep_per_voice:
                    items.append(EvalItem(shard.split, shard.voice, d, u.text, u.audio, i < sweep_per_voice))
    if real_dir is not None:
        for name, text, audio in real_recordings(real_dir):
            for d in delays:
                items.append(EvalItem("real", name.split("/")[0], d, normalize_text(text), audio, True))
    return items


def score(items: list[EvalItem], hyps: list[str]) -> dict:
    import jiwer

    groups: dict[tuple[str, str, int], tuple[list[str], list[str]]] = defaultdict(lambda: ([], []))
    for it, h in zip(items, hyps):
        for key in ((it.group, it.voice, it.delay_ms), (it.group, "*", it.delay_ms)):
            groups[key][0].append(it.ref)
            groups[key][1].append(normalize_text(h) or "")
    out: dict = {}
    for (group, voice, d), (refs, hs) in sorted(groups.items()):
        wer = jiwer.wer(refs, [h if h else "<empty>" for h in hs])
        out.setdefault(group, {}).setdefault(voice, {})[str(d)] = {"wer": round(100 * wer, 2), "n": len(refs)}
    return out


def evaluate(model_dir: Path, data: Path, *, delays: list[int], per_voice: int, sweep_per_voice: int,
             real_dir: Path | None, workers: int, deadline: float | None = None) -> dict:
    """Decode every item (or, with a wall-clock `deadline`, those done by then: the default delay
    of every group first, then the delay sweep, so a cut-off run still scores every voice)."""
    items = build_items(data, delays=delays, per_voice=per_voice, sweep_per_voice=sweep_per_voice,
                        real_dir=real_dir)
    return decode_and_score(model_dir, items, workers=workers, deadline=deadline)


def decode_items(model_dir: Path, items: list[EvalItem], *, workers: int, deadline: float | None = None
                 ) -> dict[int, str]:
    """Decode `items` with the model in `model_dir` on `workers` processes: {item index: raw hypothesis}, the longest
    480 ms items first (see `evaluate` for `deadline`: with one, the items not done by then are left out)."""
    order = sorted(range(len(items)), key=lambda i: (items[i].delay_ms != 480, -items[i].audio.size))
    t0 = time.time()
    hyps: dict[int, str] = {}
    # spawned workers: the caller may hold a CUDA context (gpu_run), which must not be forked
    ctx = mp.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                             initargs=(str(model_dir),)) as pool:
        futures = {pool.submit(_decode, items[i]): i for i in order}
        try:
            for n, fut in enumerate(as_completed(futures, timeout=None if deadline is None
                                                 else max(1.0, deadline - time.time())), 1):
                hyps[futures[fut]] = fut.result()
                if n % 50 == 0 or n == len(items):
                    print(f"\reval: {n}/{len(items)} decoded, {time.time() - t0:.0f} s", end="", file=sys.stderr,
                          flush=True)
        except TimeoutError:
            logger.warning("evaluation deadline: %d of %d items decoded", len(hyps), len(items))
            for fut in futures:
                fut.cancel()
    print(file=sys.stderr)
    return hyps


def decode_and_score(model_dir: Path, items: list[EvalItem], *, workers: int, deadline: float | None = None
                     ) -> dict:
    """Decode `items` with the model in `model_dir` on `workers` processes and score them (`score`), plus
    the decode's size and time and up to 40 examples at 480 ms (see `evaluate` for `deadline`)."""
    t0 = time.time()
    hyps = decode_items(model_dir, items, workers=workers, deadline=deadline)
    done = sorted(hyps)
    result = score([items[i] for i in done], [hyps[i] for i in done])
    if any(items[i].delay_ms != 480 for i in done):
        # the other delays decode only the first `sweep_per_voice` utterances of a voice, which may be harder or
        # easier than its whole draw: 480 ms on exactly those utterances is the figure to set beside them
        swept = [i for i in done if items[i].delay_ms == 480 and items[i].swept]
        result["sweep_480"] = score([items[i] for i in swept], [hyps[i] for i in swept])
    audio_s = sum(items[i].audio.size for i in done) / 16000
    result["decode"] = {"items": len(done), "planned": len(items), "audio_s": round(audio_s, 1),
                        "wall_s": round(time.time() - t0, 1), "workers": workers}
    ex = [i for i in done if items[i].delay_ms == 480]
    result["examples"] = [{"group": items[i].group, "voice": items[i].voice, "ref": items[i].ref, "hyp": hyps[i]}
                          for i in ex[:: max(1, len(ex) // 40)][:40]]
    return result


def summary_lines(result: dict) -> list[str]:
    lines = []
    swept = result.get("sweep_480", {})
    for group in ("heldout", "seen", "real"):
        for voice, by_delay in sorted(result.get(group, {}).items()):
            cells = ", ".join(f"{d} ms {v['wer']:.1f}% (n={v['n']})" for d, v in sorted(by_delay.items(),
                                                                                     key=lambda x: int(x[0])))
            same = swept.get(group, {}).get(voice, {}).get("480")
            if same is not None and same["n"] != by_delay.get("480", {}).get("n"):
                cells += f"; 480 ms on the other delays' utterances {same['wer']:.1f}% (n={same['n']})"
            lines.append(f"{group:8s} {voice:28s} {cells}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True, help="shard folder with heldout-*/seen-* shards")
    ap.add_argument("--real", default=str(POCKETSPHINX_DATA), help="pocketsphinx test data folder ('' to skip)")
    ap.add_argument("--delays", type=int, nargs="+", default=[160, 480, 960, 2400])
    ap.add_argument("--per-voice", type=int, default=60)
    ap.add_argument("--sweep-per-voice", type=int, default=20)
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    real = Path(args.real) if args.real and Path(args.real).exists() else None
    result = evaluate(Path(args.model), Path(args.data), delays=args.delays, per_voice=args.per_voice,
                      sweep_per_voice=args.sweep_per_voice, real_dir=real, workers=args.workers)
    for line in summary_lines(result):
        logger.info("%s", line)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
