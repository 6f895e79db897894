"""`muongen export CHECKPOINT --format torchscript|onnx --out FILE`: the generator as one
file that a C++ program (libtorch or ONNX Runtime) can call, in physical units.

The exported graph (:class:`PhysicalGenerator`) holds the generator's networks and its
standardisers (the weights that :func:`load_for_inference` returns: the EMA weights where
the checkpoint has them) and the feature transforms of :mod:`muongen.schema`. It takes
the noise as inputs, so the same inputs give the same bundles in every runtime::

    inputs   conditions   float32 (B, 4)  [E GeV, zenith rad, A, vertical depth m]
             event_noise  float32 (B, 2 + Zg)  col 0: N(0,1) multiplicity draw,
                                               cols 1..Zg: N(0,1) event context,
                                               col Zg+1: U[0,1) bundle rotation
             muon_noise   float32 (M, Zl + 1)  cols 0..Zl-1: N(0,1) per muon,
                                               col Zl: U[0,1) muon azimuth (radial models
                                               and model.lateral_head=polar)
    outputs  counts       int64   (B,)    muons per event
             muons        float32 (N, 3)  [E GeV, x m, y m], event after event,
                                          N = counts.sum()

Row i of the muons uses row ``i mod M`` of ``muon_noise``: give M >= N. The counts depend
on ``conditions`` and ``event_noise`` only, so a caller that finds counts.sum() > M calls
again with the same event noise and a larger muon noise and gets the same counts. Zg,
Zl, the representation and the muon cap are stored in the file (TorchScript: the
module's constants ``z_global``/``z_local``; ONNX: metadata_props).

``muongen sample`` with seed s draws its noise in this order from one torch.Generator:
multiplicity (B,), context (B, Zg), per-muon (N, Zl), rotation (B,) [xy] or azimuth (N,)
[radial, polar]; :func:`sampler_noise` replays it, which the tests use to check that an export
gives exactly what muongen's own sampler gives.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import warnings
from pathlib import Path

import torch
from torch import nn

from muongen import __version__, schema
from muongen.errors import ConfigError
from muongen.model.generator import (
    LOG_STD_MAX,
    LOG_STD_MIN,
    energy_scale,
    fold_energy,
    scale_energy,
    with_exp_noise,
)
from muongen.model.layers import split_linear
from muongen.model.normaliser import per_nucleon_energy

HELP = "write the generator (with its standardisers) as one TorchScript or ONNX file"
FORMATS = ("torchscript", "onnx")
ONNX_OPSET = 18
INPUT_NAMES = ["conditions", "event_noise", "muon_noise"]
OUTPUT_NAMES = ["counts", "muons"]


class PhysicalGenerator(nn.Module):
    """conditions (physical) + explicit noise -> (counts, muons in physical units).

    Built from a :class:`muongen.model.generator.Generator` (its modules are shared, not
    copied). Written with tensor operations only (no host reads of data-dependent sizes),
    so a trace holds for every batch size and multiplicity.
    """

    def __init__(self, generator: nn.Module) -> None:
        super().__init__()
        for _ in range(3):  # an averaged (EMA) or wrapped copy: the generator inside
            if hasattr(generator, "cond_norm"):
                break
            generator = getattr(generator, "module", None) or generator._orig_mod
        self.cond_norm = generator.cond_norm
        self.muon_norm = generator.muon_norm
        self.multiplicity = generator.multiplicity
        self.multiplicity_spread = generator.multiplicity_spread
        self.hurdle = str(generator.multiplicity_mode) == "hurdle"
        self.stochastic_multiplicity = bool(generator.stochastic_multiplicity)
        self.global_net = generator.global_net
        self.local_net = generator.local_net
        self.z_global = int(generator.z_global)
        self.z_local = int(generator.z_local)
        self.local_exp_noise = int(getattr(generator, "local_exp_noise", 0))
        self.max_muons = int(generator.max_muons)
        self.representation = str(generator.representation)
        self.rotate = bool(generator.rotate)
        self.polar = bool(getattr(generator, "polar", False))
        self.polar_norm = getattr(generator, "polar_norm", None)
        self.energy_norm = getattr(generator, "energy_norm", None)  # energy_reference
        self.energy_scale = getattr(generator, "energy_scale", None)  # energy_scale_head
        self.energy_floor = getattr(generator, "energy_floor", None)  # energy_fold
        # train.calibrate_rows: the map fitted after training, when the checkpoint has one
        self.energy_calibration = getattr(generator, "energy_calibration", None)
        self.radius_calibration = getattr(generator, "radius_calibration", None)
        self.training_domain: dict | None = None  # muongen.domain's record, into the metadata

    def forward(
        self, conditions: torch.Tensor, event_noise: torch.Tensor, muon_noise: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        zg, zl = self.z_global, self.z_local
        cond = schema.condition_features(conditions)  # (B, 4)
        c = self.cond_norm(cond)
        if self.hurdle:  # empty, or a draw of the quantile function, from column 0
            log_mult = self.multiplicity.sample(c, event_noise[:, 0])
        else:
            log_mult = self.multiplicity(c).squeeze(-1)  # (B,)
        if self.multiplicity_spread is not None:
            log_std = self.multiplicity_spread(c).squeeze(-1).clamp(LOG_STD_MIN, LOG_STD_MAX)
            log_mult = log_mult + torch.exp(log_std) * event_noise[:, 0]
        counts = self._counts(log_mult)  # (B,) int64
        log_n = torch.log10(counts.to(cond.dtype) + 1.0).unsqueeze(-1)  # (B, 1)
        context = self.global_net(torch.cat([event_noise[:, 1 : 1 + zg], c, log_n], dim=-1))
        events = torch.arange(conditions.shape[0], device=conditions.device)
        event_of = torch.repeat_interleave(events, counts)  # (N,) event of each muon
        rows = torch.remainder(torch.cumsum(torch.ones_like(event_of), 0) - 1, muon_noise.shape[0])
        noise = muon_noise.index_select(0, rows)  # (N, Zl + 1)
        # the local net's first layer on [context, z_local], split exactly: the context part
        # once per event, the noise part per muon (as the generator computes it)
        z_local = with_exp_noise(noise[:, :zl], self.local_exp_noise)
        hidden = split_linear(self.local_net[0], context, z_local, counts, event_of)
        out = self.local_net[1:](hidden)  # (N, F) standardised
        if self.energy_scale is not None:  # the bundle's energy scale, as the generator
            scale = energy_scale(self.energy_scale(context))
            out = scale_energy(out, scale.index_select(0, event_of))
        # (N, F) features; polar: [log E, r] from the standardised [log E, log r]
        feat = (self.polar_norm if self.polar else self.muon_norm).inverse(out)
        log_e = feat[:, 0]
        ref = per_nucleon_energy(cond).index_select(0, event_of)
        if self.energy_norm is not None:  # per_nucleon: measured from each event's E0 / A
            log_e = self.energy_norm.inverse(out[:, :1]).squeeze(-1) + ref
        if self.energy_floor is not None:  # energy_fold: into [threshold, E0 / A]
            log_e = fold_energy(log_e, self.energy_floor, ref)
        if self.energy_calibration is not None:  # the map fitted after training
            n_of_muon = counts.index_select(0, event_of)
            log_e0 = cond[:, 0].index_select(0, event_of)
            depth = cond[:, 3].index_select(0, event_of)
            log_e = self.energy_calibration(log_e, n_of_muon, log_e0, depth, ref)
        energy = schema.ENERGY_SCALE_GEV * torch.pow(10.0, log_e)
        if self.representation == "radial" or self.polar:
            r = feat[:, 1].abs()
            phi = noise[:, zl] * (2.0 * math.pi)
            x, y = r * torch.sin(phi), r * torch.cos(phi)
        else:
            x, y = feat[:, 1], feat[:, 2]
            if self.rotate:
                angle = (2.0 * math.pi) * event_noise[:, 1 + zg].index_select(0, event_of)
                cos, sin = torch.cos(angle), torch.sin(angle)
                x, y = cos * x - sin * y, sin * x + cos * y
        if self.radius_calibration is not None:  # the radii's map, in feature units
            n_of_muon = counts.index_select(0, event_of)
            x, y = self.radius_calibration(x, y, n_of_muon, cond.index_select(0, event_of))
        x, y = x * schema.POSITION_SCALE_M, y * schema.POSITION_SCALE_M
        return counts, torch.stack([energy, x, y], dim=1)

    def _counts(self, log_mult: torch.Tensor) -> torch.Tensor:
        """As :func:`muongen.model.generator.counts_from_log_mult`, traceable."""
        m = torch.nan_to_num(log_mult.float(), nan=0.0)
        top = math.log10(self.max_muons + 1.0) if self.max_muons > 0 else 30.0
        m = torch.clamp(m, max=top)
        counts = torch.round(torch.clamp(torch.pow(10.0, m) - 1.0, min=0.0)).to(torch.int64)
        return counts.clamp(max=self.max_muons) if self.max_muons > 0 else counts

    def metadata(self) -> dict[str, str]:
        return {
            "muongen_version": __version__,
            "z_global": str(self.z_global),
            "z_local": str(self.z_local),
            "representation": self.representation,
            "lateral_head": "polar" if self.polar else "xy",
            "energy_reference": "none" if self.energy_norm is None else "per_nucleon",
            "local_exp_noise": str(self.local_exp_noise),
            "energy_scale_head": str(self.energy_scale is not None).lower(),
            "energy_fold": str(self.energy_floor is not None).lower(),
            "energy_calibration": str(self.energy_calibration is not None).lower(),
            "radius_calibration": str(self.radius_calibration is not None).lower(),
            "max_muons": str(self.max_muons),
            "inputs": "conditions (B,4) [E GeV, zenith rad, A, depth m]; event_noise "
            "(B,2+z_global) [N(0,1), N(0,1) x z_global, U(0,1)]; muon_noise (M,z_local+1) "
            "[N(0,1) x z_local, U(0,1)], M >= counts.sum()",
            "outputs": "counts int64 (B,); muons float32 (N,3) [E GeV, x m, y m]",
            # the primaries the model was trained on (muongen.domain), "null" if not recorded
            "training_domain": json.dumps(self.training_domain),
        }


def example_inputs(
    module: PhysicalGenerator, n_events: int = 8, n_muons: int = 64, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Plausible inputs (for tracing and smoke tests): primaries 1e5-1e8 GeV at 1.5-2.5 km."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand((n_events, 4), generator=g)
    cond = torch.stack(
        [
            10.0 ** (5 + 3 * u[:, 0]),
            1.2 * u[:, 1],
            torch.tensor([1.0, 4, 14, 56])[(4 * u[:, 2]).long().clamp(max=3)],
            1500.0 + 1000 * u[:, 3],
        ],
        dim=1,
    )
    return cond, *noise_inputs(module, n_events, n_muons, generator=g)


def noise_inputs(
    module: PhysicalGenerator, n_events: int, n_muons: int, *, generator=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh (event_noise, muon_noise) of the documented layout."""
    zg, zl = module.z_global, module.z_local
    event = torch.randn((n_events, 2 + zg), generator=generator)
    event[:, 1 + zg] = torch.rand((n_events,), generator=generator)
    muon = torch.randn((max(n_muons, 1), zl + 1), generator=generator)
    muon[:, zl] = torch.rand((muon.shape[0],), generator=generator)
    return event, muon


def sampler_noise(
    module: PhysicalGenerator, n_events: int, seed: int, counts_of
) -> tuple[torch.Tensor, torch.Tensor]:
    """The noise ``muongen sample --seed`` draws for one batch, in the export's layout.

    ``counts_of(event_noise)`` gives the batch's counts (they depend on column 0 only; the
    later draws depend on how many muons there are), e.g.
    ``lambda ev: module(cond, ev, muon_noise_stub)[0]``. Mirrors the generator's order of
    draws: multiplicity (B,), context (B, Zg) (for every event, also those the generator's
    per-event nets skip), per-muon (N, Zl), then the rotation (B,) or the azimuths (N,)
    (radial, polar).
    """
    zg, zl = module.z_global, module.z_local
    rng = torch.Generator().manual_seed(seed)
    event = torch.zeros((n_events, 2 + zg))
    if module.stochastic_multiplicity:
        event[:, 0] = torch.randn((n_events,), generator=rng)
    n = int(counts_of(event).sum())
    event[:, 1 : 1 + zg] = torch.randn((n_events, zg), generator=rng)
    muon = torch.zeros((max(n, 1), zl + 1))
    muon[:n, :zl] = torch.randn((n, zl), generator=rng)
    if module.representation == "radial" or module.polar:
        muon[:n, zl] = torch.rand((n,), generator=rng)
    elif module.rotate:
        event[:, 1 + zg] = torch.rand((n_events,), generator=rng)
    return event, muon


# ---- writing -----------------------------------------------------------------------------
def export_torchscript(module: PhysicalGenerator, path: str | os.PathLike) -> None:
    """Trace and save; the constants are stored as extra files beside the code."""
    module = module.eval()
    # PyTorch calls TorchScript deprecated; libtorch still loads it, which is what it is for
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        traced = torch.jit.trace(module, example_inputs(module), check_trace=False)
        extra = {"muongen.json": json.dumps(module.metadata())}
        torch.jit.save(traced, str(path), _extra_files=extra)


def export_onnx(module: PhysicalGenerator, path: str | os.PathLike) -> None:
    """Export through the TorchScript tracer with dynamic batch and muon axes."""
    import onnx

    module = module.eval()
    # the TorchScript-based exporter: torch.export (the newer one) refuses the
    # data-dependent muon count; it warns that it is the legacy path, which we know
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            module,
            example_inputs(module),
            str(path),
            input_names=INPUT_NAMES,
            output_names=OUTPUT_NAMES,
            dynamic_axes={
                "conditions": {0: "events"},
                "event_noise": {0: "events"},
                "muon_noise": {0: "muon_noise_rows"},
                "counts": {0: "events"},
                "muons": {0: "muons"},
            },
            opset_version=ONNX_OPSET,
            dynamo=False,
        )
    model = onnx.load(str(path))
    for key, value in module.metadata().items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(model, str(path))


def export(checkpoint: str, fmt: str, out: str | os.PathLike) -> PhysicalGenerator:
    """Load a checkpoint for inference (EMA weights where present) and write ``out``."""
    from muongen.inference import open_for_inference

    if fmt not in FORMATS:
        raise ConfigError(f"unknown export format {fmt!r}; use {' or '.join(FORMATS)}")
    model = open_for_inference(checkpoint, "cpu")
    module = PhysicalGenerator(model.generator).eval()
    module.training_domain = model.domain
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(out).with_name(f".{Path(out).name}.tmp{os.getpid()}")
    try:
        if fmt == "torchscript":
            export_torchscript(module, tmp)
        else:
            export_onnx(module, tmp)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return module


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint",
        help="checkpoint .pt, its .json manifest, a checkpoint folder, or a pelican:// / "
        "osdf:// URL of one",
    )
    parser.add_argument("--format", choices=FORMATS, required=True, help="file format")
    parser.add_argument("--out", required=True, help="output file (.pt for torchscript, .onnx)")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an existing --out (never the checkpoint)"
    )


def run(args: argparse.Namespace) -> int:
    from muongen import checkpoint as ckpt
    from muongen import outputs
    from muongen.inference import is_url, local_copy

    t0 = time.perf_counter()
    inputs = []
    if not is_url(args.checkpoint):
        local = local_copy(args.checkpoint)
        inputs = [local, ckpt.manifest_for(local).with_suffix(".pt")]
        if Path(local).is_dir():
            inputs += [p for m in ckpt.list_checkpoints(local) for p in (m, m.with_suffix(".pt"))]
    outputs.check_file(args.out, inputs=inputs, overwrite=args.overwrite, kind=args.format)
    with outputs.writing(args.out):
        module = export(args.checkpoint, args.format, args.out)
    size = os.path.getsize(args.out)
    print(
        f"wrote {args.out} ({args.format}, {size / 1e6:.2f} MB, z_global {module.z_global}, "
        f"z_local {module.z_local}, {module.representation}) in {time.perf_counter() - t0:.1f} s"
    )
    return 0
