"""The whole training run in one command on the GPU machine: synthesise, train, evaluate, export.

    python -m realtime.train.gpu_run run --carry .train_carry --out $OUT [--minutes 8.5] [--size base-384]
    python -m realtime.train.gpu_run unpack --files FOLDER --to models/default     (afterwards, here)

`run` unpacks the carried engines (no system TTS needed), starts corpus synthesis on the CPU cores
the trainers leave free, in a background process, trains data-parallel on every GPU (`--gpus`; one
process per GPU, `realtime.train.distributed`) from the first shards on (the corpus grows while it
trains), stops training so that evaluation and export fit in `--minutes`, then evaluates the
exported model on held-out voices and real recordings with CPU workers. Every checkpoint also
exports the model into $OUT, so a run killed at its time limit still returns a model.

$OUT gets at most 8 files, none over 16 MiB (the limits of what comes back): the fp16 weights in
shards of < 15 MiB + their index, `model_rest.tar` (config.json, tokenizer.json, training.json),
`loss.png`, `metrics.json`, `run.log`. `unpack` rebuilds one ordinary model folder from them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .augment import AugmentConfig
from .regularize import check_dropout

if TYPE_CHECKING:
    from .voices import VoiceSpec

logger = logging.getLogger("realtime.train.gpu_run")

SHARD_BYTES = 15 * 2 ** 20
WORK = Path(os.environ.get("STREAMSCRIBE_WORK", "/tmp/streamscribe-train"))


def setup_engines(carry: Path, work: Path) -> dict[str, str]:
    """Unpack engines.tar.xz and point this process's children at it (PATH, LD_LIBRARY_PATH, ...)."""
    eng = work / "engines"
    if not eng.exists():
        with tarfile.open(carry / "engines.tar.xz") as t:
            t.extractall(work, filter="tar")  # keeps the executables' mode bits
    env = {
        "PATH": f"{eng / 'bin'}:{os.environ.get('PATH', '')}",
        "LD_LIBRARY_PATH": f"{eng / 'lib'}:{os.environ.get('LD_LIBRARY_PATH', '')}",
        "STREAMSCRIBE_ESPEAK_LIB": str(eng / "lib" / "libespeak-ng.so.1"),
        "STREAMSCRIBE_ESPEAK_DATA": str(eng / "espeak-ng-data"),
        "STREAMSCRIBE_FLITEW": str(eng / "bin" / "flitew"),
    }
    os.environ.update(env)  # spawned workers inherit it (the dynamic loader reads it at their start)
    return env


def install_mbrola_databases(src: Path, engines: Path, heldout_bases: set[str]) -> list[str]:
    """Put the diphone databases of `src` (files named after the database, `us1` or `us1.xz`) where the carried
    espeak-ng looks for them, so this call synthesises those speakers itself with fresh sentences each time,
    instead of replaying the few minutes of pre-synthesised speech a carry has room for (the model had learned
    those utterances, not the speakers: fifty-second session). A held-out speaker's database
    is refused, so that no training voice can ever be one. Returns the databases installed."""
    import lzma

    held = {b.removeprefix("mb-").split("-")[0] for b in heldout_bases if b.startswith("mb-")}
    dst = engines / "espeak-ng-data" / "mbrola"
    dst.mkdir(parents=True, exist_ok=True)
    files = sorted(f for f in src.iterdir() if f.is_file())
    names = [f.name.removesuffix(".xz") for f in files]
    refused = sorted(set(names) & held)
    if refused:
        raise ValueError(f"mbrola databases of held-out speakers in {src}: {refused}")
    for f, name in zip(files, names):
        if f.suffix == ".xz":
            with lzma.open(f) as fin, open(dst / name, "wb") as fout:
                shutil.copyfileobj(fin, fout)
        else:
            shutil.copy(f, dst / name)
    return names


def scale_mbrola_weights(voices: list[VoiceSpec], scale: float) -> list[VoiceSpec]:
    """The training voices with every mbrola voice's catalogue weight times `scale` (`--mbrola-weight`). The
    catalogue gives a diphone speaker 1.0-1.5 and all 390 formant voices 4.3 together, which was right while the
    diphone speakers came as a few carried minutes; synthesised here, 11 of them (11.7) took 60% of run 58's streams."""
    if not (math.isfinite(scale) and scale > 0.0):
        raise ValueError(f"--mbrola-weight wants a finite weight > 0, got {scale}")
    return [dataclasses.replace(v, weight=v.weight * scale) if v.is_mbrola else v for v in voices]


def install_wheels(carry: Path, work: Path) -> None:
    """jiwer (+ rapidfuzz) for the evaluation, from the carried Python 3.12 wheels, unless present."""
    try:
        import jiwer  # noqa: F401

        return
    except ImportError:
        pass
    wheels = sorted((carry / "wheels").glob("*.whl"))
    if not wheels:
        return
    site = work / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--target", str(site)] + [str(w) for w in wheels], check=True)
    sys.path.insert(0, str(site))
    os.environ["PYTHONPATH"] = f"{site}:{os.environ.get('PYTHONPATH', '')}"


def _probe(engine: str, voice: str) -> str:
    """Synthesise two words in a fresh process; '' when it works, else the error."""
    from .espeak import EspeakSynth, EspeakVoice
    from .flite import FliteSynth, FliteVoice

    try:
        if engine == "flite":
            audio, words = FliteSynth().synthesize(FliteVoice(voice), ["hello", "world"])
        else:
            audio, words = EspeakSynth().synthesize(EspeakVoice(voice), ["hello", "world"])
        return "" if audio.size > 8000 and len(words) == 2 else f"{audio.size} samples"
    except Exception as exc:  # noqa: BLE001 - reported, and the engine's voices are left out
        return repr(exc)


def probe_engines(mbrola_voice: str | None) -> dict[str, str]:
    """Each engine's error on a two-word test ('' = works); mbrola is tested with a voice the carry has."""
    ctx = mp.get_context("spawn")
    with ctx.Pool(3) as pool:
        checks = {"espeak": ("espeak", "en-us"), "flite": ("flite", "slt")}
        if mbrola_voice is not None:
            checks["mbrola"] = ("espeak", mbrola_voice)
        res = {k: pool.apply_async(_probe, v) for k, v in checks.items()}
        out = {k: r.get(timeout=120) for k, r in res.items()}
    if mbrola_voice is None:
        out["mbrola"] = "no mbrola voice file or no mbrola program here"
    return out


def _synth_process(tasks: list, out_dir: str, workers: int, deadline: float, stats_path: str) -> None:
    from .synth import synthesize

    # below the trainer: its single host thread feeds the GPU and must never wait for a core
    os.nice(10)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s synth %(message)s")
    stats = synthesize(tasks, Path(out_dir), workers, deadline=deadline)
    Path(stats_path).write_text(json.dumps(stats, indent=2))


def write_outputs(folder: Path, out: Path) -> None:
    """Model folder -> $OUT: weight shards + index as they are, the small files in one tar."""
    for old in out.glob("model-*.safetensors"):
        old.unlink()
    with tarfile.open(out / "model_rest.tar.tmp", "w") as t:
        for f in sorted(folder.iterdir()):
            if (f.name.startswith("model-") and f.suffix == ".safetensors") or f.name.endswith(".index.json"):
                shutil.copy(f, out / f.name)
            else:
                t.add(f, arcname=f.name)
    os.replace(out / "model_rest.tar.tmp", out / "model_rest.tar")


@dataclass
class OutHooks:
    """Rank 0's exports: after every checkpoint into $OUT (a run killed at its limit still returns
    the latest model, curves and numbers); at the end the final export for the evaluation."""

    out: str
    metrics: dict

    def on_checkpoint(self, tr) -> None:
        out = Path(self.out)
        write_outputs(tr.export(WORK / "export", SHARD_BYTES), out)
        shutil.copy(WORK / "run" / "loss.png", out / "loss.png")
        self.metrics["train"] = {"steps": tr.step, "train_minutes": tr.train_s / 60, "partial": True}
        (out / "metrics.json").write_text(json.dumps(self.metrics, indent=2))

    def on_end(self, tr) -> None:
        tr.export(WORK / "export", SHARD_BYTES)
        tr.plot()
        shutil.copy(WORK / "run" / "loss.png", Path(self.out) / "loss.png")
        h = tr.history
        stats = {"steps": tr.step, "train_minutes": tr.train_s / 60, "audio_hours_seen": tr.audio_seen_s / 3600,
                 "corpus_hours_rank0": tr.corpus.hours, "corpus_shards_rank0": len(tr.corpus.by_shard),
                 "stream_shares_rank0": tr.batcher.stream_shares(),  # the voice mix trained (--voice-share)
                 "final_loss": h["loss"][-1:], "val_loss": h["val_loss"][-3:], "val_text_acc": h["val_text_acc"][-3:]}
        (WORK / "train_stats.json").write_text(json.dumps(stats, indent=2))
        logger.info("streams by voice group, rank 0: %s", stats["stream_shares_rank0"])


def after_training_failure(gpus: int, seconds_left: float, finished: bool) -> str:
    """What a call does when data-parallel training raised: "evaluate" when training had finished
    (rank 0 exported; a failed check after it, e.g. replicas that differ, is reported with the
    results instead of throwing the evaluation away), "one_gpu" when a multi-GPU start failed (e.g.
    NCCL on a new machine) and enough time is left to train on one GPU, else "raise"."""
    if finished:
        return "evaluate"
    if gpus > 1 and seconds_left >= 180:
        return "one_gpu"
    return "raise"


def augment_config(args: argparse.Namespace) -> AugmentConfig:
    """The batches' augmentation from the command line. Called first in `run`, so a bad value (which
    AugmentConfig refuses) fails before the call spends minutes synthesising."""
    return AugmentConfig(p_eq=args.p_eq, warp=tuple(args.warp), p_warp=args.p_warp, freq_masks=args.freq_masks,
                         freq_mask_bins=args.freq_mask_bins)


def weights_with_overrides(train_v: list, overrides: list[str], voice_share: float) -> tuple[tuple[str, float], ...]:
    """The voice weights of BatchConfig.voice_share: each training voice's catalogue weight, replaced by
    `--voice-weight KEY=W` for KEY, a voice key ("pico:en-US") or an engine prefix ending in ":" ("pico:")."""
    weights = {v.key: v.weight for v in train_v}
    if overrides and voice_share <= 0.0:
        raise ValueError("--voice-weight only acts on the streams drawn by voice: give --voice-share > 0")
    for item in overrides:
        key, sep, value = item.partition("=")
        try:
            w = float(value) if sep else math.nan
        except ValueError:
            w = math.nan
        if not (math.isfinite(w) and w >= 0.0):
            raise ValueError(f"--voice-weight wants KEY=W with a finite W >= 0, got {item!r}")
        hit = [k for k in weights if k == key or (key.endswith(":") and k.startswith(key))]
        if not hit:
            raise ValueError(f"--voice-weight {item!r}: no training voice is {key!r} (keys look like 'pico:en-US'; "
                             "an engine prefix ends in ':')")
        weights.update(dict.fromkeys(hit, w))
    if not sum(weights.values()) > 0.0:
        raise ValueError("--voice-weight leaves every training voice at weight 0")
    return tuple(sorted(weights.items()))


def run(args: argparse.Namespace) -> int:
    t_start = time.time()
    augment = augment_config(args)
    check_dropout(args.dropout)  # before any synthesis: a bad value would surface minutes into the call
    deadline = t_start + args.minutes * 60
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    carry = Path(args.carry)
    log_file = logging.FileHandler(out / "run.log")
    log_file.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logging.getLogger().addHandler(log_file)
    metrics: dict = {"args": vars(args)}
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "train_stats.json").unlink(missing_ok=True)  # written by this run's rank 0 at its end
    setup_engines(carry, WORK)
    install_wheels(carry, WORK)
    from .voices import VoiceSpec, available, catalogue, mbrola_probe_voice

    train_v, held_v = catalogue(args.unseen_formant_weight, args.accent_rewrite_weight)
    if args.mbrola_dbs:
        metrics["mbrola_dbs"] = install_mbrola_databases(Path(args.mbrola_dbs), WORK / "engines",
                                                         {v.base for v in held_v})
        logger.info("mbrola databases for synthesis here: %s", metrics["mbrola_dbs"])
    train_v = scale_mbrola_weights(train_v, args.mbrola_weight)
    # every training voice's catalogue weight, carried speech included (BatchConfig.voice_share)
    voice_weights = weights_with_overrides(train_v, args.voice_weight, args.voice_share)
    espeak_data = os.environ.get("STREAMSCRIBE_ESPEAK_DATA")
    probes = probe_engines(mbrola_probe_voice(train_v + held_v, espeak_data))
    metrics["engine_probes"] = probes
    logger.info("engine probes (empty = works): %s", probes)

    import torch

    torch.set_num_threads(1)  # the other cores synthesise; the trainers run in their own processes
    from .data import BatchConfig
    from .distributed import train_data_parallel
    from .synth import plan_tasks
    from .text_corpus import read_corpus
    from .train import TrainConfig

    cuda = torch.cuda.is_available()
    gpus = (args.gpus or torch.cuda.device_count()) if cuda else 1
    metrics["gpus"] = gpus

    def usable(voices: list[VoiceSpec]) -> list[VoiceSpec]:
        # a carry may bring only some mbrola voices (3-17 MB each of the 64 MiB a call carries)
        return available(voices, espeak=not probes["espeak"], flite=not probes["flite"], mbrola=not probes["mbrola"],
                         espeak_data=espeak_data)

    everyone = train_v + held_v
    train_v, held_v = usable(train_v), usable(held_v)
    metrics["voices_left_out"] = [v.key for v in everyone if v not in train_v + held_v]
    if metrics["voices_left_out"]:
        logger.warning("voices left out (engine or voice file missing): %s", metrics["voices_left_out"])
    if not train_v:
        raise RuntimeError(f"no TTS engine works here: {probes}")
    shards = WORK / "shards"
    shutil.rmtree(shards, ignore_errors=True)
    if (carry / "presynth").is_dir():  # speech synthesised before the call, carried as Opus (presynth.py)
        from .presynth import unpack as unpack_presynth

        metrics["presynth"] = unpack_presynth(carry / "presynth", shards, (os.cpu_count() or 2) - 1)
        logger.info("pre-synthesised shards unpacked: %s", metrics["presynth"])
    tasks = plan_tasks(read_corpus(carry / "corpus.tsv.gz"), train_v, held_v, train_hours=args.max_hours,
                       eval_per_voice=args.eval_per_voice, seed=args.seed)
    workers = max(1, (os.cpu_count() or 4) - 1 - gpus)  # one core per trainer, one for this process
    train_end = deadline - args.eval_minutes * 60 - 30  # export + margin
    synth_deadline = train_end - 20
    ctx = mp.get_context("spawn")
    synth = ctx.Process(target=_synth_process, args=(tasks, str(shards), workers, synth_deadline,
                                                     str(WORK / "synth_stats.json")))
    synth.start()
    logger.info("synthesis: %d tasks on %d workers until %.0f s; voices %d train / %d held-out", len(tasks), workers,
                synth_deadline - t_start, len(train_v), len(held_v))

    tc = TrainConfig(data=str(shards), tokenizer=str(carry / "tok"), out=str(WORK / "run"), size=args.size,
                     device="cuda" if cuda else "cpu", seed=args.seed, lr=args.lr,
                     batch=BatchConfig(tokens_per_batch=args.tokens_per_batch, max_seconds=args.max_seconds,
                                       augment=augment, voice_share=args.voice_share,
                                       voice_weights=voice_weights),
                     ckpt_every_s=args.export_every_s, min_utterances=args.min_utterances,
                     warmup_steps=args.warmup_steps, init_from=args.init_from, profile_at=args.profile_at,
                     ema_decay=args.ema_decay, dropout=args.dropout)
    logger.info("training on %d GPU(s) until %.0f s", gpus, train_end - t_start)
    hooks = OutHooks(str(out), metrics)
    try:
        reports = train_data_parallel(tc, gpus, deadline=train_end, hooks=hooks, log_path=str(out / "run.log"))
    except RuntimeError as exc:
        action = after_training_failure(gpus, train_end - time.time(), (WORK / "train_stats.json").exists())
        if action == "raise":
            raise
        metrics["data_parallel_error"] = str(exc)
        if action == "evaluate":
            logger.error("data-parallel training ended with an error: %s", exc)
            reports = []
        else:
            logger.error("data-parallel training on %d GPUs failed (%s); training on one GPU instead", gpus, exc)
            gpus = metrics["gpus"] = 1
            reports = train_data_parallel(tc, 1, deadline=train_end, hooks=hooks, log_path=str(out / "run.log"))
    synth.join(timeout=max(1.0, synth_deadline + 60 - time.time()))
    if synth.is_alive():
        synth.terminate()
    folder = WORK / "export"
    metrics["train"] = json.loads((WORK / "train_stats.json").read_text())
    metrics["train"]["ranks"] = reports
    stats_file = WORK / "synth_stats.json"
    metrics["synth"] = json.loads(stats_file.read_text()) if stats_file.exists() else None

    from .evaluate import evaluate, summary_lines

    real = carry / "real"
    result = evaluate(folder, shards, delays=args.delays, per_voice=args.eval_per_voice,
                      sweep_per_voice=args.sweep_per_voice, real_dir=real if real.exists() else None,
                      workers=max(1, (os.cpu_count() or 2) - 1), deadline=deadline - 15)
    metrics["eval"] = result
    for line in summary_lines(result):
        logger.info("%s", line)
    metrics["wall_s"] = time.time() - t_start
    (folder / "metrics.json").write_text(json.dumps(metrics, indent=2))
    write_outputs(folder, out)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    logger.info("done in %.0f s", metrics["wall_s"])
    return 0


def unpack(args: argparse.Namespace) -> int:
    """$OUT files -> one model folder with a single fp16 model.safetensors, checked by loading it."""
    import tempfile

    from ..loader import load_model, save_model

    src, dst = Path(args.files), Path(args.to)
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        with tarfile.open(src / "model_rest.tar") as tar:
            tar.extractall(t, filter="data")
        for f in list(src.glob("model-*.safetensors")) + list(src.glob("*.index.json")):
            shutil.copy(f, t / f.name)
        model, _ = load_model(t)
        dst.mkdir(parents=True, exist_ok=True)
        for old in list(dst.glob("*.safetensors")) + list(dst.glob("*.index.json")) + [dst / "tekken.json"]:
            old.unlink(missing_ok=True)
        save_model(model.half(), dst)
        for name in ("tokenizer.json", "training.json", "metrics.json"):
            if (t / name).exists():
                shutil.copy(t / name, dst / name)
    size = sum(f.stat().st_size for f in dst.iterdir() if f.is_file())
    logger.info("model folder %s: %.1f MB", dst, size / 1e6)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--carry", default=".train_carry")
    r.add_argument("--out", required=True)
    r.add_argument("--minutes", type=float, default=8.5, help="wall-clock budget of the whole run")
    r.add_argument("--eval-minutes", type=float, default=1.25)
    r.add_argument("--size", default="base-384")
    r.add_argument("--gpus", type=int, default=0, help="data-parallel ranks (0 = every visible GPU)")
    r.add_argument("--lr", type=float, default=1.5e-3)
    r.add_argument("--tokens-per-batch", type=int, default=32768)
    r.add_argument("--max-seconds", type=float, default=20.0)
    # about 220x real time per core here: 14 workers could make ~300 h in 6 min; 160 h (18 GB of shards,
    # as much on the GPU) is the cap, the deadline may stop it first
    r.add_argument("--max-hours", type=float, default=160.0, help="training audio to synthesise at most")
    r.add_argument("--eval-per-voice", type=int, default=40)
    r.add_argument("--sweep-per-voice", type=int, default=12)
    r.add_argument("--delays", type=int, nargs="+", default=[160, 480, 960, 2400])
    r.add_argument("--min-utterances", type=int, default=1500)
    r.add_argument("--export-every-s", type=float, default=120.0)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--warmup-steps", type=int, default=300)
    r.add_argument("--unseen-formant-weight", type=float, default=0.0,
                   help="also train on the formant voices of voices.unseen_formant_voices, sharing this weight "
                        "(the usual formant voices share 2.3 of about 22)")
    r.add_argument("--accent-rewrite-weight", type=float, default=0.0,
                   help="also train on voices.accent_rewrite_voices (training formant voices speaking through the "
                        "accent rule sets of accents.py: pronunciation variety), sharing this weight")
    r.add_argument("--p-eq", type=float, default=0.0,
                   help="share of rows given the random equaliser (augment.draw_eq); run 12 used 0.5")
    d = AugmentConfig()
    r.add_argument("--warp", type=float, nargs=2, default=list(d.warp), metavar=("LO", "HI"),
                   help=f"VTLP frequency warp factors, uniform in [LO, HI] (augment.draw_warp; default {d.warp}, "
                        "runs 11-22)")
    r.add_argument("--p-warp", type=float, default=d.p_warp, help="share of rows whose spectrum is warped")
    r.add_argument("--freq-masks", type=int, default=d.freq_masks,
                   help="frequency bands masked per masked row (augment.draw_masks)")
    r.add_argument("--freq-mask-bins", type=int, default=d.freq_mask_bins, help="widest masked band, in mel bins")
    r.add_argument("--voice-share", type=float, default=0.0,
                   help="share of streams whose shard is drawn by voice weight, not uniformly (data.BatchConfig); "
                        "0 (runs 1-18, 21) lets the many large shards synthesised in the call dominate")
    r.add_argument("--voice-weight", action="append", default=[], metavar="KEY=W",
                   help="replace a training voice's catalogue weight in the --voice-share draw; KEY is a voice key "
                        "(pico:en-US) or an engine prefix ending in ':' (pico:); repeatable")
    r.add_argument("--ema-decay", type=float, default=0.0,
                   help="evaluate and export a moving average of the weights (realtime.train.ema); 0 (runs 1-20) "
                        "exports the last step's")
    r.add_argument("--dropout", type=float, default=0.0,
                   help="training-only dropout on every attention and MLP output (realtime.train.regularize); "
                        "0 (runs 1-24) uses none")
    r.add_argument("--profile-at", type=int, default=60, help="profile 3 steps from this one into run.log")
    r.add_argument("--mbrola-dbs", default=None,
                   help="a folder of mbrola databases (us1, de1.xz, ...) to synthesise those speakers here")
    r.add_argument("--mbrola-weight", type=float, default=1.0,
                   help="scale the mbrola voices' catalogue weights in this call's synthesis plan")
    r.add_argument("--init-from", default=None,
                   help="a model folder (e.g. an earlier run's unpacked $OUT, carried) to continue from")
    u = sub.add_parser("unpack")
    u.add_argument("--files", required=True, help="the folder the run's $OUT files were copied to")
    u.add_argument("--to", required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    return run(args) if args.cmd == "run" else unpack(args)


if __name__ == "__main__":
    raise SystemExit(main())
