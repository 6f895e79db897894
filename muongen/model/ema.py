"""An exponential moving average (EMA) of the generator's weights, for sampling.

GAN weights oscillate around the equilibrium the two players chase; the average of the
generator's recent weights sits closer to it than any single iterate (Yazici et al.,
"The unusual effectiveness of averaging in GAN training", ICLR 2019). The trainer updates
the average after every generator step and saves it in every checkpoint; sampling,
evaluation, validation and export use it when a checkpoint has one
(:func:`muongen.inference.load_for_inference`). Training itself never reads it.

The decay warms up as min(decay, (1 + t) / (10 + t)) after t updates, so the average is
not dominated by the untrained initial weights. Buffers (the fitted standardisers) are
copied, not averaged.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

STATE_VERSION = 1


class GeneratorEMA:
    """The averaged copy of a generator; a stateful trainer part.

    Args:
        generator: the trained generator (its weights start the average).
        decay: the average's decay per generator step, in (0, 1).

    Attributes:
        module: the averaged generator (eval mode, no gradients), used like the generator.
        updates: generator steps averaged so far.
    """

    def __init__(self, generator: nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.generator = generator
        self.module = copy.deepcopy(generator).eval().requires_grad_(False)
        self.updates = 0

    @torch.no_grad()
    def update(self, generator: nn.Module | None = None) -> None:
        """Move the average towards the generator's current weights (no host sync)."""
        generator = generator or self.generator
        rate = 1.0 - min(self.decay, (1.0 + self.updates) / (10.0 + self.updates))
        ours = list(self.module.parameters())
        torch._foreach_lerp_(ours, [p.detach() for p in generator.parameters()], rate)
        for mine, theirs in zip(self.module.buffers(), generator.buffers()):
            mine.copy_(theirs)
        self.updates += 1

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "decay": self.decay,
            "updates": self.updates,
            "weights": self.module.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the average; one of another shape restarts from the generator."""
        if state.get("version") != STATE_VERSION:
            self.reset()
            return
        try:
            self.module.load_state_dict(state["weights"])
        except RuntimeError:  # the model changed: the trainer refuses it earlier anyway
            self.reset()
            return
        self.updates = int(state["updates"])

    def reset(self) -> None:
        """Restart the average from the generator's current weights."""
        self.module.load_state_dict(self.generator.state_dict())
        self.updates = 0


def inference_weights(payload: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The generator weights to sample with from a checkpoint payload: the EMA's when the
    checkpoint has them, else the trained generator's. Returns (state dict, which)."""
    ema = payload.get("generator_ema")
    if isinstance(ema, dict) and ema.get("version") == STATE_VERSION and ema.get("weights"):
        return ema["weights"], "generator_ema"
    return payload["generator"], "generator"
