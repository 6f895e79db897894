"""The optimizers of the GAN step and their learning-rate schedule.

The learning rate follows a pure function of the generator step (:func:`lr_factor`:
warm-up, then constant or cosine), so nothing about it needs saving. The optimizers are
fused where torch has fused kernels (:func:`make_optimizer`): those kernels read the
step's skip flag on the device (``found_inf``; :meth:`muongen.train.step.GanStep._apply`).
"""

from __future__ import annotations

import math

import torch

from muongen.config import OptimConfig


def lr_factor(
    step: int, *, schedule: str, warmup_steps: int, decay_steps: int, min_lr_ratio: float
) -> float:
    """Learning rate / peak at generator step ``step`` (0-based)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    t = min(1.0, (step - warmup_steps) / max(1, decay_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * t))


def make_optimizer(
    params, cfg: OptimConfig, lr: float, device: torch.device
) -> torch.optim.Optimizer:
    """AdamW (decoupled weight decay; Adam when it is 0) or SGD with momentum.

    Fused kernels where torch has them (CUDA, CPU): they accept the skip flag on device.
    """
    params = list(params)
    fused = device.type in ("cuda", "cpu")
    if cfg.optimizer == "adam":
        return torch.optim.AdamW(
            params,
            lr=lr,
            betas=(cfg.betas[0], cfg.betas[1]),
            weight_decay=cfg.weight_decay,
            fused=fused or None,
        )
    opt = torch.optim.SGD(
        params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, fused=fused or None
    )
    if fused and cfg.momentum > 0:
        # zero buffers up front: fused SGD would otherwise create them uninitialised on its
        # first step, and a skipped first step would leave garbage in them
        for p in params:
            opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
    return opt


def host_rates(state: dict) -> dict:
    """An optimizer state with device-tensor learning rates (``train.cuda_graphs``) saved
    as floats, as without graphs: a checkpoint does not depend on how the step ran."""
    for group in state["state"].get("param_groups", []):
        if torch.is_tensor(group.get("lr")):
            group["lr"] = float(group["lr"])
    return state
