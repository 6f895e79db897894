"""The events of a microbatch as the GAN step scores them (:class:`Scored`), and a
microbatch cut into the CPU step's shards (:class:`Cut`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from muongen.model.pooling import event_index_of


@dataclass
class Scored:
    """The events of one microbatch that the critic scores, muons grouped by event.

    With the real counts (``train.fake_counts = "real"``) an event without muons is empty
    in the real and in the fake set alike: it scores the same in both, so it cancels in the
    critic's loss and carries no gradient to the generator. Only events with muons are
    scored then (:func:`muongen.model.generator.events_with_muons`; on an accelerator at
    most N of the B events, padded with empty rows that are masked out); losses stay sums
    over the scored events / B, i.e. the means over the batch that the original computes.
    At the production multiplicity (most events empty) this removes most of the per-event
    work of the generator and the critic.
    With the predicted counts every event is scored. With ``optim.event_weight`` each
    scored event's scores are multiplied by its weight (:meth:`mask`), the same for its
    real and its fake bundle.

    A microbatch padded for a CUDA graph (:mod:`muongen.train.graphs`) ends with extra
    events holding the padding muons: they are scored like the others (static shapes) but
    are not ``valid``, draw no penalty pair and are left out of the multiplicity loss and
    of ``n_events``, so every loss and gradient is the unpadded microbatch's.
    """

    # every event of the microbatch, empty ones too (the multiplicity head learns from all)
    all_cond: torch.Tensor  # (B, 4)
    all_counts: torch.Tensor  # (B,)
    cond: torch.Tensor  # (B', 4)
    muons: torch.Tensor  # (N, F)
    counts: torch.Tensor  # (B',)
    n_events: int  # B, the events the losses average over
    valid: torch.Tensor | None  # (B',) bool: scored rows that count (None: all)
    weight: torch.Tensor | None = None  # (B',) each scored event's loss weight (None: 1)
    # (N, F') the real muons mapped to the critic's inputs (Critic.inputs): once per step,
    # not once per critic call (the map has no trained parameters)
    inputs: torch.Tensor | None = None
    gp_pairs: int = 0  # the penalty's pair cap for these events (0: all)
    padded: bool = False  # the last scored rows may be padding events (see above)
    # the weight of one muon in the per-muon critic (model.muon_critic) and in quantile
    # matching (optim.quantile_match): 1 / the batch's muons
    muon_scale: float = 0.0
    # the share of the batch's muons drawn for the per-muon critic's penalty
    muon_gp_share: float = 1.0
    # (N,) each muon's factor in the per-muon critic's WGAN term, beside muon_scale
    # (optim.energy_balance: its event's; the fake muon in its place takes it too; None: 1)
    muon_weight: torch.Tensor | None = None
    # a shard's part of a microbatch cut into shards (None: a whole microbatch)
    cut: Cut | None = None
    event_index: torch.Tensor = field(init=False)  # (N,) the event of each real muon
    # the critic updates' fake sets of this step, made up front (GanStep._fakes_ahead):
    # per update the fakes mapped by Critic.inputs (N', F') and their counts (B',)
    fakes: list[tuple[torch.Tensor, torch.Tensor]] = field(init=False, default_factory=list)
    # a part's penalty pairs per critic update with the penalty, drawn for its whole
    # microbatch (GanStep._draw_pairs): k -> (its slots, the microbatch's count of terms)
    pairs: dict[int, tuple[torch.Tensor, int]] = field(init=False, default_factory=dict)
    _both: tuple[torch.Tensor, ...] | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        self.event_index = event_index_of(self.counts, self.n_muons)

    def both_sets(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Conditions (2B', 4), counts (2B',) and event index (2N,) of the real set then
        a fake set with the same counts, scored as one set of 2B' events (made once)."""
        if self._both is None:
            b = self.counts.shape[0]
            self._both = (
                torch.cat([self.cond, self.cond]),
                torch.cat([self.counts, self.counts]),
                torch.cat([self.event_index, self.event_index + b]),
            )
        return self._both

    @property
    def n_muons(self) -> int:
        return int(self.muons.shape[0])

    def mask(self, scores: torch.Tensor) -> torch.Tensor:
        """(B',) scores with the rows that do not count set to 0, times their weights."""
        if self.valid is not None:
            scores = torch.where(self.valid, scores, 0.0)
        return scores if self.weight is None else scores * self.weight

    def muon_mask(self, scores: torch.Tensor) -> torch.Tensor:
        """(N,) per-muon scores with the muons of the rows that do not count set to 0,
        times their weights."""
        if self.valid is not None:
            scores = torch.where(self.valid.index_select(0, self.event_index), scores, 0.0)
        return scores if self.muon_weight is None else scores * self.muon_weight

    def pair_counts(self, counts: torch.Tensor) -> torch.Tensor:
        """A scored set's counts as the penalty pairs them: 0 for the rows that do not
        count (a padded microbatch's extra event must draw no pair)."""
        return torch.where(self.valid, counts, 0) if self.padded else counts


@dataclass(eq=False)
class Cut:
    """A microbatch cut into shards: its parts in event order (one per shard that got
    events) and its share of the batch's events, which weighs its penalty."""

    parts: list[Scored]
    share: float


#: one shard's share of a step: its scored events and their weights (shares of the batch)
Work = list[tuple[Scored, float]]
