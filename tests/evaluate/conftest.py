"""Fixtures for evaluation tests: toy events with known structure, a tiny checkpoint."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tiny import SMALL_CRITIC

from muongen.config import load_config
from muongen.data.batch import RaggedBatch
from muongen.evaluate.features import EventSample

TINY_MODEL = [
    "model.z_global=4",
    "model.z_local=4",
    "model.context=16",
    "model.mult_hidden=[8]",
    "model.local_hidden=[16]",
    *SMALL_CRITIC,
    "model.multiplicity=round",  # deterministic counts: the tiny model makes exactly 3
    "data.batch_events=256",
    "logging.val_events=600",
]


def toy_arrays(n: int, seed: int = 0, *, shift: float = 0.0, conditions: np.ndarray | None = None):
    """Physical (conditions, muons, counts) whose multiplicity rises with primary energy and
    cos zenith, muon log10 E ~ N(2 + shift, 0.5), radius ~ Exp(20 m), azimuth uniform."""
    rng = np.random.default_rng(seed)
    if conditions is None:
        conditions = np.stack(
            [
                10.0 ** rng.uniform(5, 8, n),
                rng.uniform(0.0, 1.2, n),
                rng.choice([1.0, 4.0, 56.0], n),
                rng.choice(np.linspace(1000.0, 2800.0, 100), n),
            ],
            axis=1,
        )
    lam = np.exp(np.log10(conditions[:, 0]) - 5.5) * np.cos(conditions[:, 1])
    counts = rng.poisson(lam)
    n_mu = int(counts.sum())
    r = rng.exponential(20.0, n_mu)
    phi = rng.uniform(0.0, 2 * np.pi, n_mu)
    muons = np.stack(
        [10.0 ** rng.normal(2.0 + shift, 0.5, n_mu), r * np.sin(phi), r * np.cos(phi)], 1
    )
    return conditions, muons, counts


@pytest.fixture
def toy():
    """Factory of toy EventSamples: the same physics for a 'real' and a 'perfect model'
    sample drawn for the same primaries, or a shifted one for a bad model."""

    def make(n: int, seed: int = 0, **kw) -> EventSample:
        return EventSample.from_arrays(*toy_arrays(n, seed, **kw))

    return make


@pytest.fixture(scope="session")
def held_out(tmp_path_factory) -> Path:
    """A small held-out Parquet v1 file of toy events, written once per session (read only)."""
    from muongen.data.writers import write_events

    path = tmp_path_factory.mktemp("held-out") / "held.parquet"
    write_events(path, RaggedBatch.from_numpy(*toy_arrays(600, seed=11)), "parquet-v1")
    return path


def _tiny_generator(cfg):
    """A fresh tiny generator whose multiplicity head always says log10(N + 1) = 0.6
    (about 3 muons per event): untrained weights would give no muons at all, and the
    sampling and evaluation paths must see some."""
    from muongen.model import build_models

    torch.manual_seed(0)
    generator, _ = build_models(cfg.model)
    last = [m for m in generator.multiplicity.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.fill_(0.6)
    return generator


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A checkpoint (.pt + manifest) of the tiny generator, written once per session through
    the trainer's own checkpoint writer, so load_for_inference reads it like a real one."""
    from muongen import checkpoint

    cfg = load_config(None, TINY_MODEL)
    out = tmp_path_factory.mktemp("ckpt")
    saved = checkpoint.save(
        {"config": cfg.to_dict(), "generator": _tiny_generator(cfg).state_dict()},
        out,
        "tiny",
        step=7,
    )
    return saved.manifest


@pytest.fixture
def tiny_config():
    """The Config the tiny checkpoint was made with."""
    return load_config(None, TINY_MODEL)


@pytest.fixture
def tiny_generator(tiny_config):
    """A tiny generator making about 3 muons per event (see _tiny_generator)."""
    return _tiny_generator(tiny_config)
