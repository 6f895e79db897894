"""The WGAN-GP model on ragged muon sets: generator, critic, gradient penalty, losses."""

from __future__ import annotations

from muongen.config import ModelConfig
from muongen.model.critic import Critic
from muongen.model.generator import Generator


def build_models(cfg: ModelConfig) -> tuple[Generator, Critic]:
    """The generator and the critic for ``cfg`` (fresh weights from the global RNG)."""
    return Generator(cfg), Critic(cfg)


__all__ = ["Critic", "Generator", "build_models"]
