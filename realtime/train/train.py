"""Train a small Voxtral-Realtime model on a synthetic shard folder; resumable, time-budgeted.

    python -m realtime.train.train --data SHARDS --tokenizer DIR --out RUN [--size base-384]
        [--max-steps N] [--max-minutes M] [--device cuda] [--resume]

RUN/ckpt.pt holds the model, the optimizer, the step, the training seconds so far and the loss
history; the batch of step i is a pure function of (seed, i), so a resumed run continues exactly
where it stopped. RUN/model/ is the exported checkpoint (fp16 safetensors + config.json +
tokenizer.json) that `realtime.loader.load_model` reads; RUN/loss.png the curves. The learning
rate follows warmup + cosine over whichever budget binds first (steps or minutes), so a
time-limited run still ends its schedule, then exports, in time.

Data-parallel training (`realtime.train.distributed` starts one process per GPU) sets `rank` and
`world`: every rank reads its own part of the shards and draws its own batches, DDP averages the
gradients, and only rank 0 validates, logs, checkpoints and exports. Every decision that must be
the same on all ranks (the learning rate, when the time budget ends) is taken from values agreed
by a collective every `sync_every` steps, never from one rank's own clock.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shutil
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..loader import save_model
from ..model import VoxtralRealtime
from ..tokenizer import load_tokenizer
from ..tokenizer_build import NUM_CONTROL_TOKENS
from .augment import AugmentConfig
from .data import IGNORE, Batch, BatchConfig, Corpus, StreamBatcher
from .ema import WeightAverage
from .model_size import SIZES
from .regularize import add_residual_dropout

logger = logging.getLogger(__name__)
progress_log = logging.getLogger("realtime.train.progress")

NO_AUGMENT = AugmentConfig(p_reverb=0, p_telephone=0, p_noise=0, p_floor=0, gain_db=(0.0, 0.0), p_warp=0,
                          p_mask=0, p_eq=0)


@dataclass
class TrainConfig:
    data: str
    tokenizer: str
    out: str
    size: str = "base-384"
    device: str = "cuda" if torch.cuda.is_available() else "cpu"
    seed: int = 0
    max_steps: int = 100_000
    max_minutes: float | None = None  # training time budget (export happens after it)
    lr: float = 1.5e-3
    min_lr_frac: float = 0.05
    warmup_steps: int = 300
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    pad_weight: float = 0.5  # loss weight of [STREAMING_PAD] targets
    batch: BatchConfig = field(default_factory=BatchConfig)
    ckpt_every_s: float = 90.0
    ckpt_every_steps: int = 1000
    log_every: int = 20
    val_every: int = 250
    val_batches: int = 4
    refresh_every: int = 25  # steps between scans for new shards
    min_utterances: int = 200  # wait for this much data before the first step
    init_from: str | None = None  # exported model folder or packed file (train.warm) to start from
    profile_at: int | None = None  # profile steps [profile_at, profile_at + 3) into the log
    rank: int = 0  # data-parallel rank and world size (the process group is set up by the caller)
    world: int = 1
    sync_every: int = 20  # steps between the ranks' agreement on the training time and audio seen
    # > 0: validate and export an exponential moving average of the weights (realtime.train.ema),
    # not the last step's; 0 (runs 1-20) exports the last step's weights
    ema_decay: float = 0.0
    # > 0: training-only dropout on every sublayer's output (realtime.train.regularize); 0 (runs 1-24)
    dropout: float = 0.0


def init_weights(model: VoxtralRealtime, std: float = 0.02) -> None:
    """GPT-style init: N(0, std) matrices and embeddings, residual outputs scaled by depth, zero
    biases, and a zero delay conditioning (every delay starts as the identity scale)."""
    n_enc, n_dec = model.config.encoder.num_layers, model.config.decoder.num_layers
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name or "layer_norm" in name:
                p.fill_(1.0)
            elif p.ndim == 1 or "ada_rms_norm.linear2" in name:
                p.zero_()
            else:
                s = std
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    s = std / math.sqrt(2 * (n_enc if name.startswith("audio_tower") else n_dec))
                p.normal_(0.0, s)


def validation_batches(train: BatchConfig) -> BatchConfig:
    """The held-out-voice validation batches: no augmentation, and shards drawn uniformly whatever the
    training draw (voice_share), so that validation losses compare across runs."""
    return replace(train, augment=NO_AUGMENT, voice_share=0.0)


def lr_at(tc: TrainConfig, step: int, train_s: float) -> float:
    warm = min(1.0, (step + 1) / max(1, tc.warmup_steps))
    prog = step / tc.max_steps
    if tc.max_minutes:
        prog = max(prog, train_s / (tc.max_minutes * 60))
    prog = min(1.0, prog)
    cos = tc.min_lr_frac + (1 - tc.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * prog))
    return tc.lr * warm * cos


def batch_loss(model: VoxtralRealtime, batch: Batch, amp: bool, pad_weight: float = 0.5,
               forward: torch.nn.Module | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Cross-entropy over the decided tokens; [STREAMING_PAD] targets count `pad_weight` (they are most
    of the targets and carry the least information; DSM likewise down-weights its text padding).

    The accuracies come back as 0-d device tensors (NaN when the batch has no such label): reading
    them forces a GPU sync, so the loop reads them only on the steps it logs. `forward` is the module
    to call when it is not `model` itself (its DistributedDataParallel wrapper)."""
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
        logits = (forward or model)(batch.input_ids, batch.mel, batch.delay_tokens)
    v = logits.shape[-1]
    labels = batch.labels.reshape(-1)
    ce = F.cross_entropy(logits.reshape(-1, v), labels, ignore_index=IGNORE, reduction="none")
    w = torch.where(labels == model.config.tokens.streaming_pad, pad_weight, 1.0) * (labels != IGNORE)
    loss = (ce * w).sum() / w.sum().clamp(min=1.0)
    with torch.no_grad():
        hit = (logits.argmax(-1) == batch.labels).float()
        lab = batch.labels
        text = (lab >= model.config.tokens.num_control_tokens).float()
        marker = (lab == model.config.tokens.streaming_word).float()
        stats = {"text_acc": (hit * text).sum() / text.sum(), "marker_acc": (hit * marker).sum() / marker.sum()}
    return loss, stats


class Trainer:
    def __init__(self, tc: TrainConfig) -> None:
        self.tc = tc
        self.out = Path(tc.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.device = torch.device(tc.device)
        if tc.world > 1 and self.device.type == "cuda":
            self.device = torch.device("cuda", tc.rank)  # one GPU per rank (distributed.py made it current)
        self.amp = self.device.type == "cuda"
        if self.amp:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            # cuDNN's SDPA builds a new plan for every new (batch, length) shape, and every batch has
            # new ones: measured on the H200, 10 ms (forward) + 13 ms (backward) of host time per call,
            # 230 ms per step of a 400 ms step. The flash/memory-efficient kernels need no plans.
            torch.backends.cuda.enable_cudnn_sdp(False)
        self.is_main = tc.rank == 0
        self.tokenizer = load_tokenizer(tc.tokenizer)
        self.cfg: ModelConfig = SIZES[tc.size].config(self.tokenizer.vocab_size - NUM_CONTROL_TOKENS)
        torch.manual_seed(tc.seed)
        self.model = VoxtralRealtime(self.cfg).to(self.device)
        init_weights(self.model)
        if tc.init_from:
            self.warm_start(Path(tc.init_from))
        add_residual_dropout(self.model, tc.dropout)  # hooks: active in train mode only
        # after the warm start: the average begins at the weights the run begins from
        self.ema = WeightAverage(self.model, tc.ema_decay) if tc.ema_decay > 0 else None
        decay = [p for n, p in self.model.named_parameters() if p.ndim >= 2 and "embed" not in n]
        rest = [p for n, p in self.model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": tc.weight_decay},
                                      {"params": rest, "weight_decay": 0.0}], lr=tc.lr, betas=(0.9, 0.98),
                                     eps=1e-8, fused=self.amp)
        self.corpus = Corpus(Path(tc.data), self.tokenizer, self.device, part=(tc.rank, tc.world))
        # rank 0 keeps the single-GPU batches of this seed; the other ranks draw their own
        self.batcher = StreamBatcher(self.cfg, self.corpus, tc.batch, tc.seed + 100_003 * tc.rank)
        self.forward: torch.nn.Module = self.model
        if tc.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            # broadcasts rank 0's weights at construction, so every rank starts from the same model
            self.forward = DistributedDataParallel(self.model, device_ids=[self.device.index] if self.amp else None)
        self._local_s = 0.0  # this rank's own training seconds and audio since the last agreement
        self._local_audio_s = 0.0
        self.val_corpus = Corpus(Path(tc.data), self.tokenizer, self.device, splits=("heldout",))
        self.step = 0
        self.train_s = 0.0
        self.history: dict[str, list] = {"step": [], "loss": [], "text_acc": [], "lr": [], "val_step": [],
                                         "val_loss": [], "val_text_acc": [], "audio_h": []}
        self.audio_seen_s = 0.0
        n = sum(p.numel() for p in self.model.parameters())
        if self.is_main:
            logger.info("model %s: %.2fM parameters (%.1f MB in fp16), vocab %d, device %s, %d rank(s)",
                        tc.size, n / 1e6, n * 2 / 1e6, self.cfg.decoder.vocab_size, self.device, tc.world)

    def warm_start(self, source: Path) -> None:
        """Weights from an exported model folder or a packed file (`realtime.train.warm`), e.g. an
        earlier run on another machine whose optimizer state could not travel; the architecture
        must be the one of `size`."""
        from .warm import load_warm_state

        state = load_warm_state(source)
        try:
            self.model.load_state_dict({k: v.to(self.device) for k, v in state.items()})
        except RuntimeError as exc:
            raise ValueError(f"{source} holds another architecture than size {self.tc.size!r}: {exc}") from exc
        logger.info("warm start from %s", source)

    # -- checkpoints ---------------------------------------------------------------------------
    @property
    def ckpt_path(self) -> Path:
        return self.out / "ckpt.pt"

    def save_checkpoint(self) -> None:
        state = {"model": self.model.state_dict(), "opt": self.opt.state_dict(), "step": self.step,
                 "train_s": self.train_s, "audio_seen_s": self.audio_seen_s, "history": self.history,
                 "train_config": asdict(self.tc), "ema": self.ema.state_dict() if self.ema else None}
        tmp = self.ckpt_path.with_suffix(".tmp")
        torch.save(state, tmp)
        tmp.replace(self.ckpt_path)
        self.plot()

    def load_checkpoint(self) -> bool:
        if not self.ckpt_path.exists():
            return False
        state = torch.load(self.ckpt_path, map_location=self.device, weights_only=False)
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        if self.ema is not None:
            if state.get("ema") is None:
                raise ValueError(f"{self.ckpt_path} has no weight average; resume with the run's own ema_decay")
            self.ema.load_state_dict(state["ema"])
        self.step, self.train_s = state["step"], state["train_s"]
        self.audio_seen_s, self.history = state["audio_seen_s"], state["history"]
        logger.info("resumed from %s at step %d (%.1f min trained)", self.ckpt_path, self.step, self.train_s / 60)
        return True

    def export(self, folder: Path | None = None, max_shard_bytes: int | None = None) -> Path:
        """fp16 weights + config + tokenizer: the shippable model folder (sharded if asked)."""
        folder = folder or self.out / "model"
        with self.shipped_weights():
            return self._export(folder, max_shard_bytes)

    def shipped_weights(self) -> AbstractContextManager[None]:
        """Inside it the model holds the weights that validation and export use: the average
        when `ema_decay` is set, else its own."""
        return self.ema.swapped_into(self.model) if self.ema is not None else nullcontext()

    def _export(self, folder: Path, max_shard_bytes: int | None) -> Path:
        if folder.exists():  # a previous export may have had another number of shards
            for old in list(folder.glob("*.safetensors")) + list(folder.glob("*.index.json")):
                old.unlink()
        model = VoxtralRealtime(self.cfg)
        model.load_state_dict({k: v.detach().cpu() for k, v in self.model.state_dict().items()})
        save_model(model.half(), folder, max_shard_bytes=max_shard_bytes)
        shutil.copy(Path(self.tc.tokenizer) / "tokenizer.json", folder / "tokenizer.json")
        (folder / "training.json").write_text(json.dumps(
            {"steps": self.step, "train_minutes": self.train_s / 60, "audio_hours_seen": self.audio_seen_s / 3600,
             "corpus_hours": self.corpus.hours, "corpus_voices": sorted(set(self.corpus.voices)),
             "data_parallel_ranks": self.tc.world,  # with several ranks, corpus_* describe rank 0's part
             "size": self.tc.size, "ema_decay": self.tc.ema_decay,
             "dropout": self.tc.dropout}, indent=2))
        return folder

    def plot(self) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        h = self.history
        if not h["step"]:
            return
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
        k = max(1, len(h["loss"]) // 200)
        sm = [sum(h["loss"][max(0, i - k):i + 1]) / len(h["loss"][max(0, i - k):i + 1]) for i in range(len(h["loss"]))]
        a1.plot(h["step"], h["loss"], alpha=0.3, label="train (per log)")
        a1.plot(h["step"], sm, label="train (smoothed)")
        if h["val_step"]:
            a1.plot(h["val_step"], h["val_loss"], "o-", label="held-out voices")
        a1.set_yscale("log")
        a1.set_xlabel("step")
        a1.set_ylabel("cross-entropy")
        a1.legend()
        a2.plot(h["step"], h["text_acc"], label="train text-token acc")
        if h["val_step"]:
            a2.plot(h["val_step"], h["val_text_acc"], "o-", label="held-out text-token acc")
        a2.set_xlabel("step")
        a2.set_ylim(0, 1)
        a2.legend()
        fig.tight_layout()
        fig.savefig(self.out / "loss.png", dpi=100)
        plt.close(fig)

    @staticmethod
    def _log_profile(profiler: torch.profiler.profile) -> None:
        """Where the profiled steps' time goes, host and device (the loop is host-bound when the
        device total is well below the host total)."""
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        profiler.__exit__(None, None, None)
        ka = profiler.key_averages()
        for key in ("self_cpu_time_total", "self_device_time_total"):
            logger.info("profile of the training steps by %s:\n%s", key,
                        ka.table(sort_by=key, row_limit=25, max_name_column_width=60))

    # -- loop ------------------------------------------------------------------------------------
    @torch.no_grad()
    def validate(self) -> tuple[float, float]:
        if not self.val_corpus.by_shard:
            return float("nan"), float("nan")
        self.model.eval()
        vb = StreamBatcher(self.cfg, self.val_corpus, validation_batches(self.tc.batch), seed=12345)
        losses, accs = [], []
        with self.shipped_weights():
            for i in range(self.tc.val_batches):
                loss, st = batch_loss(self.model, vb.batch(i), self.amp, self.tc.pad_weight)
                losses.append(float(loss))
                accs.append(float(st["text_acc"]))
        self.model.train()
        return sum(losses) / len(losses), sum(accs) / len(accs)

    def wait_for_data(self, timeout_s: float = 600.0) -> None:
        t0 = time.time()
        need = max(1, self.tc.min_utterances // self.tc.world)  # each rank reads its own part
        while True:
            self.corpus.refresh()
            if self.corpus.num_utterances >= need:
                break
            if time.time() - t0 > timeout_s:
                raise RuntimeError(f"no training data in {self.tc.data} (part {self.tc.rank} of {self.tc.world}) "
                                   f"after {timeout_s:.0f} s")
            time.sleep(2.0)
        if self.is_main:
            self.val_corpus.refresh()

    def _all_reduce(self, value: float, op: str) -> float:
        """`value` reduced over the ranks with "min", "max" or "sum" (a collective: all ranks call it)."""
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op={"min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "sum": dist.ReduceOp.SUM}[op])
        return float(t)

    def _agree(self) -> None:
        """Fold this rank's seconds into the values every rank decides by: the slowest rank's
        training time (budget and learning rate) and the audio of all ranks."""
        if self.tc.world == 1:
            self.train_s += self._local_s
            self.audio_seen_s += self._local_audio_s
        else:
            self.train_s += self._all_reduce(self._local_s, "max")
            self.audio_seen_s += self._all_reduce(self._local_audio_s, "sum")
        self._local_s = self._local_audio_s = 0.0

    def train(self, on_checkpoint: Callable[[Trainer], None] | None = None, until_step: int | None = None
              ) -> None:
        """Steps until a budget ends (or `until_step`, as if the run were stopped there; the schedule
        still follows the budgets); `on_checkpoint` runs (on rank 0) after every checkpoint (e.g. an
        export)."""
        tc = self.tc
        self.wait_for_data()
        if tc.world > 1 and tc.max_minutes:
            # the ranks finished waiting at different times: the budget is the smallest one left
            tc.max_minutes = self._all_reduce(tc.max_minutes, "min")
        self.model.train()
        last_ckpt_t, t_log = time.time(), time.time()
        profiler: torch.profiler.profile | None = None
        budget_s = tc.max_minutes * 60 if tc.max_minutes else math.inf
        last = tc.max_steps if until_step is None else min(until_step, tc.max_steps)
        sync_every = 1 if tc.world == 1 else tc.sync_every
        while self.step < last and self.train_s < budget_s:
            t0 = time.time()
            if self.is_main and tc.profile_at is not None and self.step == tc.profile_at:
                profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]
                                                  + ([torch.profiler.ProfilerActivity.CUDA] if self.amp else []))
                profiler.__enter__()  # spans several iterations, so no `with`
            if self.step % tc.refresh_every == 0:
                self.corpus.refresh()
            batch = self.batcher.batch(self.step)
            lr = lr_at(tc, self.step, self.train_s)
            for g in self.opt.param_groups:
                g["lr"] = lr
            loss, st = batch_loss(self.model, batch, self.amp, tc.pad_weight, self.forward)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), tc.grad_clip)
            self.opt.step()
            if self.ema is not None:
                self.ema.update(self.model)
            self.step += 1
            self._local_audio_s += batch.audio_seconds
            if profiler is not None and self.step == tc.profile_at + 3:
                self._log_profile(profiler)
                profiler = None
            if self.is_main and (self.step % tc.log_every == 0 or self.step == 1):
                t_wait = time.time()
                lv = float(loss.detach())  # the only GPU sync of the loop, once per log line
                # share of the interval the host spent waiting for the GPU: near 0 = input-bound
                wait = (time.time() - t_wait) / max(1e-9, time.time() - t_log)
                text_acc, marker_acc = float(st["text_acc"]), float(st["marker_acc"])
                h = self.history
                h["step"].append(self.step)
                h["loss"].append(lv)
                h["text_acc"].append(text_acc)
                h["lr"].append(lr)
                h["audio_h"].append(self.audio_seen_s / 3600)
                rate = tc.log_every / max(1e-9, time.time() - t_log) if self.step > 1 else 0.0
                t_log = time.time()
                line = (f"step {self.step} loss {lv:.4f} text_acc {text_acc:.3f} marker_acc "
                        f"{marker_acc:.3f} lr {lr:.2e} | {rate:.1f} it/s, gpu-wait {wait:.0%} | data {self.corpus.hours:.2f} h "
                        f"({len(self.corpus.by_shard)} shards) seen {self.audio_seen_s / 3600:.1f} h | "
                        f"{self.train_s / 60:.1f} min")
                print("\r" + line, file=sys.stderr, flush=True, end="\n" if not sys.stderr.isatty() else "")
                if self.step % (10 * tc.log_every) == 0:
                    progress_log.info("%s", line)  # for log files (gpu_run sends it to run.log only)
            if self.is_main and self.step % tc.val_every == 0:
                vl, va = self.validate()
                self.history["val_step"].append(self.step)
                self.history["val_loss"].append(vl)
                self.history["val_text_acc"].append(va)
                logger.info("step %d held-out voices: loss %.4f text_acc %.3f", self.step, vl, va)
            self._local_s += time.time() - t0
            if self.step % sync_every == 0 or self.step == last:
                self._agree()  # every rank reaches this at the same steps
            if self.is_main and (time.time() - last_ckpt_t > tc.ckpt_every_s or self.step % tc.ckpt_every_steps == 0):
                self.save_checkpoint()
                if on_checkpoint is not None:
                    on_checkpoint(self)
                last_ckpt_t = time.time()
        if profiler is not None:  # the budget ended inside the profiled steps
            self._log_profile(profiler)
        if sys.stderr.isatty():
            print(file=sys.stderr)
        if self.is_main:
            self.save_checkpoint()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", default="base-384", choices=sorted(SIZES))
    ap.add_argument("--device", default=None)
    ap.add_argument("--max-steps", type=int, default=100_000)
    ap.add_argument("--max-minutes", type=float, default=None)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--warmup-steps", type=int, default=300)
    ap.add_argument("--tokens-per-batch", type=int, default=16384)
    ap.add_argument("--max-seconds", type=float, default=20.0, help="longest stream (user audio)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true", help="continue from OUT/ckpt.pt if present")
    ap.add_argument("--init-from", default=None,
                    help="exported model folder or packed file (realtime.train.warm) to start from (fresh optimizer)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--ema-decay", type=float, default=0.0,
                    help="validate and export a moving average of the weights with this decay (0 = last step's)")
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="training-only dropout on every attention and MLP output (realtime.train.regularize)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    tc = TrainConfig(data=args.data, tokenizer=args.tokenizer, out=args.out, size=args.size, seed=args.seed,
                     max_steps=args.max_steps, max_minutes=args.max_minutes, lr=args.lr,
                     warmup_steps=args.warmup_steps, init_from=args.init_from, ema_decay=args.ema_decay,
                     dropout=args.dropout,
                     batch=BatchConfig(tokens_per_batch=args.tokens_per_batch, max_seconds=args.max_seconds))
    if args.device:
        tc.device = args.device
    trainer = Trainer(tc)
    if args.resume:
        trainer.load_checkpoint()
    trainer.train()
    folder = trainer.export()
    logger.info("exported %s", folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
