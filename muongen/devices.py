"""Choosing the torch device, the same way for training, sampling and evaluation."""

from __future__ import annotations

import torch

from muongen.errors import ConfigError


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` picks cuda, then mps, then cpu; anything else (``cpu``, ``cuda:1``) is passed
    to torch.device. A device that is asked for but absent is a ConfigError."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(
            f"device {name!r} is not a torch device ({exc}); use auto, cpu, cuda or mps"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} asked for but CUDA is not available; use cpu or auto")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device {name!r} asked for but MPS is not available; use cpu or auto")
    return device
