"""Which torch device a site's setting means."""

from __future__ import annotations

import os

import torch

from .errors import SiteConfigError

AUTO = "auto"  # a setting the machine decides: the device, the loader's workers


def resolve_device(spec: str = AUTO) -> torch.device:
    """ "auto" -> CUDA when available, else CPU; otherwise the named device ("cpu", "cuda:1")."""
    if spec == AUTO:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SiteConfigError(f"device {spec!r} requested but CUDA is not available on this machine")
    return device


MAX_AUTO_WORKERS = 8


def auto_workers(device: torch.device, cpu_count: int | None = None) -> int:
    """DataLoader worker processes for ``workers: auto``.

    On a GPU, up to 8, leaving a core to the training process: reading cached uint8 images is all the
    workers do, and the GPU must not wait for them. On a CPU, none: the training process's threads use
    every core, and a worker would compete with them for the same cores.
    """
    if device.type != "cuda":
        return 0
    cores = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
    return max(0, min(MAX_AUTO_WORKERS, cores - 1))


def resolve_workers(workers: int | str, device: torch.device) -> int:
    return auto_workers(device) if workers == AUTO else int(workers)


def autocast_dtype(device: torch.device, amp: bool) -> torch.dtype | None:
    """Mixed precision on CUDA: bf16 where the GPU supports it (no loss scaling needed), else fp16; None
    (full precision) on a CPU or with ``amp`` off."""
    if not amp or device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
