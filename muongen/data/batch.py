"""RaggedBatch: a batch of events with a variable number of muons each, kept flat.

Muons of all events sit in one array, event after event; ``counts`` says how many belong
to each event. Nothing is ever padded to the largest event.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace

import numpy as np
import torch

from muongen import schema


@dataclass
class RaggedBatch:
    """A batch of B events holding N muons in total, in physical units.

    Attributes:
        conditions: (B, 4) float32 [E GeV, zenith rad, A, depth m].
        muons: (N, 3) float32 [E GeV, x m, y m], event after event.
        counts: (B,) int64 muons per event; sum(counts) == N.
        keys: (B,) int64 optional identity of each event (file index << 32 | row), used
            to prove exactly-once delivery and to name outliers; None when unknown.
    """

    conditions: torch.Tensor
    muons: torch.Tensor
    counts: torch.Tensor
    keys: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.conditions.ndim != 2 or self.conditions.shape[1] != schema.N_CONDITION:
            raise ValueError(f"conditions must be (B, 4), got {tuple(self.conditions.shape)}")
        if self.muons.ndim != 2:
            raise ValueError(f"muons must be (N, F), got {tuple(self.muons.shape)}")
        if self.counts.ndim != 1 or self.counts.shape[0] != self.conditions.shape[0]:
            raise ValueError("counts must be (B,) with B = len(conditions)")

    @classmethod
    def from_numpy(
        cls,
        conditions: np.ndarray,
        muons: np.ndarray,
        counts: np.ndarray,
        keys: np.ndarray | None = None,
    ) -> RaggedBatch:
        """Wrap numpy arrays without copying (dtypes are normalised: float32 / int64)."""
        return cls(
            conditions=torch.from_numpy(np.ascontiguousarray(conditions, dtype=np.float32)),
            muons=torch.from_numpy(np.ascontiguousarray(muons, dtype=np.float32)),
            counts=torch.from_numpy(np.ascontiguousarray(counts, dtype=np.int64)),
            keys=None if keys is None else torch.from_numpy(np.ascontiguousarray(keys, np.int64)),
        )

    @classmethod
    def empty(cls, n_muon_features: int = schema.N_MUON) -> RaggedBatch:
        return cls(
            torch.zeros(0, schema.N_CONDITION),
            torch.zeros(0, n_muon_features),
            torch.zeros(0, dtype=torch.int64),
            torch.zeros(0, dtype=torch.int64),
        )

    @property
    def n_events(self) -> int:
        return int(self.conditions.shape[0])

    @property
    def n_muons(self) -> int:
        return int(self.muons.shape[0])

    def __len__(self) -> int:
        return self.n_events

    @property
    def offsets(self) -> torch.Tensor:
        """(B + 1,) int64 start of each event's muons; offsets[-1] == N."""
        out = torch.zeros(self.counts.shape[0] + 1, dtype=torch.int64, device=self.counts.device)
        torch.cumsum(self.counts, 0, out=out[1:])
        return out

    def event_index(self) -> torch.Tensor:
        """(N,) int64: the event each muon belongs to."""
        idx = torch.arange(self.n_events, device=self.counts.device)
        return torch.repeat_interleave(idx, self.counts, output_size=self.n_muons)

    def select(self, index: torch.Tensor | np.ndarray) -> RaggedBatch:
        """The events at ``index`` (int indices or a bool mask), in that order."""
        index = torch.as_tensor(index)
        if index.dtype == torch.bool:
            index = index.nonzero().flatten()
        index = index.to(self.counts.device, torch.int64)
        counts = self.counts[index]
        starts = self.offsets[:-1][index]
        # muon rows of the chosen events, vectorised: start of its event + rank within it
        total = int(counts.sum())
        first = torch.repeat_interleave(
            starts - (torch.cumsum(counts, 0) - counts), counts, output_size=total
        )
        rows = first + torch.arange(total, device=counts.device)
        return RaggedBatch(
            self.conditions[index],
            self.muons[rows],
            counts,
            None if self.keys is None else self.keys[index],
        )

    def slice(self, start: int, stop: int) -> RaggedBatch:
        """Events [start, stop) as views (no copy)."""
        off = self.offsets
        m0, m1 = int(off[start]), int(off[stop])
        return RaggedBatch(
            self.conditions[start:stop],
            self.muons[m0:m1],
            self.counts[start:stop],
            None if self.keys is None else self.keys[start:stop],
        )

    @staticmethod
    def concat(batches: list[RaggedBatch]) -> RaggedBatch:
        """Events of all batches, in order."""
        if not batches:
            return RaggedBatch.empty()
        keys = (
            None if any(b.keys is None for b in batches) else torch.cat([b.keys for b in batches])
        )
        return RaggedBatch(
            torch.cat([b.conditions for b in batches]),
            torch.cat([b.muons for b in batches]),
            torch.cat([b.counts for b in batches]),
            keys,
        )

    def split_by_muons(self, max_muons: int) -> list[RaggedBatch]:
        """Split into consecutive microbatches with sum(counts) <= max_muons, never splitting
        an event. An event larger than ``max_muons`` on its own forms a microbatch alone."""
        if self.n_events == 0:
            return [self]
        if max_muons <= 0:
            raise ValueError("max_muons must be positive")
        cum = torch.cumsum(self.counts, 0).cpu().numpy()
        bounds = [0]
        base = 0
        n = len(cum)
        while bounds[-1] < n:
            start = bounds[-1]
            # last event whose cumulative count stays within base + max_muons
            stop = int(np.searchsorted(cum, base + max_muons, side="right"))
            stop = max(stop, start + 1)  # a lone oversized event still moves forward
            bounds.append(stop)
            base = int(cum[stop - 1])
        return [self.slice(a, b) for a, b in itertools.pairwise(bounds)]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> RaggedBatch:
        return replace(
            self,
            **{
                f.name: (
                    None
                    if getattr(self, f.name) is None
                    else getattr(self, f.name).to(device, non_blocking=non_blocking)
                )
                for f in fields(self)
            },
        )

    def pin_memory(self) -> RaggedBatch:
        return replace(
            self,
            **{
                f.name: (
                    None if getattr(self, f.name) is None else getattr(self, f.name).pin_memory()
                )
                for f in fields(self)
            },
        )

    def iter_events(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(condition (4,), muons (n_i, F)) per event; for tests and inspection, not hot paths."""
        off = self.offsets.tolist()
        for i in range(self.n_events):
            yield self.conditions[i], self.muons[off[i] : off[i + 1]]
