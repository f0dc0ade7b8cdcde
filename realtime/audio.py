"""Audio front-end: log-mel features (offline and incremental), streaming resampling, file loading.

The log-mel is the Whisper/Voxtral recipe (DESIGN §1.1): Hann window of `n_fft` samples, hop
`hop_length`, power spectrum without the last STFT frame, Slaney mel filters, `log10`, a floor at the
*fixed* `global_log_mel_max - 8`, then `(x + 4) / 4`.

Frame `i` of a stream covers samples `[hop*i - n_fft/2, hop*i + n_fft/2)`. transformers' centred
STFT reflect-pads the start; since every Voxtral stream begins with a long run of zero samples
(the left padding), that reflection is zeros too, so here the stream is simply zero-extended.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import threading
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

from .config import AudioFrontendConfig, ModelConfig

logger = logging.getLogger(__name__)


class AudioError(ValueError):
    """Audio input that cannot be used: wrong shape, non-finite samples, unsupported file or rate."""


# ---------------------------------------------------------------------------------------
# Mel filters (Slaney scale, Slaney area normalisation), computed in float64.
# ---------------------------------------------------------------------------------------
_F_SP = 200.0 / 3.0  # Hz per mel in the linear part of the Slaney scale
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = math.log(6.4) / 27.0


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    hz = np.asarray(hz, dtype=np.float64)
    mel = hz / _F_SP
    log_region = hz >= _MIN_LOG_HZ
    mel[log_region] = _MIN_LOG_MEL + np.log(hz[log_region] / _MIN_LOG_HZ) / _LOGSTEP
    return mel


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    hz = mel * _F_SP
    log_region = mel >= _MIN_LOG_MEL
    hz[log_region] = _MIN_LOG_HZ * np.exp(_LOGSTEP * (mel[log_region] - _MIN_LOG_MEL))
    return hz


def slaney_mel_filters(n_fft: int, n_mels: int, sampling_rate: int, fmax: float) -> np.ndarray:
    """Triangular mel filters, shape (n_mels, n_fft // 2 + 1), float64."""
    n_freqs = n_fft // 2 + 1
    fft_hz = np.linspace(0.0, sampling_rate // 2, n_freqs)
    edges_hz = _mel_to_hz(np.linspace(_hz_to_mel(np.array([0.0]))[0], _hz_to_mel(np.array([fmax]))[0], n_mels + 2))
    widths = np.diff(edges_hz)
    # Slopes of each triangle at every FFT bin: rising edge then falling edge, clipped at 0.
    offsets = edges_hz[:, None] - fft_hz[None, :]
    rising = -offsets[:-2] / widths[:-1, None]
    falling = offsets[2:] / widths[1:, None]
    filters = np.maximum(0.0, np.minimum(rising, falling))
    filters *= (2.0 / (edges_hz[2:] - edges_hz[:-2]))[:, None]
    return filters


def normalised_log_mel(mel: torch.Tensor, cfg: AudioFrontendConfig) -> torch.Tensor:
    """Mel power -> the model's features: `log10`, floored at the fixed `global_log_mel_max - 8`, then
    `(x + 4) / 4` (DESIGN §1.1). The one place the rule is written (host front-end and training)."""
    log_spec = torch.clamp(mel, min=1e-10).log10()
    log_spec = torch.clamp(log_spec, min=cfg.global_log_mel_max - 8.0)
    return (log_spec + 4.0) / 4.0


def log_mel_floor(cfg: AudioFrontendConfig) -> float:
    """The feature value of a silent (or floored) bin under `normalised_log_mel`."""
    return (cfg.global_log_mel_max - 8.0 + 4.0) / 4.0


@functools.lru_cache(maxsize=8)
def _mel_constants(n_fft: int, n_mels: int, sampling_rate: int, fmax: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(Hann window, mel filters) in float64, computed once per front-end configuration: every stream
    has a front-end, and building the filters took ~2.7 ms, paid by the server's event loop at each
    stream open (a load test's profile). Shared read-only: nothing writes them."""
    return (torch.hann_window(n_fft, dtype=torch.float64),
            torch.from_numpy(slaney_mel_filters(n_fft, n_mels, sampling_rate, fmax)))


@dataclass
class LogMel:
    """Stateless log-mel of windowed frames; shared by the offline and incremental paths.

    The arithmetic runs in float64 whatever the output dtype: quiet bins lose several digits to
    cancellation in a float32 FFT, and the front-end costs nothing next to the network.
    It runs on the device of its input: a GPU engine sends the raw sample windows to the GPU and
    computes there, because a batched float64 FFT on the host sits on the step's critical path and
    its time there has a heavy tail (allocator and thread-pool hiccups of tens of milliseconds, seen
    in the engine benchmark's step trace).
    """

    cfg: AudioFrontendConfig
    dtype: torch.dtype = torch.float32
    window: torch.Tensor = field(init=False)
    filters: torch.Tensor = field(init=False)
    _on_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = field(
        init=False, default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.window, self.filters = _mel_constants(self.cfg.n_fft, self.cfg.num_mel_bins, self.cfg.sampling_rate,
                                                   self.cfg.mel_fmax)

    def _constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(window, filters) on `device`, copied there once."""
        if device.type == "cpu":
            return self.window, self.filters
        if device not in self._on_device:
            self._on_device[device] = (self.window.to(device), self.filters.to(device))
        return self._on_device[device]

    def samples_needed(self, num_frames: int) -> int:
        return self.cfg.hop_length * (num_frames - 1) + self.cfg.n_fft

    def from_padded(self, padded: torch.Tensor, num_frames: int) -> torch.Tensor:
        """Log-mel of frames starting every hop in `padded` [..., N] (frame k starts at sample hop*k).

        Returns [..., num_mel_bins, num_frames]; leading dims are a batch of independent windows.
        """
        n_fft, hop = self.cfg.n_fft, self.cfg.hop_length
        need = self.samples_needed(num_frames)
        if padded.shape[-1] < need:
            raise AudioError(f"internal: {num_frames} frames need {need} samples, have {padded.shape[-1]}")
        window, filters = self._constants(padded.device)
        frames = padded[..., :need].to(torch.float64).unfold(-1, n_fft, hop)  # [..., num_frames, n_fft]
        spec = torch.fft.rfft(frames * window, dim=-1)
        power = spec.real.square() + spec.imag.square()
        mel = filters @ power.transpose(-1, -2)  # [..., n_mels, num_frames]
        return normalised_log_mel(mel, self.cfg).to(self.dtype)


def log_mel_spectrogram(audio: np.ndarray | torch.Tensor, cfg: AudioFrontendConfig,
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Offline log-mel of a whole (already padded) clip: frames `0 .. len//hop - 1`.

    Equals transformers' `VoxtralRealtimeFeatureExtractor` on audio that starts and ends with at
    least `n_fft/2` zero samples (every padded Voxtral input does).
    """
    x = torch.as_tensor(np.asarray(audio)).to(torch.float64).reshape(-1)
    half = cfg.n_fft // 2
    num_frames = x.numel() // cfg.hop_length  # centred STFT gives len//hop + 1 frames; the last is dropped
    padded = torch.cat([torch.zeros(half, dtype=torch.float64), x, torch.zeros(half, dtype=torch.float64)])
    return LogMel(cfg, dtype).from_padded(padded, num_frames)


class IncrementalLogMel:
    """Log-mel frames from audio arriving in arbitrary chunks.

    Keeps only the samples that later frames still need. `available()` says how many new frames
    can be computed; `compute(n)` returns exactly those frames, identical to the offline frames of
    the same audio whatever the chunking was. Appending and consuming are amortised O(1) per
    sample, so a long recording pushed at once costs no more than the same audio in small chunks.
    """

    def __init__(self, cfg: AudioFrontendConfig, dtype: torch.dtype = torch.float32) -> None:
        self.cfg = cfg
        self._mel = LogMel(cfg, dtype)
        self._dtype = dtype
        half = cfg.n_fft // 2
        # _buf[_lo:_hi] holds stream samples from `_first` on; the stream is zero-extended before 0.
        # numpy, not torch: a push is a few small copies, and torch's per-call overhead made each
        # 80 ms chunk cost ~25 us of the engine thread (`window` hands out torch views of it)
        self._buf = np.zeros(max(4 * cfg.n_fft, 4096), dtype=np.float32)
        self._lo, self._hi = 0, half
        self._first = -half
        self._next_frame = 0
        self.samples_received = 0

    @classmethod
    def for_stream(cls, cfg: ModelConfig) -> "IncrementalLogMel":
        """The front-end of a new stream: already holding the stream's left padding of silence."""
        mel = cls(cfg.audio)
        mel.push(np.zeros(cfg.left_pad_samples, dtype=np.float32))
        return mel

    def push(self, samples: torch.Tensor | np.ndarray) -> None:
        s = np.asarray(samples, dtype=np.float32).reshape(-1)
        n = s.size
        if not n:
            return
        if self._hi + n > self._buf.size:
            live = self._hi - self._lo
            cap = max(self._buf.size, 2 * (live + n))
            new = np.empty(cap, dtype=np.float32)
            new[:live] = self._buf[self._lo: self._hi]
            self._buf, self._lo, self._hi = new, 0, live
        self._buf[self._hi: self._hi + n] = s
        self._hi += n
        self.samples_received += n

    def available(self) -> int:
        """Frames whose whole window has arrived and that were not computed yet."""
        half, hop = self.cfg.n_fft // 2, self.cfg.hop_length
        # frame i is complete when hop*i + half <= samples_received
        if self.samples_received < half:
            return 0
        last_complete = (self.samples_received - half) // hop
        return max(0, last_complete + 1 - self._next_frame)

    @property
    def frames_done(self) -> int:
        return self._next_frame

    def window_samples(self, n: int) -> np.ndarray:
        """The samples the next `n` frames read, a view of the buffer (for batched computation by an engine: a
        numpy view costs a fraction of a tensor's, which counts at hundreds of streams a step)."""
        if n > self.available():
            raise AudioError(f"internal: asked for {n} mel frames, only {self.available()} available")
        start = self._lo + self.cfg.hop_length * self._next_frame - self.cfg.n_fft // 2 - self._first
        return self._buf[start: start + self._mel.samples_needed(n)]

    def window(self, n: int) -> torch.Tensor:
        """`window_samples` as a tensor."""
        return torch.from_numpy(self.window_samples(n))

    def compute(self, n: int, device: torch.device | str | None = None) -> torch.Tensor:
        """The next `n` frames [num_mel_bins, n], computed on `device` (default: the host)."""
        if n <= 0:
            return torch.zeros(self.cfg.num_mel_bins, 0, dtype=self._dtype, device=device)
        window = self.window(n)
        if device is not None:
            window = window.to(device)
        out = self._mel.from_padded(window, n)
        self.advance(n)
        return out

    def advance(self, n: int) -> None:
        """Mark `n` frames as computed and forget samples no later frame needs."""
        self._next_frame += n
        keep_from = self.cfg.hop_length * self._next_frame - self.cfg.n_fft // 2  # stream index
        drop = keep_from - self._first
        if drop > 0:
            self._lo += drop
            self._first = keep_from

    @property
    def buffered_samples(self) -> int:
        return self._hi - self._lo


# ---------------------------------------------------------------------------------------
# Input validation
# ---------------------------------------------------------------------------------------
def as_mono_float32(samples: object, *, what: str = "audio", owned: bool = False) -> np.ndarray:
    """Validate samples: a 1-D (or [1, N]) finite float array. Returns a float32 numpy array; with `owned`, one
    that shares no memory with `samples` (for callers that keep it: a client may reuse its buffer once the call
    returns)."""
    if isinstance(samples, torch.Tensor):
        t = samples.detach().cpu()
        if t.is_floating_point() and t.dtype not in (torch.float32, torch.float64):
            t = t.float()  # bfloat16 has no numpy dtype; float16 is converted the same way
        try:
            arr = t.numpy()
        except (TypeError, RuntimeError) as exc:
            raise AudioError(f"{what} must be a real float tensor, got {t.dtype}: {exc}") from exc
    elif isinstance(samples, (list, tuple)):
        try:
            arr = np.asarray(samples, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise AudioError(f"{what} must be a sequence of numbers: {exc}") from exc
    elif isinstance(samples, np.ndarray):
        arr = samples
    else:
        raise AudioError(f"{what} must be a numpy array, torch tensor or list of floats, got {type(samples).__name__}")
    if arr.ndim == 2 and 1 in arr.shape:
        arr = arr.reshape(-1)
    if arr.ndim != 1:
        raise AudioError(f"{what} must be mono 1-D samples, got an array of shape {tuple(arr.shape)}")
    if arr.dtype.kind not in "fiu":
        raise AudioError(f"{what} must hold numbers, got dtype {arr.dtype}")
    if arr.dtype.kind in "iu":
        raise AudioError(f"{what} must be float samples in [-1, 1], got integer dtype {arr.dtype}; convert PCM first")
    fresh = arr.dtype != np.float32  # the conversion below makes a new array
    arr = arr.astype(np.float32, copy=False)
    if owned and not fresh:
        arr = arr.copy()
    if not np.isfinite(arr).all():
        bad = int((~np.isfinite(arr)).sum())
        raise AudioError(f"{what} contains {bad} NaN or infinite sample(s)")
    return arr


def pcm16_to_float(data: bytes) -> np.ndarray:
    """Little-endian signed 16-bit PCM bytes -> float32 in [-1, 1)."""
    if len(data) % 2:
        raise AudioError(f"PCM16 audio must have an even number of bytes, got {len(data)}")
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


# ---------------------------------------------------------------------------------------
# Streaming resampler (windowed-sinc polyphase FIR)
# ---------------------------------------------------------------------------------------
class StreamingResampler:
    """Rational-ratio resampler that accepts chunks and returns the output ready so far.

    Output sample n sits at input time n * in_rate / out_rate; it is computed once the filter's
    right half has arrived, so any chunking gives the same samples as one call with everything
    followed by `flush()`. Kaiser-windowed sinc, `zero_crossings` lobes each side.
    """

    OUTPUT_BLOCK = 1024  # outputs computed together (see _emit)
    # filter coefficients at most (16 MB): every common rate needs under 50,000 and 16,001 Hz 1.1 M; an odd rate near
    # 384 kHz (its ratio to 16 kHz in lowest terms has 16,000 phases) would need 26 M, with gigabytes of temporaries
    MAX_TABLE = 1 << 21

    def __init__(self, in_rate: int, out_rate: int, zero_crossings: int = 32, rolloff: float = 0.945,
                 beta: float = 8.6) -> None:
        if in_rate <= 0 or out_rate <= 0:
            raise AudioError(f"sample rates must be positive, got {in_rate} -> {out_rate}")
        ratio = Fraction(out_rate, in_rate)
        self.up, self.down = ratio.numerator, ratio.denominator  # out = in * up / down
        self.in_rate, self.out_rate = in_rate, out_rate
        self.identity = self.up == self.down == 1
        cutoff = min(1.0, self.up / self.down) * rolloff  # fraction of the input Nyquist
        self.half_taps = int(math.ceil(zero_crossings / cutoff))
        taps = 2 * self.half_taps
        if self.up * taps > self.MAX_TABLE:  # one row of taps per output phase
            raise AudioError(f"resampling {in_rate} Hz to {out_rate} Hz is not supported: its filter would hold "
                             f"{self.up * taps * 8 / 2**20:.0f} MB (use a common sample rate)")
        # table[phase, j] weights input sample base - half_taps + 1 + j for output phase `phase`
        j = np.arange(taps) - self.half_taps + 1
        phases = np.arange(self.up) / self.up  # fractional position of the output inside [base, base+1)
        t = phases[:, None] - j[None, :]  # distance (in input samples) from output time to each tap
        window = np.kaiser(2 * self.half_taps + 1, beta)
        # evaluate the Kaiser window continuously by interpolation over its support [-half, half]
        win = np.interp(t, np.linspace(-self.half_taps, self.half_taps, window.size), window, left=0.0, right=0.0)
        self.table = (cutoff * np.sinc(cutoff * t) * win).astype(np.float64)
        self._offsets = j
        self._buf = np.zeros(self.half_taps, dtype=np.float64)  # history before sample 0 is silence
        self._buf_start = -self.half_taps
        self._n_in = 0
        self._n_out = 0
        self._flushed = False

    def _emit(self, final: bool) -> np.ndarray:
        if final:
            n_total = (self._n_in * self.up + self.down - 1) // self.down  # ceil(n_in * out/in)
        else:
            # output n needs input up to base + half_taps where base = floor(n*down/up)
            last_in = self._n_in - 1 - self.half_taps
            n_total = 0 if last_in < 0 else ((last_in + 1) * self.up - 1) // self.down + 1
        n_total = max(n_total, self._n_out)
        if n_total == self._n_out:
            return np.zeros(0, dtype=np.float32)
        buf = self._buf
        if final:  # the last output's last tap (offsets ascend) may lie past the input: silence
            pad = ((n_total - 1) * self.down) // self.up + int(self._offsets[-1]) - self._buf_start + 1 - buf.size
            if pad > 0:
                buf = np.concatenate([buf, np.zeros(pad)])
        # in blocks of outputs, so that the [outputs, taps] temporaries stay small: in one piece, a 98 s append
        # made 2.5 GB of them and ran 17x slower per sample than 20 ms appends. Each output's sum is the same
        # row reduction at any block size, so the samples do not depend on the blocks (or on the chunking)
        out = np.empty(n_total - self._n_out, dtype=np.float64)
        for start in range(self._n_out, n_total, self.OUTPUT_BLOCK):
            n = np.arange(start, min(start + self.OUTPUT_BLOCK, n_total))
            base = (n * self.down) // self.up
            phase = (n * self.down) % self.up
            idx = base[:, None] + self._offsets[None, :] - self._buf_start
            out[start - self._n_out: start - self._n_out + n.size] = (buf[idx] * self.table[phase]).sum(axis=1)
        self._n_out = n_total
        # keep only what later outputs need
        next_base = (self._n_out * self.down) // self.up
        keep_from = next_base - self.half_taps + 1 - self._buf_start
        if keep_from > 0:
            self._buf = self._buf[keep_from:]
            self._buf_start += keep_from
        return out.astype(np.float32)

    def push(self, samples: np.ndarray) -> np.ndarray:
        if self._flushed:
            raise AudioError("resampler already flushed")
        if self.identity:
            return samples.astype(np.float32, copy=False)
        x = np.asarray(samples, dtype=np.float64).reshape(-1)
        self._buf = np.concatenate([self._buf, x])
        self._n_in += x.size
        return self._emit(final=False)

    def flush(self) -> np.ndarray:
        if self._flushed:
            return np.zeros(0, dtype=np.float32)
        self._flushed = True
        if self.identity:
            return np.zeros(0, dtype=np.float32)
        return self._emit(final=True)


def resample(audio: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    r = StreamingResampler(in_rate, out_rate)
    return np.concatenate([r.push(audio), r.flush()])


# ---------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------
SUPPORTED_FILE_FORMATS = ("WAV", "FLAC", "OGG", "MP3")  # OGG: Vorbis or Opus inside


class AudioTooLong(AudioError):
    """The file holds more audio than the caller accepts (`max_seconds`)."""


DECODE_BLOCK_FRAMES = 1 << 16  # frames decoded at a time: memory peaks at the 16 kHz mono result, not the source's
MIN_FILE_RATE, MAX_FILE_RATE = 1000, 384_000  # sample rates a file may state (telephony to studio)


def load_audio_file(path: str | Path, target_rate: int = 16000, *, max_seconds: float | None = None) -> np.ndarray:
    """Read a WAV, FLAC, Ogg (Vorbis/Opus) or MP3 file as mono float32 at `target_rate` (mixing channels,
    resampling); AudioTooLong past `max_seconds` of audio."""
    p = Path(path)
    if not p.is_file():
        raise AudioError(f"audio file {p} does not exist")
    return _read_sound(str(p), str(p), target_rate, max_seconds)


def decode_audio_bytes(data: bytes, target_rate: int = 16000, *, name: str = "the upload",
                       max_seconds: float | None = None, cancelled: threading.Event | None = None) -> np.ndarray:
    """`load_audio_file` for a file's bytes held in memory (an HTTP upload); AudioError names `name`. A few MB of
    compressed silence can hold days of audio: `max_seconds` stops the decoding there (AudioTooLong). Setting
    `cancelled` (from another thread) stops it at the next block (AudioError)."""
    import io

    if not data:
        raise AudioError(f"{name}: the file is empty")
    return _read_sound(io.BytesIO(data), name, target_rate, max_seconds, cancelled)


def _read_sound(source: object, name: str, target_rate: int, max_seconds: float | None = None,
                cancelled: threading.Event | None = None) -> np.ndarray:
    import soundfile as sf

    try:
        info = sf.info(source)
        if hasattr(source, "seek"):
            source.seek(0)  # type: ignore[attr-defined]
    except Exception as exc:  # soundfile raises its own error types, plus RuntimeError/TypeError
        reason = re.sub(r"^Error opening .*?: ", "", str(exc))  # the name is already said (and a buffer has none)
        raise AudioError(
            f"{name}: not a readable audio file (supported: {', '.join(SUPPORTED_FILE_FORMATS)}): {reason}"
        ) from exc
    if info.format not in SUPPORTED_FILE_FORMATS:
        raise AudioError(f"{name}: format {info.format} is not supported (use {', '.join(SUPPORTED_FILE_FORMATS)})")
    if not MIN_FILE_RATE <= info.samplerate <= MAX_FILE_RATE:  # a header can claim any rate
        raise AudioError(f"{name}: a sample rate of {info.samplerate} Hz is not supported "
                         f"({MIN_FILE_RATE}-{MAX_FILE_RATE} Hz)")
    limit = None if max_seconds is None else int(max_seconds * target_rate)

    def too_long() -> AudioTooLong:
        return AudioTooLong(f"{name}: longer than the {max_seconds:g} s of audio accepted")

    # the header's length, where it states one (libsndfile reports 2**63 - 1 frames for a stream of unknown length,
    # such as a FLAC written to a pipe: then the decoding below counts)
    if limit is not None and info.frames < 2**62 and info.frames / info.samplerate > max_seconds * 1.01:
        raise too_long()
    # block by block (mixed and resampled as they come: the streaming resampler gives the same samples in any
    # chunking), so that memory holds the 16 kHz mono result and one block, never the whole source
    resampler = StreamingResampler(info.samplerate, target_rate) if info.samplerate != target_rate else None
    pieces: list[np.ndarray] = []
    total = frames = 0
    try:
        for block in sf.blocks(source, blocksize=DECODE_BLOCK_FRAMES, dtype="float32", always_2d=True):
            if cancelled is not None and cancelled.is_set():
                raise AudioError(f"{name}: decoding cancelled")
            frames += block.shape[0]
            mono = block.mean(axis=1) if block.shape[1] > 1 else block[:, 0]
            mono = as_mono_float32(mono, what=name)
            piece = resampler.push(mono) if resampler is not None else mono.copy()
            pieces.append(piece)
            total += piece.size
            if limit is not None and total > limit:  # compressed files can say less than they hold
                raise too_long()
    except AudioError:
        raise
    except Exception as exc:  # a header that reads but a body that does not (truncated files)
        raise AudioError(f"{name}: the audio could not be decoded: {exc}") from exc
    if frames == 0:
        raise AudioError(f"{name}: the file holds no audio samples")
    if resampler is not None:
        pieces.append(resampler.flush())
    return np.concatenate(pieces)
