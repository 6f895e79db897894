"""The one building block the generator and the critic share: a plain MLP."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import nn


def mlp(
    n_in: int,
    hidden: Sequence[int],
    n_out: int | None,
    *,
    activation: Callable[[], nn.Module],
    layer_norm: bool = False,
    out_bias: bool = True,
) -> nn.Sequential:
    """Linear layers of widths ``n_in -> hidden... -> n_out``.

    Each hidden layer is Linear [-> LayerNorm] -> activation. With ``n_out`` set, a last
    Linear without activation follows; with ``n_out=None`` the MLP ends on the last hidden
    activation (a feature extractor). ``out_bias=False`` drops the last layer's bias.
    """
    layers: list[nn.Module] = []
    width = n_in
    for h in hidden:
        layers.append(nn.Linear(width, h))
        if layer_norm:
            layers.append(nn.LayerNorm(h))
        layers.append(activation())
        width = h
    if n_out is not None:
        layers.append(nn.Linear(width, n_out, bias=out_bias))
    return nn.Sequential(*layers)


def leaky_relu() -> nn.Module:
    """LeakyReLU with the original trainer's slope 0.2."""
    return nn.LeakyReLU(0.2)
