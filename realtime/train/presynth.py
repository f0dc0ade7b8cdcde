"""Training speech synthesised here that travels to the training machine as Opus instead of its voices.

    python -m realtime.train.presynth pack --corpus .train_carry/corpus.tsv.gz --out .train_carry/presynth \
        [--voices mb-us1 mb-us2 mb-ro1-en ...] [--hours 3.5] [--sentences-per-shard 10] [--seed 11]
    python -m realtime.train.presynth pack-eval --corpus .train_carry/corpus.tsv.gz --out DIR \
        --voices mb-us3 mb-en1 [--seed 8] [--per-voice 40]
    python -m realtime.train.presynth merge --out .train_carry/presynth pre-=DIR_A rh-=DIR_B ev-=DIR ... \
        [--max-mb 32.4 --trim pre- --trim-voices espeak:]

A training call carries at most 64 MiB with the repository. An mbrola diphone database is 3-8 MB
even compressed, so a carry brings about six of them; the same room holds hours of Opus speech from
all seventeen training mbrola speakers. `pack` synthesises training shards here (training voices,
training sentences: the same `plan_tasks` as the device, held-out voices never) and stores each
shard with its audio as OGG Opus (16 kHz, ~17 kbps at the default level; the sample count is kept
exactly, so the word times stay valid). On the training machine `gpu_run` calls `unpack`, which
decodes them into ordinary shards beside the ones synthesised there. The StreamBatcher draws shards
uniformly unless a run sets `--voice-share` (data.BatchConfig), so by default the shard size
(`--sentences-per-shard`) sets these voices' share of the batches.
Decoding needs the `soundfile` wheel (with its bundled libsndfile) in the carry's wheels. The English
entries of `mbrola_en.py` live in a private espeak-ng data folder, which `pack` builds for its workers
when it is asked for one of those voices.
`pack-eval` packs the evaluation shards of held-out voices whose engine data the call cannot carry
(the mbrola speakers us3 and en1): exactly the set `benchmarks/rescore_heldout.py --seed N` scores on
the CPU for those voices, split "heldout", so the device's own evaluation and validation cover all
five held-out voices while no trainer ever reads them (a Corpus reads only its splits). It packs the
other held-out voices as well: the device's evaluation then scores every voice that came carried on the
carried utterances alone (`evaluate.build_items`), so its figure is measured on the CPU's own draw.
`merge` joins several packed folders (made with different voices or seeds) into the carry's one folder,
renaming each part's shards so that none collide, and can drop shards of one part to fit the carry.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from .festival import festival_available
from .kokoro import kokoro_available
from .kokoro_js import voices_present
from .mbrola_en import EXTRA_NAMES, english_mbrola_data
from .pico import pico_available
from .piper import piper_available
from .rhvoice import rhvoice_available
from .synth import RATE, RawShard, Task, plan_tasks, synthesize
from .text_corpus import read_corpus
from .voices import VoiceSpec, available, catalogue

logger = logging.getLogger(__name__)

SUFFIX = ".opus.npz"


def encode_opus(audio: np.ndarray, level: float) -> bytes:
    import soundfile as sf

    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", RATE, 1, format="OGG", subtype="OPUS", compression_level=level) as f:
        f.write(audio)
    return buf.getvalue()


def decode_opus(data: bytes) -> np.ndarray:
    import soundfile as sf

    audio, rate = sf.read(io.BytesIO(data), dtype="int16")
    if rate != RATE:
        raise ValueError(f"packed shard at {rate} Hz, expected {RATE}")
    return audio


def pack_shard(src: Path, dst: Path, level: float) -> tuple[int, int]:
    """One synthesised shard -> `dst` (Opus audio, the rest as stored); (samples, bytes written)."""
    raw = RawShard.load(src)
    meta = {"voice": raw.voice, "speaker": raw.speaker, "split": raw.split, "texts": raw.texts}
    np.savez(dst, opus=np.frombuffer(encode_opus(raw.audio, level), np.uint8), offsets=raw.offsets,
             word_times=raw.word_times, word_offsets=raw.word_offsets,
             meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))
    return int(raw.audio.size), dst.stat().st_size


def _meta(z: np.lib.npyio.NpzFile) -> dict:
    """A packed shard's voice, speaker, split and texts (written by pack_shard)."""
    return json.loads(z["meta"].tobytes().decode())


def _audio(z: np.lib.npyio.NpzFile, src: Path) -> np.ndarray:
    """A packed shard's int16 audio, checked against its utterance offsets."""
    audio = decode_opus(z["opus"].tobytes())
    if audio.size != int(z["offsets"][-1]):  # Opus keeps the sample count; never trust a shifted shard
        raise ValueError(f"{src.name}: decoded {audio.size} samples, the offsets say {int(z['offsets'][-1])}")
    return audio


def read_packed_meta(src: Path) -> dict:
    """A packed shard's voice, speaker, split and texts, without decoding its audio."""
    with np.load(src) as z:
        return _meta(z)


def read_packed_audio(src: Path) -> tuple[np.ndarray, dict]:
    """A packed shard's audio as float32 in [-1, 1) at `RATE`, and its voice, speaker, split and texts: its
    utterances back to back, one voice (what `speculative.train` distils a drafter on)."""
    with np.load(src) as z:
        return _audio(z, src).astype(np.float32) / 32768.0, _meta(z)


def unpack_shard(src: Path, dst_dir: Path, *, name: str | None = None, split: str | None = None) -> float:
    """A packed shard -> an ordinary shard in `dst_dir` (as `name`, by default the packed name without its suffix;
    `split` relabels it, e.g. "heldout" for evaluate() to score a training shard); returns its seconds of audio."""
    with np.load(src) as z:
        meta = _meta(z)
        raw = RawShard(meta["voice"], meta["speaker"], split or meta["split"], meta["texts"],
                       _audio(z, src), z["offsets"], z["word_times"], z["word_offsets"])
    raw.save(dst_dir / ((name or src.name[: -len(SUFFIX)]) + ".npz"))
    return raw.audio.size / RATE


def unpack(src_dir: Path, dst_dir: Path, workers: int) -> dict[str, float]:
    """Every packed shard of `src_dir` into `dst_dir` (on a process pool)."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    files = sorted(src_dir.glob("*" + SUFFIX))
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool:
        seconds = list(pool.map(unpack_shard, files, [dst_dir] * len(files)))
    return {"shards": len(files), "hours": sum(seconds) / 3600}


def _select(names: list[str], pool: list[VoiceSpec], what: str) -> list[VoiceSpec]:
    """Voices of `pool` by base name ("slt": every engine's slt) or by engine:base key ("rhvoice:slt");
    any other name stops the command."""
    wanted = [v for v in pool if v.key in names or v.base in names]
    missing = sorted(set(names) - {v.base for v in wanted} - {v.key for v in wanted})
    if missing:
        raise SystemExit(f"not {what} of the catalogue: {missing}")
    return wanted


def select_training_voices(names: list[str]) -> list[VoiceSpec]:
    """Training voices by name or key; a name that is no training voice (a held-out one, say) stops the
    pack: held-out speakers never leave here as training audio."""
    return _select(names, catalogue()[0], "training voices")


def select_heldout_voices(names: list[str]) -> list[VoiceSpec]:
    """Held-out voices by name or key; a training voice stops `pack-eval`."""
    return _select(names, catalogue()[1], "held-out voices")


@contextlib.contextmanager
def _english_mbrola_data_in_use(folder: Path) -> Iterator[None]:
    """While inside: this process and the synthesis workers it starts use a data folder with
    mbrola_en.py's entries (made at `folder`); the environment is restored on the way out."""
    from .espeak import default_library

    keys = ("STREAMSCRIBE_ESPEAK_LIB", "STREAMSCRIBE_ESPEAK_DATA")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ["STREAMSCRIBE_ESPEAK_LIB"] = default_library()[0]
    os.environ["STREAMSCRIBE_ESPEAK_DATA"] = str(english_mbrola_data(folder))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def heldout_eval_tasks(corpus: Path, voices: list[VoiceSpec], per_voice: int, seed: int) -> list[Task]:
    """The held-out tasks of `voices` in the plan that `rescore_heldout.py --seed N` scores on the CPU
    (same sentences, same synthesis seeds), named pre-heldout-NN. gpu_run's own plan differs: it
    leaves out the voices the call cannot synthesise, which shifts the others' draws."""
    train_v, held_v = catalogue()
    keys = {v.key for v in voices}
    return [dataclasses.replace(t, name="pre-" + t.name)
            for t in plan_tasks(read_corpus(corpus), train_v, held_v, train_hours=0, eval_per_voice=per_voice,
                                seed=seed)
            if t.split == "heldout" and t.voice.key in keys]


def pack(args: argparse.Namespace) -> int:
    evaluation = args.cmd == "pack-eval"
    wanted = select_heldout_voices(args.voices) if evaluation else select_training_voices(args.voices)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workers = args.workers or os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        if any(v.base in EXTRA_NAMES for v in wanted) and not os.environ.get("STREAMSCRIBE_ESPEAK_DATA"):
            stack.enter_context(_english_mbrola_data_in_use(Path(tmp) / "espeak-ng-data"))
        voices = available(wanted, espeak=True, flite=True, festival=festival_available(), rhvoice=rhvoice_available(),
                           pico=pico_available(), piper=piper_available(), kokoro=kokoro_available(),
                           kokoro_js=kokoro_available() and voices_present())
        if len(voices) != len(wanted):
            raise SystemExit(f"voices not installed here: {sorted({v.base for v in wanted} - {v.base for v in voices})}")
        if evaluation:
            tasks = heldout_eval_tasks(Path(args.corpus), voices, args.per_voice, args.seed)
        else:
            tasks = [dataclasses.replace(t, name="pre-" + t.name)
                     for t in plan_tasks(read_corpus(Path(args.corpus)), voices, [], train_hours=args.hours,
                                         eval_per_voice=0, seed=args.seed, per_task=args.sentences_per_shard)
                     if t.split == "train"]
        shards = Path(tmp) / "shards"
        # a deadline (the device's call limit) stops submitting shards; those done are packed as usual
        limit = getattr(args, "max_seconds", None)  # pack-eval has none
        deadline = None if limit is None else time.time() + limit
        stats = synthesize(tasks, shards, workers, deadline=deadline)
        files = sorted(shards.glob("*.npz"))
        with ProcessPoolExecutor(max_workers=workers) as pool:
            sizes = list(pool.map(pack_shard, files, [out / (f.stem + SUFFIX) for f in files],
                                  [args.level] * len(files)))
    samples, size = sum(s for s, _ in sizes), sum(b for _, b in sizes)
    index = {"voices": [v.key for v in voices], "shards": len(files), "hours": samples / RATE / 3600,
             "bytes": size, "kbps": size * 8 / max(samples / RATE, 1e-9) / 1000, "opus_level": args.level,
             "seed": args.seed, "synthesis": stats}
    (out / "index.json").write_text(json.dumps(index, indent=2))
    logger.info("packed %d shards, %.2f h, %.1f MB (%.1f kbps) into %s", len(files), index["hours"], size / 1e6,
                index["kbps"], out)
    return 0


def _voice_of(path: Path) -> str:
    return read_packed_meta(path)["voice"]


def merge(dst: Path, parts: list[tuple[str, Path]], max_bytes: int | None = None, trim: str | None = None,
          trim_voices: str = "", seed: int = 0) -> dict:
    """Packed folders (each one `pack`'s output) into one folder for a carry. Part `PREFIX=DIR` has its
    shards renamed from `pre-` to `PREFIX` (names must not collide: unpack writes shards by name), and its
    index.json kept under "parts". With `max_bytes`, shards of the part `trim` whose voice starts with
    `trim_voices` are dropped at random until the folder fits; how many is written down, never silent."""
    dst.mkdir(parents=True, exist_ok=True)
    if any(dst.iterdir()):
        raise SystemExit(f"{dst} is not empty")
    index: dict = {"parts": {}}
    for prefix, src in parts:
        if prefix in index["parts"]:
            raise SystemExit(f"prefix {prefix!r} given twice")
        files = sorted(src.glob("pre-*" + SUFFIX))
        if not files:
            raise SystemExit(f"{src}: no packed shards (pre-*{SUFFIX})")
        for f in files:
            shutil.copyfile(f, dst / (prefix + f.name[len("pre-"):]))
        index["parts"][prefix] = json.loads((src / "index.json").read_text()) if (src / "index.json").exists() else {}
        index["parts"][prefix]["merged_shards"] = len(files)
    total = sum(f.stat().st_size for f in dst.glob("*" + SUFFIX))
    if max_bytes is not None and total > max_bytes:
        if trim is None or trim not in index["parts"]:
            raise SystemExit(f"{total} bytes > {max_bytes} and no part to trim (--trim PREFIX)")
        pool = [f for f in sorted(dst.glob(trim + "*" + SUFFIX)) if _voice_of(f).startswith(trim_voices)]
        np.random.default_rng(seed).shuffle(pool)
        dropped = 0
        while total > max_bytes and pool:
            f = pool.pop()
            total -= f.stat().st_size
            f.unlink()
            dropped += 1
        if total > max_bytes:
            raise SystemExit(f"still {total} bytes > {max_bytes} after dropping every shard of {trim!r}")
        index["parts"][trim]["dropped_to_fit"] = dropped
        logger.info("dropped %d shards of %s (voices %s*) to fit %d bytes", dropped, trim, trim_voices, max_bytes)
    index["shards"], index["bytes"] = len(list(dst.glob("*" + SUFFIX))), total
    (dst / "index.json").write_text(json.dumps(index, indent=2))
    return {"shards": index["shards"], "bytes": total}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--corpus", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--voices", nargs="+", default=None,
                   help="catalogue base names or engine:base keys (default: every mbrola voice)")
    p.add_argument("--hours", type=float, default=3.5)
    p.add_argument("--sentences-per-shard", type=int, default=10)
    p.add_argument("--level", type=float, default=0.95, help="soundfile's Opus compression level (0-1)")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--max-seconds", type=float, default=None,
                   help="stop starting shards after this long and pack those done (a device call's time limit)")
    e = sub.add_parser("pack-eval", help="held-out voices' evaluation shards (split heldout, never trained on)")
    e.add_argument("--corpus", required=True)
    e.add_argument("--out", required=True)
    e.add_argument("--voices", nargs="+", required=True, help="held-out base names or engine:base keys")
    e.add_argument("--per-voice", type=int, default=40, help="utterances per voice (gpu_run's --eval-per-voice)")
    e.add_argument("--seed", type=int, default=8, help="the evaluation plan's seed (rescore_heldout.py --seed)")
    e.add_argument("--level", type=float, default=0.95, help="soundfile's Opus compression level (0-1)")
    e.add_argument("--workers", type=int, default=0)
    u = sub.add_parser("unpack")
    u.add_argument("--src", required=True)
    u.add_argument("--dst", required=True)
    u.add_argument("--workers", type=int, default=0)
    m = sub.add_parser("merge", help="packed folders into one carry folder (PREFIX=DIR ...)")
    m.add_argument("--out", required=True)
    m.add_argument("parts", nargs="+", help="PREFIX=DIR: DIR's pre-* shards renamed to PREFIX*")
    m.add_argument("--max-mb", type=float, default=None, help="trim the --trim part to fit this many MB")
    m.add_argument("--trim", default=None, help="the PREFIX whose shards may be dropped")
    m.add_argument("--trim-voices", default="", help="only shards whose voice key starts with this")
    m.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    if args.cmd == "merge":
        parts = []
        for item in args.parts:
            prefix, sep, folder = item.partition("=")
            if not sep or not prefix or not folder:
                ap.error(f"a part is PREFIX=DIR, not {item!r}")
            parts.append((prefix, Path(folder)))
        max_bytes = None if args.max_mb is None else int(args.max_mb * 1e6)
        logger.info("%s", merge(Path(args.out), parts, max_bytes, args.trim, args.trim_voices, args.seed))
        return 0
    if args.cmd == "unpack":
        logger.info("%s", unpack(Path(args.src), Path(args.dst), args.workers or os.cpu_count() or 1))
        return 0
    if args.cmd == "pack" and args.voices is None:
        args.voices = [v.base for v in catalogue()[0] if v.is_mbrola]
    return pack(args)


if __name__ == "__main__":
    raise SystemExit(main())
