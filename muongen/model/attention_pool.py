"""Attention-style pooling of a bundle's muons for the EPiC critic (critic_attention_heads).

Mean and max pooling weigh a bundle's muons alike (mean) or keep one per channel (max):
neither lets the critic pick out the few muons that matter for a given event, such as the
handful of very energetic muons of a rich bundle, which the mean dilutes by 1/N. An
attention pool lets it: each muon gets a score per head from its own vector phi and its
event's vector g (the event asks, the muons answer), the scores become weights by a softmax
within the event, and each head pools its share of phi's channels with those weights.

    logit[i, k] = (W_phi phi_i)[k] + (W_g g_event(i))[k]
    w[i, k]     = softmax over the muons i of the event of logit[., k]
    pooled[e]   = sum_i w[i, k(c)] phi[i, c]      (channel c belongs to head k(c))

The result enters the event's update through its own linear map, added to the
pre-activation of the layer's other inputs. All three maps start at zero and are made
without random draws (``nn.utils.skip_init``): at the start the pool is the plain mean and
adds nothing, so a seeded run with it starts from the weights of the run without it and
reads the same batches (a paired comparison changes only the pool).

An event without muons pools to 0. The softmax subtracts each event's largest logit
(detached: the softmax does not depend on it) so no exp overflows; the rest is written in
differentiable operations, so the gradient penalty's double backward goes through it.
"""

from __future__ import annotations

import torch
from torch import nn

from muongen.model.layers import zero_linear
from muongen.model.pooling import rows_of, segment_sum, segment_top


class AttentionPool(nn.Module):
    """(N, L) muon vectors and (B, G) event vectors -> (B, G): an attention-weighted pool of
    each event's muons, mapped to the event's width (zero at the start)."""

    def __init__(self, local: int, wide: int, heads: int) -> None:
        super().__init__()
        if heads < 1 or local % heads:
            raise ValueError(f"{heads} attention heads do not divide {local} channels")
        self.heads = heads
        self.key = zero_linear(local, heads, bias=False)  # each muon's answer
        self.query = zero_linear(wide, heads)  # each event's question
        self.out = zero_linear(local, wide, bias=False)

    def weights(
        self, phi: torch.Tensor, g: torch.Tensor, counts: torch.Tensor, event_index: torch.Tensor
    ) -> torch.Tensor:
        """(N, heads): each muon's weight in its event, per head (each head's weights of an
        event with muons sum to 1)."""
        logits = self.key(phi) + rows_of(self.query(g), event_index)  # (N, K)
        top = segment_top(logits.detach(), counts.shape[0], event_index)  # (B, K)
        w = torch.exp(logits - rows_of(top, event_index))
        total = segment_sum(w, event_index, counts.shape[0])  # (B, K), >= 1 with muons
        return w / rows_of(total.clamp(min=1.0), event_index)

    def pool(
        self, phi: torch.Tensor, g: torch.Tensor, counts: torch.Tensor, event_index: torch.Tensor
    ) -> torch.Tensor:
        """(B, L): each event's attention-weighted muon vector (0 for an event without muons)."""
        w = self.weights(phi, g, counts, event_index)
        n, local = phi.shape
        weighted = (phi.view(n, self.heads, local // self.heads) * w.unsqueeze(-1)).view(n, local)
        return segment_sum(weighted, event_index, counts.shape[0])

    def forward(
        self, phi: torch.Tensor, g: torch.Tensor, counts: torch.Tensor, event_index: torch.Tensor
    ) -> torch.Tensor:
        return self.out(self.pool(phi, g, counts, event_index))
