"""Distil an Eagle drafter from a target checkpoint on audio.

    python -m speculative.train --target DIR --audio FILES... --out DIR --steps N
        [--device cuda --dtype bf16] [--delays 480 ...] [--k 4] [--layers 1] [--seq-len 256] [--window W]
        [--dropout P] ...     (--window: at most --seq-len, which is its default)

1. Teacher data: the target transcribes every file (greedy, through the batched offline engine) at
   each delay; a teacher-forced pass over its own greedy tokens (chunked, sliding-window caches)
   records, per LM position q, the audio embedding a_q and the final hidden state h_q. Cached in
   `OUT/teacher.pt` (keyed by the target's weights, files and delays) so a resumed run does not redo it.
2. Training: windows of consecutive positions; the drafter reads `x_q = embed(tok_q) + a_q` and
   `h_{q-1}` and learns the target's next token tok_{q+1} (cross-entropy through the tied head)
   and h_q itself (smooth-L1: its output is recycled as the next draft step's hidden state).
   `--unroll U` also trains depths 2..U, where h_{q-1} is replaced by the drafter's own previous
   output, as at draft steps after the first (Eagle-3's training-time test, simplified: the keys
   of earlier positions come from the same depth). `--dropout P` drops the drafter's attention and MLP
   outputs while it trains (it learns its clips by heart otherwise); the masks' generator is saved too.
   `--parallel` trains a `ParallelEagleDrafter` instead: every position q of a window is also an
   anchor with U-1 draft rows at q+1 .. q+U-1 (mask token + that position's audio, zero hidden state)
   that attend to the real rows up to q and to the anchor's earlier draft rows, exactly the rows
   of one engine pass; draft row j learns tok_{q+j+1} (depth j+1). `--two-pass` trains a
   `TwoPassEagleDrafter`: the same rows, but the first draft row reads the teacher's token at q+1
   and the drafter's own output at q from a first pass over the real rows. `--init-from DIR` starts
   from another drafter's weights (same config; e.g. a chained drafter's, for a parallel one).
   `--label-only` stops after this step; `--teacher-from DIR...` trains from the `teacher.pt` of other
   runs instead of labelling `--audio` (e.g. halves labelled at once on two GPUs), after checking that
   each was labelled by this target at these delays.
3. Every `--save-every` steps and at the end: the drafter checkpoint (`drafter_config.json`,
   `drafter.safetensors`) and `train_state.pt` (weights, optimizer, RNG, step): running the same
   command again resumes (or extends to a larger --steps); `--fresh` starts over.
4. At the end the drafter is measured in the engine (offline transcription with speculation) on
   `--eval-audio` (default: the first training files): acceptance figures go to
   `OUT/train_report.json`.

Runs on CUDA for the full-size model (bf16 autocast, fp32 master weights) and on the CPU for tiny
checkpoints. `train_drafter()` is the Python entry point (tests pass synthetic audio arrays).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import logging
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from realtime.attention import DenseAttention, SlidingWindowCache
from realtime.audio import IncrementalLogMel, as_mono_float32
from realtime.model import VoxtralRealtime
from realtime.train.regularize import add_sublayer_dropout

from .capability import drafter_receives_audio, supports_parallel_drafting, supports_two_pass_drafting
from .drafter import (
    DrafterConfig,
    EagleDrafter,
    EagleModel,
    MaskRowsDrafter,
    ParallelEagleDrafter,
    TwoPassEagleDrafter,
    load_drafter,
    save_drafter,
)

logger = logging.getLogger("speculative.train")

STATE_FILE = "train_state.pt"
TEACHER_FILE = "teacher.pt"
REPORT_FILE = "train_report.json"


@dataclass
class TrainConfig:
    steps: int = 1000
    batch: int = 8  # windows per step
    seq_len: int = 256  # positions per window
    lr: float = 5e-4
    warmup: int = 50
    weight_decay: float = 0.0
    unroll: int = 3  # depths trained (1 = plain teacher forcing)
    depth_decay: float = 0.8  # loss weight of depth d is depth_decay ** d
    hidden_loss: float = 0.1  # weight of the smooth-L1 loss on the predicted hidden state
    layers: int = 1
    # the drafter's attention window; None: seq_len. A training window of seq_len positions never shows a longer
    # distance, so a wider one would attend at distances it never learned: the drafter shipped before the
    # forty-third session had 512 on 256-position windows, and on 45 s clips its acceptance fell from 3.79 to 2.58
    window: int | None = None
    dropout: float = 0.0  # residual dropout on the drafter's sublayers while training (it memorises its clips)
    text_only: bool = False  # train an EagleModel (no audio): the ablation of the multimodal drafter
    parallel: bool = False  # train a ParallelEagleDrafter (all `unroll` depths drafted in one pass)
    two_pass: bool = False  # train a TwoPassEagleDrafter (depth 0 in the catch-up pass, the rest in one more)
    init_from: str | None = None  # start from this drafter checkpoint's weights (any kind, same config)
    delays_ms: list[int] = field(default_factory=lambda: [480])
    save_every: int = 200
    log_every: int = 20
    seed: int = 0
    eval_k: int = 4
    eval_clips: int = 4


class TeacherTarget:
    """The target as the capability check sees it during training (it yields per-position audio)."""

    produces_multimodal_embeddings: ClassVar[bool] = True


@dataclass
class TeacherSequence:
    tokens: torch.Tensor  # [T] int64: prompt + the target's greedy tokens
    audio: torch.Tensor  # [T-1, H] audio embedding of positions 0..T-2
    hidden: torch.Tensor  # [T-1, H] the target's final hidden state there (it decides token q+1)
    delay_tokens: int
    prompt_len: int


# ---------------------------------------------------------------------------------------------
# Teacher data
# ---------------------------------------------------------------------------------------------
@torch.no_grad()
def teacher_forced(model: VoxtralRealtime, audio: np.ndarray, tokens: list[int], delay_tokens: int,
                   chunk: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Audio embeddings and final hidden states [T-1, H] of the target at the positions that decide
    a token (all but the last of `tokens`), for the stream padded as the session pads it; chunked
    so memory stays bounded by the windows."""
    cfg = model.config
    dev = model.device
    mpt, fpt = cfg.streaming.mel_frames_per_token, cfg.streaming.downsample_factor
    mel = IncrementalLogMel.for_stream(cfg)
    mel.push(torch.from_numpy(audio))
    mel.push(torch.zeros(cfg.finish_padding(audio.size, delay_tokens)[0]))
    n_tok = len(tokens) - 1
    if mel.available() < n_tok * mpt:
        raise ValueError(f"{n_tok} tokens need {n_tok * mpt} mel frames, the padded audio has {mel.available()}")
    enc = SlidingWindowCache(cfg.encoder.num_layers, cfg.encoder.sliding_window)
    dec = SlidingWindowCache(cfg.decoder.num_layers, cfg.decoder.sliding_window)
    conv = model.audio_tower.embedder.initial_state(1, dev, model.dtype)
    t_cond = model.t_cond(torch.tensor([delay_tokens], device=dev))[:, None, :]
    auds, hids = [], []
    for a in range(0, n_tok, chunk):
        n = min(chunk, n_tok - a)
        m = mel.compute(n * mpt, dev)[None]
        epos = torch.arange(a * fpt, (a + n) * fpt, device=dev)[None]
        enc.begin(epos)
        emb, conv = model.encode(m, conv, epos, enc)
        pos = torch.arange(a, a + n, device=dev)[None]
        dec.begin(pos)
        ids = torch.tensor(tokens[a: a + n], device=dev)[None]
        hid = model.decode(model.embed_tokens(ids) + emb, pos, t_cond, dec)
        auds.append(emb[0])
        hids.append(hid[0])
    return torch.cat(auds), torch.cat(hids)


def label_audio(model: VoxtralRealtime, audios: Sequence[np.ndarray], delays_ms: Sequence[int],
                store_device: str | torch.device = "cpu", batch: int = 64) -> list[TeacherSequence]:
    """Greedy transcripts of every clip at every delay, then teacher-forced features."""
    from realtime.engine.model_runner import RunnerOptions
    from realtime.engine.offline import transcribe_batch

    cfg = model.config
    seqs: list[TeacherSequence] = []
    agree = total = 0
    for delay_ms in delays_ms:
        d = cfg.delay_tokens(delay_ms)
        prompt = cfg.prompt_ids(d)
        n = max(1, min(batch, len(audios)))
        opts = RunnerOptions(max_streams=n, max_batch=n, cuda_graphs=model.device.type == "cuda")
        run = transcribe_batch(model, _NullTokenizer(), audios, delay_ms=delay_ms, opts=opts)
        for a, res in zip(audios, run.results):
            tokens = prompt + res.token_ids
            aud, hid = teacher_forced(model, a, tokens, d)
            pred = model.logits(hid[len(prompt) - 1:]).argmax(-1).cpu()
            agree += int((pred == torch.tensor(tokens[len(prompt):])).sum())
            total += pred.numel()
            seqs.append(TeacherSequence(torch.tensor(tokens), aud.to(store_device), hid.to(store_device), d,
                                        len(prompt)))
    logger.info("teacher: %d sequences, %d positions; teacher-forced argmax agrees with greedy on %.4f",
                len(seqs), sum(len(s.tokens) for s in seqs), agree / max(total, 1))
    return seqs


class _NullTokenizer:
    """Stands in for a text tokenizer where only token ids matter (labelling, measuring)."""

    def token_bytes(self, token_id: int) -> bytes:
        return b""


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def attention_window(tc: TrainConfig) -> int:
    """The drafter's attention window: tc.window, at most the training windows' seq_len (refused above it)."""
    if tc.window is None:
        return tc.seq_len
    if not 1 <= tc.window <= tc.seq_len:
        raise ValueError(f"the drafter's attention window ({tc.window}) must be 1..seq_len ({tc.seq_len}): "
                         "training windows of seq_len positions never show it a longer distance")
    return tc.window


def init_drafter(model: VoxtralRealtime, tc: TrainConfig) -> EagleModel:
    """Start from 'the drafter predicts the target's output from x_q alone': fc = [I, 0], the
    layers copied from the target's last layer with their residual branches zeroed, the target's
    final norm. Training then only has to learn corrections."""
    # a parallel or two-pass drafter drafts the depths it was trained on; recorded so the engine's default k is that
    cfg = DrafterConfig.for_target(model.config, num_layers=tc.layers, sliding_window=attention_window(tc),
                                   draft_tokens=tc.unroll if tc.parallel or tc.two_pass else None)
    if tc.text_only and (tc.parallel or tc.two_pass):
        raise ValueError("a parallel or two-pass drafter needs the audio of its draft positions: not with text_only")
    if tc.parallel and tc.two_pass:
        raise ValueError("a drafter is parallel or two-pass, not both")
    cls = (EagleModel if tc.text_only else ParallelEagleDrafter if tc.parallel
           else TwoPassEagleDrafter if tc.two_pass else EagleDrafter)
    d = cls(cfg)
    h = cfg.hidden_size
    with torch.no_grad():
        d.fc.weight.zero_()
        d.fc.weight[:, :h] = torch.eye(h)
        last = model.language_model.layers[-1].state_dict()
        for layer in d.layers:
            layer.load_state_dict({k: v.detach().to("cpu", torch.float32) for k, v in last.items()})
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        d.norm.weight.copy_(model.language_model.norm.weight.detach().float().cpu())
    return d


def init_from_checkpoint(drafter: EagleModel, path: str | Path) -> list[str]:
    """Copy a saved drafter's weights into `drafter` (e.g. a chained drafter's into a parallel one):
    the configs must be equal and every saved tensor must exist here with its shape; tensors only
    this kind has (the mask embedding) keep their initial values. Returns their names. A missing or
    corrupt checkpoint is a CheckpointError (`load_drafter` is strict)."""
    saved = load_drafter(path)
    # the drafts it was trained for (or measured best with on a GPU) may differ (a parallel drafter trained on to more
    # depths): the weights still fit
    def shape(c: DrafterConfig) -> DrafterConfig:
        return replace(c, draft_tokens=None, gpu_draft_tokens=None)

    if shape(saved.config) != shape(drafter.config):
        raise ValueError(f"--init-from {path}: its config {asdict(saved.config)} differs from this drafter's "
                         f"{asdict(drafter.config)}")
    theirs, own = saved.state_dict(), drafter.state_dict()
    bad = sorted(k for k, v in theirs.items() if k not in own or own[k].shape != v.shape)
    if bad:
        raise ValueError(f"--init-from {path} ({type(saved).__name__}): tensors that do not fit this drafter: {bad}")
    with torch.no_grad():
        for k, v in theirs.items():
            own[k].copy_(v)
    return sorted(set(own) - set(theirs))


def _config_key(target: str, files: Sequence[str], tc: TrainConfig, audios: Sequence[np.ndarray]) -> str:
    """Key of a cached teacher file: the target's fingerprint (not its folder, whose weights can change
    under the same path), the files, the audio and the delays."""
    h = hashlib.sha256(target.encode())
    for f in files:
        h.update(f.encode())
    for a in audios:
        h.update(str(a.size).encode())
        h.update(a[:: max(1, a.size // 4096)].tobytes())
    h.update(json.dumps(sorted(tc.delays_ms)).encode())
    return h.hexdigest()[:16]


def target_fingerprint(model: VoxtralRealtime) -> str:
    """Which target labelled a teacher file: its config and a strided sample of every weight (cheap even
    for a 4B model on the GPU; two different checkpoints share it only by accident)."""
    h = hashlib.sha256(repr(model.config).encode())
    with torch.no_grad():
        for name, p in model.named_parameters():
            flat = p.detach().flatten()
            h.update(name.encode())
            h.update(flat[:: max(1, flat.numel() // 256)].float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def prepare_teacher(model: VoxtralRealtime, audios: Sequence[np.ndarray], out: Path, tc: TrainConfig, *,
                    files: Sequence[str] = (), fresh: bool = False, fingerprint: str | None = None
                    ) -> list[TeacherSequence]:
    """The teacher data of `audios`, from `out/teacher.pt` when it was made by the same target from the same
    files and delays, else labelled now and saved there (with the target's fingerprint, for --teacher-from).
    `fingerprint`: the model's `target_fingerprint`, when the caller has it already."""
    fingerprint = fingerprint or target_fingerprint(model)
    key = _config_key(fingerprint, files, tc, audios)
    tfile = out / TEACHER_FILE
    if tfile.exists() and not fresh:
        blob = torch.load(tfile, weights_only=False)
        if blob.get("key") == key:
            logger.info("teacher data: reusing %s (%d sequences)", tfile, len(blob["seqs"]))
            return [TeacherSequence(**s) for s in blob["seqs"]]
    t0 = time.perf_counter()
    seqs = label_audio(model, audios, tc.delays_ms, store_device="cpu")
    torch.save({"key": key, "seqs": [asdict(s) for s in seqs], "target": fingerprint,
                "delays_ms": sorted(tc.delays_ms)}, tfile)
    logger.info("teacher data: %.1f s", time.perf_counter() - t0)
    return seqs


def load_teachers(dirs: Sequence[str | Path], model: VoxtralRealtime, tc: TrainConfig) -> list[TeacherSequence]:
    """The sequences of other runs' teacher files, in the order given; each must come from this target
    (same weights and dtype) at these delays: a drafter learns the target it was labelled by."""
    fp, delays = target_fingerprint(model), sorted(tc.delays_ms)
    seqs: list[TeacherSequence] = []
    for d in dirs:
        tfile = Path(d) / TEACHER_FILE
        if not tfile.is_file():
            raise ValueError(f"{tfile} does not exist: label it first (--label-only)")
        blob = torch.load(tfile, weights_only=False)
        if blob.get("target") != fp:
            raise ValueError(f"{tfile} was labelled by another target (or before fingerprints were recorded)")
        if blob.get("delays_ms") != delays:
            raise ValueError(f"{tfile} was labelled at delays {blob.get('delays_ms')} ms, not {delays}")
        seqs += [TeacherSequence(**s) for s in blob["seqs"]]
    logger.info("teacher data: %d sequences from %d teacher file(s)", len(seqs), len(dirs))
    return seqs


class Progress:
    """One status line: redrawn in place on a terminal, logged every `every` steps otherwise."""

    def __init__(self, total: int, start: int, every: int) -> None:
        self.total, self.start, self.every = total, start, every
        self.t0 = time.perf_counter()
        self.tty = sys.stderr.isatty()

    def update(self, step: int, msg: str) -> None:
        done = step - self.start
        rate = done / max(time.perf_counter() - self.t0, 1e-9)
        eta = (self.total - step) / rate if rate > 0 else float("inf")
        line = f"step {step}/{self.total} {msg} | {rate:.2f} it/s, ETA {eta / 60:.1f} min"
        if self.tty:
            print("\r" + line, end="", file=sys.stderr, flush=True)
            if step == self.total:
                print(file=sys.stderr)
        elif step % self.every == 0 or step == self.total:
            logger.info(line)


def _sample_batch(seqs: list[TeacherSequence], tc: TrainConfig, gen: torch.Generator, dev: torch.device
                  ) -> dict[str, torch.Tensor]:
    """B windows of consecutive positions q: inputs x_q and h_{q-1} (zeros at q = 0, as in the
    engine's drafter prompt prefix), targets tok_{q+1} and h_q; the loss counts only positions whose
    target token was generated (q >= prompt_len - 1)."""
    lengths = torch.tensor([len(s.hidden) for s in seqs], dtype=torch.float64)  # positions 0..T-2
    idx = torch.multinomial(lengths, tc.batch, replacement=True, generator=gen).tolist()
    win = min(tc.seq_len, max(len(seqs[i].hidden) for i in idx))
    tok_in, aud, hid_prev, hid_tgt, tok_tgt, pos, mask, delay = [], [], [], [], [], [], [], []
    for i in idx:
        s = seqs[i]
        usable = len(s.hidden)
        n = min(win, usable)
        start = int(torch.randint(0, usable - n + 1, (1,), generator=gen))
        q = torch.arange(start, start + win)
        qc = q.clamp(max=usable - 1)  # a short sequence's padded tail repeats its last position (masked)
        tok_in.append(s.tokens[qc])
        aud.append(s.audio[qc])
        hid_prev.append(torch.where((qc > 0).to(s.hidden.device)[:, None], s.hidden[(qc - 1).clamp(min=0)], 0.0))
        hid_tgt.append(s.hidden[qc])
        tok_tgt.append(s.tokens[qc + 1])
        pos.append(q)
        mask.append((q < start + n) & (q >= s.prompt_len - 1))
        delay.append(s.delay_tokens)
    stack = lambda xs: torch.stack(xs).to(dev)
    return {"tok_in": stack(tok_in), "audio": stack(aud), "hid_prev": stack(hid_prev), "hid_tgt": stack(hid_tgt),
            "tok_tgt": stack(tok_tgt), "pos": stack(pos), "mask": stack(mask),
            "delay": torch.tensor(delay, device=dev)}


@functools.lru_cache(maxsize=8)
def parallel_row_layout(length: int, depths: int, window: int | None, device: torch.device | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of a parallel-drafting window of `length` consecutive positions: the real rows 0..L-1, then
    for each depth j = 1..U-1 one draft row per anchor i, at window index i + j. Returns (src [R]: the
    window index whose audio, targets and position the row takes; depth [R]; mask [1, R, R]: a real row
    sees real rows causally, a draft row (i, j) sees real rows up to its anchor i and the draft rows of
    the same anchor up to depth j, all within the window), as one engine pass lays them out. Cached per
    shape and device: building the [R, R] mask costs more host time than a training step's kernels."""
    i = torch.arange(length).repeat(depths)
    depth = torch.arange(depths).repeat_interleave(length)
    src = i + depth  # may run past the window: those rows are gathered clamped and masked out of the loss
    real_q, real_k = depth[:, None] == 0, depth[None, :] == 0
    qpos, anchor_k = src[:, None], i[None, :]
    sees_real = real_k & (anchor_k <= i[:, None])
    if window is not None:
        sees_real &= qpos - anchor_k < window
    same_anchor_draft = ~real_k & ~real_q & (i[:, None] == anchor_k) & (depth[None, :] <= depth[:, None])
    return src.to(device), depth.to(device), (sees_real | same_anchor_draft)[None].to(device)


def _parallel_train_step(drafter: MaskRowsDrafter, batch: dict[str, torch.Tensor], tc: TrainConfig, use_audio: bool,
                         autocast: bool) -> tuple[torch.Tensor, list[float], float]:
    """A parallel drafter's step (one pass over `parallel_row_layout`'s rows), or a two-pass drafter's:
    pass 1 over the real rows (their outputs are depth 0), then the same layout in which each
    anchor's depth-1 row reads the teacher's token there (the first draft, wherever the deeper
    drafts count) and pass 1's output at the anchor instead of the mask and zeros."""
    dev = batch["pos"].device
    length, depths = batch["pos"].shape[1], tc.unroll
    src, depth, allowed = parallel_row_layout(length, depths, drafter.config.sliding_window, dev)
    idx = src.clamp(max=length - 1)
    two_pass = supports_two_pass_drafting(drafter)
    masked = depth > (1 if two_pass else 0)
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
        audio = batch["audio"].to(drafter.dtype) if use_audio else None
        t_cond = drafter.t_cond(batch["delay"])[:, None, :]
        tok_in = torch.where(masked, drafter.mask_token_id, batch["tok_in"][:, idx])
        x = drafter.embed_input_ids(tok_in, audio[:, idx] if use_audio else None)
        hid_in = torch.where(masked[None, :, None], 0.0, batch["hid_prev"][:, idx]).to(drafter.dtype)
        pos = batch["pos"][:, idx]
        if two_pass:
            g1 = drafter(drafter.embed_input_ids(batch["tok_in"], audio), batch["hid_prev"].to(drafter.dtype),
                         batch["pos"], t_cond, DenseAttention(batch["pos"], drafter.config.sliding_window))
            hid_in = torch.where((depth == 1)[None, :, None], g1[:, src - depth].to(hid_in.dtype), hid_in)
        g = drafter(x, hid_in, pos, t_cond, DenseAttention.with_mask(allowed))
        if two_pass:  # the first draft comes from pass 1 (pass 2 recomputes the real rows for their keys)
            g = torch.where((depth == 0)[None, :, None], g1[:, idx].to(g.dtype), g)
        logits = drafter.logits(g).float()
        tok_tgt = batch["tok_tgt"][:, idx]
        # a draft row counts where its anchor and its own position are generated positions of the window
        mask = batch["mask"][:, idx] & batch["mask"][:, src - depth] & (src < length)[None]
        ce = F.cross_entropy(logits.flatten(0, 1), tok_tgt.flatten(), reduction="none").view(mask.shape)
        reg = F.smooth_l1_loss(g.float(), batch["hid_tgt"][:, idx].float(), reduction="none").mean(-1)
        w = tc.depth_decay ** depth.float()
        # rows come in blocks of `length` per depth: per-depth sums without boolean indexing (no host syncs)
        per_depth = mask.sum(0).view(depths, length).sum(-1)
        loss = ((ce + tc.hidden_loss * reg) * w * mask).sum() / per_depth[0].clamp(min=1)
        with torch.no_grad():
            hit = ((logits.argmax(-1) == tok_tgt) & mask).sum(0).view(depths, length).sum(-1)
            accs = (hit / per_depth.clamp(min=1)).tolist()
    return loss, accs, float(per_depth.sum())


def _train_step(drafter: EagleModel, batch: dict[str, torch.Tensor], tc: TrainConfig, use_audio: bool,
                autocast: bool) -> tuple[torch.Tensor, list[float], float]:
    if supports_parallel_drafting(drafter) or supports_two_pass_drafting(drafter):
        return _parallel_train_step(drafter, batch, tc, use_audio, autocast)
    dev = batch["pos"].device
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
        x = drafter.embed_input_ids(batch["tok_in"], batch["audio"].to(drafter.dtype) if use_audio else None)
        t_cond = drafter.t_cond(batch["delay"])[:, None, :]
        hid_in = batch["hid_prev"].to(drafter.dtype)
        attn = DenseAttention(batch["pos"], drafter.config.sliding_window)
        mask = batch["mask"]
        n = mask.sum().clamp(min=1)
        loss = torch.zeros((), device=dev)
        accs = []
        hid_tgt = batch["hid_tgt"].float()
        for depth in range(tc.unroll):
            g = drafter(x, hid_in, batch["pos"], t_cond, attn)
            logits = drafter.logits(g).float()
            ce = F.cross_entropy(logits.flatten(0, 1), batch["tok_tgt"].flatten(), reduction="none").view(mask.shape)
            reg = F.smooth_l1_loss(g.float(), hid_tgt, reduction="none").mean(-1)
            w = tc.depth_decay ** depth
            loss = loss + w * (((ce + tc.hidden_loss * reg) * mask).sum() / n)
            with torch.no_grad():
                accs.append(float(((logits.argmax(-1) == batch["tok_tgt"]) & mask).sum() / n))
            # next depth: position q reads the drafter's estimate of h_{q-1} instead of the target's
            hid_in = torch.cat([batch["hid_prev"][:, :1].to(g.dtype), g[:, :-1]], dim=1)
    return loss, accs, float(n)


def _lr_at(step: int, tc: TrainConfig) -> float:
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    frac = (step - tc.warmup) / max(1, tc.steps - tc.warmup)
    return tc.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


@dataclass
class TrainResult:
    out_dir: Path
    steps: int
    resumed_from: int
    history: list[dict]
    report: dict


def train_drafter(model: VoxtralRealtime, audios: Sequence[np.ndarray], out_dir: str | Path,
                  tc: TrainConfig | None = None, *, files: Sequence[str] = (),
                  fresh: bool = False, eval_audios: Sequence[np.ndarray] | None = None,
                  stop_after: int | None = None, max_minutes: float | None = None,
                  teacher: Sequence[TeacherSequence] | None = None) -> TrainResult:
    """Train (or resume) to `tc.steps`. `stop_after` steps / `max_minutes` end this call early
    with a saved state (time-limited jobs: run the same command again to continue); the engine
    measurement runs only once training is complete. `teacher`: sequences labelled elsewhere
    (`load_teachers`), used instead of labelling `audios`."""
    tc = tc or TrainConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dev = model.device
    audios = [as_mono_float32(a) for a in audios]
    for p in model.parameters():
        p.requires_grad_(False)

    # ---- teacher data (cached) ----
    fingerprint = target_fingerprint(model)
    if teacher is not None:
        seqs = list(teacher)
    else:
        seqs = prepare_teacher(model, audios, out, tc, files=files, fresh=fresh, fingerprint=fingerprint)
    seqs = [s for s in seqs if len(s.hidden) >= 1]
    if not seqs:
        raise ValueError("no training positions: the audio is too short")
    if dev.type == "cuda":  # features next to the model: sampling stays on the device
        seqs = [TeacherSequence(s.tokens, s.audio.to(dev), s.hidden.to(dev), s.delay_tokens, s.prompt_len)
                for s in seqs]

    # ---- drafter, optimizer, resume ----
    drafter = init_drafter(model, tc).to(dev)
    drop_gen = torch.Generator(device=dev).manual_seed(tc.seed + 1)  # its state is saved: resumes draw alike
    add_sublayer_dropout(drafter.layers, tc.dropout, generator=drop_gen)  # identity in eval
    embed32 = model.language_model.embed_tokens.weight.detach().float()
    drafter.tie_to(embed32)
    use_audio = drafter_receives_audio(TeacherTarget(), drafter)
    opt = torch.optim.AdamW(drafter.parameters(), lr=tc.lr, weight_decay=tc.weight_decay)
    gen = torch.Generator().manual_seed(tc.seed)
    step = 0
    history: list[dict] = []
    sfile = out / STATE_FILE
    if sfile.exists() and not fresh:
        st = torch.load(sfile, weights_only=False)
        # through from_dict: a state saved before a config field existed gets its default, as a drafter file does
        if DrafterConfig.from_dict(st["drafter_config"]) != drafter.config or st["arch"] != type(drafter).__name__:
            raise ValueError(f"{sfile} is for a different drafter ({st['arch']} {st['drafter_config']}): "
                             "use --fresh or another --out")
        if st.get("target") != fingerprint:  # a drafter half-trained for other weights under the same path
            raise ValueError(f"{sfile} was trained against another target (or before fingerprints were "
                             "recorded): use --fresh or another --out")
        drafter.load_state_dict(st["drafter"])
        opt.load_state_dict(st["optimizer"])
        gen.set_state(st["generator"])
        if "dropout_generator" in st:
            drop_gen.set_state(st["dropout_generator"])
        step, history = st["step"], st["history"]
        logger.info("resuming from step %d (%s)", step, sfile)
    elif tc.init_from is not None:
        kept = init_from_checkpoint(drafter, tc.init_from)
        logger.info("initialised from %s; kept their initial values: %s", tc.init_from, kept or "none")
    resumed_from = step

    def save() -> None:
        save_drafter(drafter, out)
        torch.save({"step": step, "drafter": drafter.state_dict(), "optimizer": opt.state_dict(),
                    "generator": gen.get_state(), "dropout_generator": drop_gen.get_state(), "history": history,
                    "arch": type(drafter).__name__,
                    "drafter_config": asdict(drafter.config), "train_config": asdict(tc), "target": fingerprint},
                   out / (STATE_FILE + ".tmp"))
        (out / (STATE_FILE + ".tmp")).replace(sfile)

    autocast = dev.type == "cuda"
    prog = Progress(tc.steps, step, tc.log_every)
    drafter.train()
    t_start = time.perf_counter()
    while step < tc.steps:
        if (stop_after is not None and step - resumed_from >= stop_after) or \
                (max_minutes is not None and time.perf_counter() - t_start > 60 * max_minutes):
            save()
            logger.info("stopping at step %d of %d (time or step budget): run again to resume", step, tc.steps)
            return TrainResult(out, step, resumed_from, history, {})
        batch = _sample_batch(seqs, tc, gen, dev)
        for g_ in opt.param_groups:
            g_["lr"] = _lr_at(step, tc)
        loss, accs, _ = _train_step(drafter, batch, tc, use_audio, autocast)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        step += 1
        rec = {"step": step, "loss": float(loss.detach()), "acc": accs, "lr": _lr_at(step - 1, tc)}
        history.append(rec)
        prog.update(step, f"loss {rec['loss']:.3f} acc@depth {'/'.join(f'{a:.2f}' for a in accs)}")
        if step % tc.save_every == 0 or step == tc.steps:
            save()
    if step == resumed_from:
        save()  # nothing to train (already at --steps): still leave a checkpoint behind
    drafter.eval()

    # ---- measure in the engine ----
    held_out = eval_audios is not None
    report = evaluate_in_engine(model, out, list(eval_audios) if held_out else audios[: tc.eval_clips], tc)
    report["eval_audio"] = "held-out" if held_out else f"the first {tc.eval_clips} training clips (optimistic)"
    report["train"] = {"steps": step, "resumed_from": resumed_from,
                       "final_loss": history[-1]["loss"] if history else None,
                       "final_acc": history[-1]["acc"] if history else None}
    (out / REPORT_FILE).write_text(json.dumps(report, indent=2))
    return TrainResult(out, step, resumed_from, history, report)


def evaluate_in_engine(model: VoxtralRealtime, drafter_dir: Path, audios: Sequence[np.ndarray],
                       tc: TrainConfig) -> dict:
    """Offline transcription with the saved drafter: acceptance figures (and that nothing changed)."""
    from realtime.engine.model_runner import RunnerOptions
    from realtime.engine.offline import transcribe_batch
    from realtime.engine.speculation import SpeculativeConfig

    if not audios:
        return {}
    drafter = load_drafter(drafter_dir, target_embedding=model.language_model.embed_tokens.weight,
                           device=model.device, dtype=model.dtype)
    n = max(1, min(16, len(audios)))
    opts = RunnerOptions(max_streams=n, max_batch=n, cuda_graphs=model.device.type == "cuda",
                         max_step_tokens=max(8, tc.eval_k + 1))
    out = {}
    for delay_ms in tc.delays_ms:
        base = transcribe_batch(model, _NullTokenizer(), audios, delay_ms=delay_ms, opts=opts)
        spec = transcribe_batch(model, _NullTokenizer(), audios, delay_ms=delay_ms, opts=opts,
                                speculative=SpeculativeConfig(drafter, num_speculative_tokens=tc.eval_k))
        st = spec.stats
        same = sum(a.token_ids == b.token_ids for a, b in zip(base.results, spec.results))
        out[str(delay_ms)] = {
            "k": tc.eval_k, "acceptance_rate": st.spec_acceptance_rate,
            "mean_acceptance_length": st.spec_mean_acceptance_length,
            "per_position_acceptance": [a / d if d else 0.0 for a, d in
                                        zip(st.spec_accepted_per_position, st.spec_drafted_per_position)],
            "steps_without": base.steps, "steps_with": spec.steps, "identical_outputs": f"{same}/{len(audios)}"}
        logger.info("engine eval at %d ms: acceptance %.3f, mean acceptance length %.2f, steps %d -> %d, "
                    "identical %d/%d", delay_ms, st.spec_acceptance_rate, st.spec_mean_acceptance_length,
                    base.steps, spec.steps, same, len(audios))
    return out


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def audio_paths(items: Sequence[str]) -> list[str]:
    """Files as given; folders expanded to their WAV/FLAC/Ogg files and packed training shards (sorted); .txt files
    read as lists."""
    from realtime.train.presynth import SUFFIX  # a shard packed by presynth (Opus audio of one voice's utterances)

    out: list[str] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            out += sorted(str(f) for f in p.rglob("*") if f.suffix.lower() in (".wav", ".flac", ".ogg", ".opus")
                          or f.name.endswith(SUFFIX))
        elif p.suffix.lower() == ".txt":
            out += [ln.strip() for ln in p.read_text().splitlines() if ln.strip()]
        else:
            out.append(item)
    if not out:
        raise ValueError(f"no audio files in {list(items)}")
    return out


def load_training_audio(path: str, rate: int) -> np.ndarray:
    """One training clip: an audio file (resampled to `rate`), or a packed training shard of the default model's
    speech (`realtime.train.presynth`: natural and recorded voices the device cannot synthesise). A shard of another
    split than "train" holds held-out voices or sentences, which no training may read: refused."""
    from realtime.audio import load_audio_file
    from realtime.train.presynth import SUFFIX, read_packed_audio
    from realtime.train.synth import RATE

    if not path.endswith(SUFFIX):
        return load_audio_file(path, rate)
    if rate != RATE:
        raise ValueError(f"{path}: packed shards are {RATE} Hz audio, the target reads {rate} Hz")
    try:
        audio, meta = read_packed_audio(Path(path))
    except (OSError, KeyError, ValueError, RuntimeError) as exc:  # soundfile's errors are RuntimeErrors
        raise ValueError(f"{path}: not a readable packed shard: {exc}") from exc
    if meta.get("split") != "train":
        raise ValueError(f"{path}: a {meta.get('split')!r} shard (held-out voices or sentences): never trained on")
    return audio


def main(argv: list[str] | None = None) -> int:
    from realtime.audio import AudioError, load_audio_file
    from realtime.loader import CheckpointError, load_model

    ap = argparse.ArgumentParser(description="Distil an Eagle drafter from a target checkpoint on audio.")
    ap.add_argument("--target", required=True, help="target checkpoint folder")
    ap.add_argument("--audio", nargs="+", default=None,
                    help="training audio: WAV/FLAC/Ogg files, packed training shards (*.opus.npz, split train), "
                         "folders (searched recursively) or .txt lists of paths")
    ap.add_argument("--label-only", action="store_true",
                    help="label --audio into OUT/teacher.pt and stop (for --teacher-from of another run)")
    ap.add_argument("--teacher-from", nargs="+", default=None, metavar="DIR",
                    help="train from these runs' teacher.pt (same target and delays) instead of labelling --audio")
    ap.add_argument("--eval-audio", nargs="*", default=None, help="held-out files for the engine measurement")
    ap.add_argument("--out", required=True, help="output folder (drafter checkpoint, train state, teacher cache)")
    ap.add_argument("--steps", type=int, default=TrainConfig.steps)
    ap.add_argument("--batch", type=int, default=TrainConfig.batch)
    ap.add_argument("--seq-len", type=int, default=TrainConfig.seq_len)
    ap.add_argument("--lr", type=float, default=TrainConfig.lr)
    ap.add_argument("--unroll", type=int, default=TrainConfig.unroll)
    ap.add_argument("--depth-decay", type=float, default=TrainConfig.depth_decay,
                    help="loss weight of depth d is DEPTH_DECAY ** d (d = 0: the first draft)")
    ap.add_argument("--layers", type=int, default=TrainConfig.layers)
    ap.add_argument("--window", type=int, default=TrainConfig.window,
                    help="the drafter's attention window, at most --seq-len (default: --seq-len)")
    ap.add_argument("--dropout", type=float, default=TrainConfig.dropout,
                    help="residual dropout on the drafter's attention and MLP outputs while training")
    ap.add_argument("--text-only", action="store_true", help="train a text-only drafter (ablation)")
    ap.add_argument("--parallel", action="store_true",
                    help="train a ParallelEagleDrafter: all --unroll depths drafted in one pass (mask rows)")
    ap.add_argument("--two-pass", action="store_true",
                    help="train a TwoPassEagleDrafter: the first draft in the catch-up pass, the rest in one more")
    ap.add_argument("--init-from", default=None, metavar="DIR",
                    help="start from this drafter's weights (e.g. a chained drafter's, for a parallel one; same config)")
    ap.add_argument("--delays", type=int, nargs="+", default=[480], help="delays (ms) to label the audio at")
    ap.add_argument("--k", type=int, default=TrainConfig.eval_k, help="draft tokens in the engine measurement")
    ap.add_argument("--save-every", type=int, default=TrainConfig.save_every)
    ap.add_argument("--log-every", type=int, default=TrainConfig.log_every)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fresh", action="store_true", help="ignore a saved train state / teacher cache")
    ap.add_argument("--max-minutes", type=float, default=None,
                    help="stop (saved) after this much training time; the same command resumes")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=sorted(_DTYPES), default=None, help="target dtype (default bf16 on CUDA)")
    args = ap.parse_args(argv)
    if (args.audio is None) == (args.teacher_from is None):
        ap.error("give --audio (to label) or --teacher-from (labelled elsewhere), not both")
    if args.label_only and args.audio is None:
        ap.error("--label-only labels --audio")
    if args.teacher_from is not None and not args.eval_audio:
        ap.error("--teacher-from needs --eval-audio (there are no training clips to measure on)")
    if not 0.0 <= args.dropout < 1.0:  # before labelling, which takes minutes
        ap.error(f"--dropout must be in [0, 1), got {args.dropout}")
    if not 0.0 < args.depth_decay <= 1.0:
        ap.error(f"--depth-decay must be in (0, 1], got {args.depth_decay}")
    if (args.parallel or args.two_pass) and args.text_only:
        ap.error("--parallel and --two-pass draft from the audio of the draft positions: not with --text-only")
    if args.parallel and args.two_pass:
        ap.error("--parallel and --two-pass are two kinds of drafter: give one")
    if args.window is not None and not 1 <= args.window <= args.seq_len:
        ap.error(f"--window must be 1..--seq-len ({args.seq_len}), got {args.window}: training windows of --seq-len "
                 "positions never show the drafter a longer distance")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    dtype = _DTYPES[args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32")]
    tc = TrainConfig(steps=args.steps, batch=args.batch, seq_len=args.seq_len, lr=args.lr, unroll=args.unroll,
                     depth_decay=args.depth_decay,
                     layers=args.layers, window=args.window, dropout=args.dropout, text_only=args.text_only,
                     parallel=args.parallel, two_pass=args.two_pass, init_from=args.init_from,
                     delays_ms=args.delays,
                     save_every=args.save_every, log_every=args.log_every, seed=args.seed, eval_k=args.k)
    try:
        model, _ = load_model(args.target, device=args.device, dtype=dtype)
        if args.init_from is not None:  # a checkpoint that does not fit is refused before labelling
            init_from_checkpoint(init_drafter(model, tc), args.init_from)
        rate = model.config.audio.sampling_rate
        files = audio_paths(args.audio) if args.audio is not None else []
        audios = [load_training_audio(f, rate) for f in files]
        if files:
            logger.info("%d training files, %.1f min of audio", len(files), sum(a.size for a in audios) / rate / 60)
        if args.label_only:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            seqs = prepare_teacher(model, audios, out, tc, files=files, fresh=args.fresh)
            print(json.dumps({"teacher": str(out / TEACHER_FILE), "sequences": len(seqs),
                              "positions": sum(len(s.hidden) for s in seqs)}))
            return 0
        teacher = load_teachers(args.teacher_from, model, tc) if args.teacher_from is not None else None
        evals = [load_audio_file(f, rate) for f in audio_paths(args.eval_audio)] if args.eval_audio else None
        res = train_drafter(model, audios, args.out, tc, files=files, fresh=args.fresh,
                            eval_audios=evals, max_minutes=args.max_minutes, teacher=teacher)
    except (AudioError, CheckpointError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(res.report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
