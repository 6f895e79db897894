"""Building blocks the generator and the critic share: a plain MLP, a split first layer,
and the linear map they all use (on the CPU, through oneDNN: :func:`linear`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from muongen.model.pooling import rows_of

#: oneDNN's fp32 inner product, the kernel torch's inductor calls on the CPU (None: not in
#: this torch build)
_ONEDNN_LINEAR = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
_HAS_ONEDNN = _ONEDNN_LINEAR is not None and torch.backends.mkldnn.is_available()
#: where :func:`linear` takes oneDNN: outside autograd ("forward"), also under it ("all"),
#: or never ("none")
_onednn = {"mode": "forward" if _HAS_ONEDNN else "none"}


def use_onednn(mode: str) -> str:
    """Where :func:`linear` runs fp32 products on the CPU through oneDNN: ``"all"``,
    ``"forward"`` (outside autograd only: the default) or ``"none"`` (torch's BLAS).
    Process-wide; the training step sets it from ``train.cpu_matmul``. Returns the mode now
    in force (``"none"`` where the build has no oneDNN)."""
    if mode not in ("all", "forward", "none"):
        raise ValueError(f"oneDNN mode {mode!r}: expected all, forward or none")
    _onednn["mode"] = mode if _HAS_ONEDNN else "none"
    return _onednn["mode"]


def onednn_mode() -> str:
    """Where :func:`linear` takes oneDNN now (see :func:`use_onednn`)."""
    return _onednn["mode"]


def _takes_onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`linear` runs ``x @ weight.T`` through oneDNN, now."""
    mode = _onednn["mode"]
    if mode == "none" or (mode == "forward" and torch.is_grad_enabled()):
        return False
    return (
        not torch.jit.is_tracing()
        and not torch.jit.is_scripting()
        and not torch.compiler.is_compiling()
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.dim() == 2
        and x.shape[1] > 0
        and not torch.is_autocast_enabled("cpu")
    )


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    add: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ weight.T + bias (+ add)``, as ``nn.functional.linear``, for 2-D ``x``.

    On the CPU in fp32 the product can run through oneDNN's inner product instead of
    torch's BLAS (:func:`use_onednn`; by default outside autograd only): the MKL in torch's
    CPU wheels runs its AVX2 kernels on AMD processors, oneDNN its AVX-512 ones, and on
    such a CPU (AMD EPYC, 2026-11-28, one thread) oneDNN ran this model's products at
    180-240 GFLOPS against MKL's 90-100 (docs/speed.md, "oneDNN"). The same value to fp32
    rounding, and differentiable to any order: under autograd (mode ``"all"``) the
    backward's products go through this function again, so the penalty's double backward
    takes oneDNN too. Elsewhere (a GPU, bf16, autocast, tracing for export,
    torch.compile, an empty inner dimension, mode ``"none"``) it is
    ``nn.functional.linear``. ``add`` (N, out), when given, is added to the result (in the
    product's own pass through oneDNN): the split layer's gathered per-event rows.
    """
    if _takes_onednn(x, weight):
        if not torch.is_grad_enabled():
            return _product(x, weight, bias, add)
        # copied (where needed) out here, where autograd records the copy: the backward's
        # products must reach the caller's x and weight for a double backward
        return _OneDnnLinear.apply(_dense(x), _dense(weight), bias, add)
    y = nn.functional.linear(x, weight, bias)
    return y if add is None else y + add


def _dense(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when it is compact row- or column-major (a weight's transpose is), else
    a contiguous copy: given a column slice of a weight or the zero-stride gradient of a
    sum, oneDNN falls back to its reference kernel, ~50x slower."""
    rows, cols = t.shape
    if t.stride() == (cols, 1) or t.stride() == (1, rows):
        return t
    return t.contiguous()


def _product(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    add: torch.Tensor | None = None,
) -> torch.Tensor:
    """oneDNN's ``x @ weight.T + bias (+ add)``, outside autograd."""
    x, weight = _dense(x), _dense(weight)
    if add is None:
        return _ONEDNN_LINEAR(x, weight, bias, "none", [], "")
    return _ONEDNN_LINEAR.binary(x, add.contiguous(), weight, bias, "add")


class _OneDnnLinear(torch.autograd.Function):
    """:func:`linear` through oneDNN. Its backward's products are :func:`linear` calls
    where autograd records them (``create_graph``, the penalty's double backward), else
    plain oneDNN calls (each autograd.Function costs Python time, under the GIL that the
    step's shards share)."""

    @staticmethod
    def forward(ctx, x, weight, bias, add):  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        ctx.has_bias, ctx.has_add = bias is not None, add is not None
        return _product(x, weight, bias, add)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b, need_add = ctx.needs_input_grad
        product = linear if torch.is_grad_enabled() else _product
        grad_x = product(grad, weight.t()) if need_x else None
        grad_w = _weight_grad(grad, x, product) if need_w else None
        grad_b = grad.sum(0) if ctx.has_bias and need_b else None
        return grad_x, grad_w, grad_b, grad if ctx.has_add and need_add else None


def _weight_grad(grad: torch.Tensor, x: torch.Tensor, product: Callable) -> torch.Tensor:
    """grad^T @ x (out, in), the weight's gradient, by ``product`` (:func:`linear` or
    :func:`_product`): as a product with ``in`` outputs when ``in >= out``, else as
    (x^T @ grad)^T. oneDNN runs each faster in its own case (13k rows: 176 against 133
    GFLOPS for 128 -> 64, 146 against 57 for 16 -> 128, 35 against 12 for 4 -> 32); MKL
    ran them at 95, 62 and 9."""
    if grad.shape[0] == 0:
        return grad.new_zeros(grad.shape[1], x.shape[1])
    if x.shape[1] >= grad.shape[1]:
        return product(grad.t(), x.t())
    return product(x.t(), grad.t()).t()


class Linear(nn.Linear):
    """``nn.Linear`` whose product is :func:`linear` (oneDNN on the CPU); the same
    parameters and state-dict keys."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            return nn.functional.linear(x, self.weight, self.bias)
        return linear(x, self.weight, self.bias)


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
        layers.append(Linear(width, h))
        if layer_norm:
            layers.append(nn.LayerNorm(h))
        layers.append(activation())
        width = h
    if n_out is not None:
        layers.append(Linear(width, n_out, bias=out_bias))
    return nn.Sequential(*layers)


def leaky_relu() -> nn.Module:
    """LeakyReLU with the original trainer's slope 0.2."""
    return nn.LeakyReLU(0.2)


def leaky_relu_inplace() -> nn.Module:
    """LeakyReLU(0.2) overwriting its input: for layers whose pre-activation nothing else
    reads (a positive slope lets autograd differentiate it from its output)."""
    return nn.LeakyReLU(0.2, inplace=True)


def narrow_linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)`` for a Linear with a handful of inputs and many rows (the critic's
    embedding of each muon's 2-4 inputs): the same value and gradients, but the weight's
    gradient is computed as ``x^T @ grad`` ([in, N] x [N, out]). For a Linear autograd
    computes it as ``(grad^T @ x)^T`` to match the layout of ``weight.t()``, a product
    MKL runs 3-4x slower on the CPU when ``in`` is 3 (0.36 against 0.11 ms for 13k muons).
    Through oneDNN (:func:`linear`) the weight's gradient is taken that way already.
    """
    if _takes_onednn(x, layer.weight):
        return linear(x, layer.weight, layer.bias)
    return torch.addmm(layer.bias, x, layer.weight.t().contiguous())


def split_linear(
    layer: nn.Linear,
    per_event: torch.Tensor,
    per_muon: torch.Tensor,
    counts: torch.Tensor,
    event_index: torch.Tensor | None = None,
) -> torch.Tensor:
    """``layer`` on each muon's input [per_event of its event, per_muon], computed exactly
    as a per-event part (once per event) plus a per-muon part.

    ``layer.weight`` (H, E + M) splits by columns into W_e (H, E) and W_m (H, M):
    W [e; m] + b = (W_e e + b) + W_m m, so the per-muon cost is that of M inputs, not E + M.

    Args:
        layer: a Linear with E + M inputs.
        per_event: (B, E) one vector per event.
        per_muon: (N, M) one vector per muon, grouped by event.
        counts: (B,) int64 muons per event.
        event_index: (N,) the event of each muon, when the caller has it.

    Returns:
        (N, H), equal (to rounding) to ``linear(cat([per_event[event_index], per_muon]))``.
    """
    event_part, muon_weight = split_parts(layer, per_event)
    if event_index is None:
        rows = torch.repeat_interleave(event_part, counts, dim=0, output_size=per_muon.shape[0])
    else:
        rows = rows_of(event_part, event_index)  # (N, H), a fresh tensor
    return add_muon_part(rows, per_muon, muon_weight)


def add_muon_part(
    rows: torch.Tensor, per_muon: torch.Tensor, muon_weight: torch.Tensor
) -> torch.Tensor:
    """``rows + per_muon @ muon_weight`` for the gathered per-event rows (N, H) of
    :func:`split_parts`. Through oneDNN (:func:`linear`) the sum is made in the product's
    pass; else ``rows`` (a fresh tensor: the gather's backward does not need it)
    accumulates the product in place instead of into a copy. autocast does not cast an
    in-place op, so the per-muon input takes the rows' dtype (bf16 under autocast)."""
    if _takes_onednn(per_muon, muon_weight):
        return linear(per_muon, muon_weight.t(), add=rows)
    return rows.addmm_(per_muon.to(rows.dtype), muon_weight)


def split_parts(layer: nn.Linear, per_event: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two parts of :func:`split_linear`: the per-event rows W_e e + b (B, H) and the
    per-muon weight W_m^T (M, H), to add as ``event_rows[event] + per_muon @ W_m^T``.

    Under autocast both come in the dtype autocast gives the linear (bf16 or fp16), so that
    the in-place ``addmm_`` that joins them, which autocast does not cast, sees one dtype.
    """
    width = per_event.shape[1]
    if per_event.dim() == 2:
        event_part = linear(per_event, layer.weight[:, :width], layer.bias)
    else:
        event_part = nn.functional.linear(per_event, layer.weight[:, :width], layer.bias)
    return event_part, layer.weight[:, width:].t().to(event_part.dtype)
