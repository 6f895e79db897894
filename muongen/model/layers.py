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


def cpu_vendor() -> str:
    """The x86 processor's vendor string (``AuthenticAMD``, ``GenuineIntel``), or "" where
    /proc/cpuinfo does not name one (another OS, another architecture)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def onednn_pays(vendor: str | None = None) -> bool:
    """Whether oneDNN beats torch's BLAS for this model's products on ``vendor``'s
    processors (default: this machine's; ``train.cpu_matmul: auto``): on AMD's, where the
    MKL in torch's wheels runs its AVX2 kernels. On Intel's MKL runs its AVX-512 ones and
    was the faster (docs/speed.md, "oneDNN for the products outside autograd"); other
    processors were not measured and keep torch's own."""
    return (cpu_vendor() if vendor is None else vendor) == "AuthenticAMD"


#: below this many rows a product is torch's own (oneDNN's call costs ~10 us more)
ONEDNN_MIN_ROWS = 256


def use_onednn(on: bool | str) -> bool:
    """Whether :func:`linear` runs fp32 products outside autograd on the CPU through oneDNN
    or torch's BLAS: True, False, or a ``train.cpu_matmul`` value (``auto``: where
    :func:`onednn_pays`, the default at import). Process-wide; the training step sets it
    from ``train.cpu_matmul``. Returns the setting now in force (False where the build has
    no oneDNN)."""
    _onednn["on"] = onednn_for(on)
    return _onednn["on"]


def onednn_for(on: bool | str) -> bool:
    """What :func:`use_onednn` would set for ``on`` (nothing is changed)."""
    if isinstance(on, str):
        on = onednn_pays() if on == "auto" else on == "onednn"
    return bool(on) and _HAS_ONEDNN


_onednn = {"on": onednn_for("auto")}  # the process default (train.cpu_matmul: auto)


def onednn_in_use() -> bool:
    """Whether :func:`linear` takes oneDNN for fp32 CPU products outside autograd now."""
    return _onednn["on"]


def _takes_onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`linear` runs ``x @ weight.T`` through oneDNN, now."""
    return (
        _onednn["on"]
        and not torch.is_grad_enabled()
        and not torch.jit.is_tracing()
        and not torch.jit.is_scripting()
        and not torch.compiler.is_compiling()
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.dim() == 2
        and x.shape[0] >= ONEDNN_MIN_ROWS
        and x.shape[1] > 0
        and not torch.is_autocast_enabled("cpu")
    )


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    add: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ weight.T + bias (+ add)``, as ``nn.functional.linear``.

    Outside autograd on the CPU in fp32 (the critic's fakes, sampling, evaluation) the
    product runs through oneDNN's inner product instead of torch's BLAS where that is
    switched on (:func:`use_onednn`; by default on AMD processors): the MKL in torch's CPU
    wheels runs its AVX2 kernels on AMD processors, oneDNN its AVX-512 ones, and on such a
    CPU (AMD EPYC, 2026-11-28, one thread) oneDNN ran this model's products at 180-240
    GFLOPS against MKL's 90-100 (docs/speed.md, "oneDNN for the products outside
    autograd"). The same value to fp32 rounding. Under autograd, and elsewhere (a GPU,
    bf16, autocast, tracing for export, torch.compile, an input that is not 2-D, fewer
    than :data:`ONEDNN_MIN_ROWS` rows, an empty inner dimension), it is
    ``nn.functional.linear``. ``add`` (N, out), when given, is added to the result: the
    split layer's gathered per-event rows (through oneDNN, in the product's own pass).
    """
    if _takes_onednn(x, weight):
        return _bucketed_product(x, weight, bias, add)
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


def _row_bucket(rows: int) -> int:
    """``rows`` rounded up to one of 8 sizes per octave (at most 12.5% more)."""
    step = 1 << max(rows.bit_length() - 4, 0)
    return -(-rows // step) * step


def _bucketed_product(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    add: torch.Tensor | None = None,
) -> torch.Tensor:
    """oneDNN's ``x @ weight.T + bias (+ add)`` with the rows padded up to
    :func:`_row_bucket`.

    oneDNN makes (JIT-compiles) a primitive for each shape it meets and keeps it in a
    cache; making one took ~0.2 ms for a 13000 x 32 x 32 product that then runs in 0.14.
    A batch's muon and event counts change from batch to batch, so unpadded nearly every
    product met a new shape. Padded, a run meets a few dozen shapes per layer (the padding
    rows are zeros; their outputs are dropped, the first rows a contiguous view)."""
    rows = x.shape[0]
    padded = _row_bucket(rows)
    weight = _dense(weight)
    if padded == rows:
        x = _dense(x)
        if add is None:
            return _ONEDNN_LINEAR(x, weight, bias, "none", [], "")
        return _ONEDNN_LINEAR.binary(x, add.contiguous(), weight, bias, "add")
    xp = x.new_empty(padded, x.shape[1])
    xp[:rows].copy_(x)
    xp[rows:].zero_()
    y = _ONEDNN_LINEAR(xp, weight, bias, "none", [], "")[:rows]
    return y if add is None else y.add_(add)


class Linear(nn.Linear):
    """``nn.Linear`` whose product is :func:`linear` (oneDNN on the CPU outside autograd);
    the same parameters and state-dict keys."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
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


def zero_linear(n_in: int, n_out: int, bias: bool = True) -> nn.Linear:
    """A Linear of zeros, made without random draws (``nn.utils.skip_init``): a head added
    to a seeded model leaves every other weight as the model without it draws them."""
    layer = nn.utils.skip_init(nn.Linear, n_in, n_out, bias=bias)
    nn.init.zeros_(layer.weight)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


def narrow_linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)`` for a Linear with a handful of inputs and many rows (the critic's
    embedding of each muon's 2-4 inputs): the same value and gradients, but the weight's
    gradient is computed as ``x^T @ grad`` ([in, N] x [N, out]). For a Linear autograd
    computes it as ``(grad^T @ x)^T`` to match the layout of ``weight.t()``, a product
    MKL runs 3-4x slower on the CPU when ``in`` is 3 (0.36 against 0.11 ms for 13k muons).
    Outside autograd it is :func:`linear` (oneDNN on the CPU).
    """
    if not torch.is_grad_enabled():  # no weight gradient to lay out
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
    event_part = linear(per_event, layer.weight[:, :width], layer.bias)
    return event_part, layer.weight[:, width:].t().to(event_part.dtype)
