"""Choosing between a Triton kernel and its torch reference (shared by every kernel module)."""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import Literal

import torch

Backend = Literal["auto", "triton", "torch"]

HAVE_TRITON: bool = importlib.util.find_spec("triton") is not None


def use_triton(backend: str, device: torch.device) -> bool:
    """True when the Triton kernel should run for tensors on `device`.

    "auto" picks Triton for CUDA tensors only: the references are the CPU implementation. "triton"
    forces the kernel (on CPU tensors that needs `TRITON_INTERPRET=1` before triton is imported).
    """
    if backend == "torch":
        return False
    if backend == "auto":
        return device.type == "cuda" and HAVE_TRITON
    if backend == "triton":
        if not HAVE_TRITON:
            raise RuntimeError("backend='triton' requested but triton is not installed")
        return True
    raise ValueError(f"backend must be 'auto', 'triton' or 'torch', got {backend!r}")


def env_int(name: str, default: int, lo: int, hi: int, what: str) -> int:
    """The integer environment switch `name` (read now: kernels read theirs at launch, so at graph capture), or
    `default` when unset; a value outside lo..hi or not an integer is refused as "`name` must be `what`"."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = lo - 1
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be {what}, got {text!r}")
    return value


def check_index_tensor(name: str, t: torch.Tensor, length: int, device: torch.device) -> None:
    """Shape/dtype checks only (no values: reading them would sync the host with the GPU)."""
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    if t.shape != (length,):
        raise ValueError(f"{name} must have shape ({length},), got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")


FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@functools.cache
def _compute_capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def pdl_enabled(device: torch.device) -> bool:
    """Whether Triton kernels on `device` launch with programmatic dependent launch (PDL, sm_90+).

    With PDL a kernel may start while the kernel before it on the stream is still running: it
    becomes resident, requests the weights it will need (they never depend on the previous kernel),
    and only then waits (`griddepcontrol.wait`) for the previous kernel's results. At batch 1 a step
    is a chain of ~300 dependent kernels that each pay a fill-and-drain of a few microseconds; PDL
    overlaps that with the previous kernel's tail. Every kernel that launches with PDL waits before it
    reads activations or writes anything, so it is safe after any kernel (one that never signals is
    treated as signalling at its end). STREAMSCRIBE_PDL=0 turns it off (benchmarks A/B it).
    """
    if (device.type != "cuda" or os.environ.get("TRITON_INTERPRET", "0") == "1"
            or os.environ.get("STREAMSCRIBE_PDL", "1") == "0"):
        return False
    return _compute_capability(device.index if device.index is not None else torch.cuda.current_device())[0] >= 9


def pdl_launch_args(device: torch.device) -> dict[str, bool]:
    """Keyword arguments of a Triton launch of a kernel with a `USE_GDC` constexpr."""
    return {"USE_GDC": True, "launch_pdl": True} if pdl_enabled(device) else {"USE_GDC": False}
