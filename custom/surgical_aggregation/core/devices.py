"""Which torch device a site's setting means."""

from __future__ import annotations

import torch

from .errors import SiteConfigError


def resolve_device(spec: str = "auto") -> torch.device:
    """ "auto" -> CUDA when available, else CPU; otherwise the named device ("cpu", "cuda:1")."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SiteConfigError(f"device {spec!r} requested but CUDA is not available on this machine")
    return device
