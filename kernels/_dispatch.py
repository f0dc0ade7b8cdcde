"""Choosing between a Triton kernel and its torch reference (shared by every kernel module)."""

from __future__ import annotations

import importlib.util
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


def check_index_tensor(name: str, t: torch.Tensor, length: int, device: torch.device) -> None:
    """Shape/dtype checks only (no values: reading them would sync the host with the GPU)."""
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    if t.shape != (length,):
        raise ValueError(f"{name} must have shape ({length},), got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")


FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
