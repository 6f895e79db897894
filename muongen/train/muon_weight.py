"""``optim.muon_critic_weight_rich``: the per-muon critic's weight from the data's muons.

Why. The per-muon critic (``model.muon_critic``) scores every muon against the muons of
bundles with the same primary; its WGAN term enters the losses with the weight
``optim.muon_critic_weight``. On muon-rich data the set critic alone leaves the spread of
energies inside big bundles loose, seed by seed (issue 52's physics, ~27.7 muons a row:
the seed that misses at weight 1 scores 2.48 and 2.44 worst, at weight 3 1.63 and 1.71;
every seed tried at 3 meets worst <= 2.0), while on sparse data (the quality preset's
``wide`` blend, ~3.6 a row) the one seed trained at 3 lost its richest bundles' radii
(docs/fidelity.md, "The shape inside bundles" and "The per-muon weight from the data").

The rule. When a run starts fresh (the trainer resets its parts), the mean muons per row
of its input files (:class:`muongen.train.batch_size.RowMuons`, the rows
``data.batch_muons`` reads, read once for both) decides: at least
``optim.rich_muons_per_row`` and the weight becomes ``optim.muon_critic_weight_rich``;
fewer and ``optim.muon_critic_weight`` stays. The decision is saved in every checkpoint:
a resumed run and the next node of a grid chain keep it, whatever their own files hold, so
one model trains with one weight. The run's ``config.yaml`` and its checkpoints' config
record the weight trained. ``optim.muon_critic_weight_rich: 0`` (the default) keeps
``optim.muon_critic_weight`` everywhere.
"""

from __future__ import annotations

import logging
from typing import Any

from muongen.config import OptimConfig
from muongen.train.batch_size import RowMuons

log = logging.getLogger(__name__)


class MuonWeight:
    """A trainer part that sets ``optim.muon_critic_weight`` from the input files' muons
    per row (see the module docstring), and keeps the decision in checkpoints.

    Args:
        optim_cfg: the run's optimizer section: ``muon_critic_weight`` is read and set
            (the training step reads it at every step).
        rows: the input files' mean muons per row.
    """

    follows_data = False  # one model, one weight: a chain node keeps its predecessor's

    def __init__(self, optim_cfg: OptimConfig, rows: RowMuons) -> None:
        self.cfg = optim_cfg
        self.rows = rows
        self.requested = optim_cfg.muon_critic_weight  # the configured weight

    @property
    def on(self) -> bool:
        return self.cfg.muon_critic_weight_rich > 0

    def _from_data(self) -> float:
        if not self.on:
            return self.requested
        mean, rows = self.rows.mean()
        if not rows:
            return self.requested
        rich = mean >= self.cfg.rich_muons_per_row
        weight = self.cfg.muon_critic_weight_rich if rich else self.requested
        log.info(
            "optim.muon_critic_weight_rich=%g: %.1f muons a row, %s optim.rich_muons_per_row="
            "%g: the per-muon critic's weight is %g",
            self.cfg.muon_critic_weight_rich,
            mean,
            "at least" if rich else "below",
            self.cfg.rich_muons_per_row,
            weight,
        )
        return weight

    def _set(self, weight: float) -> None:
        self.cfg.muon_critic_weight = weight

    def state_dict(self) -> dict[str, Any]:
        return {"muon_critic_weight": self.cfg.muon_critic_weight}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Keep the saved weight (a resumed run, or the next range of a chain) while
        ``optim.muon_critic_weight_rich`` is on, without reading any file; with it 0,
        ``optim.muon_critic_weight`` is what it says."""
        saved = state.get("muon_critic_weight")
        if not self.on or saved is None:
            return
        if float(saved) != self.requested:
            log.info(
                "optim.muon_critic_weight: %g, as the checkpoint's run decided "
                "(optim.muon_critic_weight_rich)",
                float(saved),
            )
        self._set(float(saved))

    def missing(self, config: dict[str, Any]) -> None:
        """A checkpoint from before this part keeps the weight its config records (what
        its run trained with) while ``optim.muon_critic_weight_rich`` is on."""
        saved = (config.get("optim") or {}).get("muon_critic_weight")
        if saved is None:
            self.reset()
        else:
            self.load_state_dict({"muon_critic_weight": saved})

    def reset(self) -> None:
        """A fresh start decides from the files."""
        self._set(self._from_data())
