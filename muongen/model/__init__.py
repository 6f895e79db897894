"""The WGAN-GP model on ragged muon sets: generator, critic, gradient penalty, losses."""

from __future__ import annotations

from muongen.config import ModelConfig
from muongen.model.critic import Critic, EpicCritic
from muongen.model.generator import Generator


def build_models(cfg: ModelConfig) -> tuple[Generator, Critic | EpicCritic]:
    """The generator and the critic for ``cfg`` (fresh weights from the global RNG)."""
    generator = Generator(cfg)  # first: fresh weights drawn in the same order as before
    return generator, EpicCritic(cfg) if cfg.critic == "epic" else Critic(cfg)


__all__ = ["Critic", "EpicCritic", "Generator", "build_models"]
