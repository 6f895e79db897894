"""`muongen sample`: generate muon bundles for given primaries and write them to a file.

    muongen sample --checkpoint CKPT (--primaries INPUT... | --grid SPEC | --flux MODEL)
                   --out FILE [--format v1|v2|hdf5] [--device auto] [--batch 4096]
                   [--seed 0] [--events N] [--overwrite] [--domain warn|strict]
    flux: --flux H3a|H4a|GST|GSF --showers N [--energy 1e4:1e9] [--zenith 0:85]
          [--depths 1500] [--masses 1,4,14,27,56] [--gamma 2] [--area perpendicular]
          [--report DIR]

The output has the production schema the trainer reads (v1 with shower ids), so it
round-trips through `muongen inspect` and the loader. Prints events/s and muons/s.
With ``--flux`` the primaries come from a generation spectrum and every row carries a
weight in 1/(m^2 s) (see :mod:`muongen.evaluate.flux`); ``--report`` gets flux.json and
the figures of :mod:`muongen.evaluate.flux_report`.

Before anything is generated the outputs are checked (:mod:`muongen.outputs`: an existing
file is refused without ``--overwrite``, an input never overwritten, a suffix that
contradicts ``--format`` refused) and the primaries are compared with the checkpoint's
training domain (:mod:`muongen.domain`): those outside are counted in one line, or refused
with ``--domain strict``.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from datetime import datetime, timezone
from pathlib import Path

from muongen import __version__, outputs
from muongen import domain as training_domain
from muongen.errors import ConfigError
from muongen.evaluate.flux import AREAS, DEFAULT_MASSES, FLUX_MODELS, parse_range
from muongen.evaluate.sample import (
    FORMAT_NAMES,
    GRID_EXAMPLE,
    parse_depths,
    parse_grid,
    read_inputs,
    resolve_device,
    timed_generate,
    write_sample,
)

HELP = "generate muon bundles for primaries from files, a grid or a flux model; write v1/v2/HDF5"
log = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--checkpoint",
        required=True,
        help="checkpoint .pt, its .json manifest, or a checkpoint folder (newest valid)",
    )
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--primaries",
        nargs="+",
        metavar="FILE",
        help=(
            "event files, folders, globs or pelican:// / osdf:// URLs (wildcards allowed) whose "
            "primaries are used; muons ignored"
        ),
    )
    src.add_argument(
        "--grid",
        metavar="SPEC",
        help=(
            f"grid of primaries, e.g. {GRID_EXAMPLE} (energy GeV, log-spaced for a:b:n; "
            "zenith rad; mass A; depth m; count events per point)"
        ),
    )
    src.add_argument(
        "--flux",
        choices=sorted(FLUX_MODELS),
        help="draw primaries from a generation spectrum and weight them to this flux model",
    )
    flux = parser.add_argument_group("flux weighting (with --flux)")
    flux.add_argument("--showers", type=int, help="showers to generate (each at every depth)")
    flux.add_argument("--energy", default="1e4:1e9", help="primary energy min:max, GeV")
    flux.add_argument("--zenith", default="0:85", help="zenith min:max, degrees")
    flux.add_argument(
        "--depths", default="1500", help="vertical depths, m: 1500, 1500,2000 or 1000:2800:10"
    )
    flux.add_argument(
        "--masses",
        default=",".join(f"{m:g}" for m in DEFAULT_MASSES),
        help="mass groups (A), equal showers each; the model's elements go to the nearest",
    )
    flux.add_argument(
        "--gamma", type=float, default=2.0, help="generation spectrum E^-gamma (default 2)"
    )
    flux.add_argument(
        "--area",
        choices=AREAS,
        default="perpendicular",
        help="weights per unit area perpendicular to the shower axis (default) or horizontal",
    )
    flux.add_argument(
        "--report", default=None, help="folder for flux.json and plots (default: OUT-report)"
    )
    parser.add_argument("--out", required=True, help="output file")
    parser.add_argument(
        "--format",
        choices=sorted(FORMAT_NAMES),
        default=None,
        help="output schema (default: hdf5 for .h5/.hdf5 names, else v1)",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N, mps")
    parser.add_argument("--batch", type=int, default=4096, help="events per generator call")
    parser.add_argument(
        "--seed", type=int, default=0, help="noise seed (>= 0; also the v1 id major)"
    )
    parser.add_argument("--events", type=int, default=None, help="use at most N primaries")
    add_output_options(parser)


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """--overwrite and --domain, shared with `muongen evaluate`."""
    parser.add_argument(
        "--overwrite", action="store_true", help="replace existing output files (never an input)"
    )
    parser.add_argument(
        "--domain",
        choices=training_domain.MODES,
        default="warn",
        help="primaries outside the checkpoint's training domain: count them in one line "
        "(warn, the default) or refuse to run (strict)",
    )


def output_format(out: str, fmt: str | None) -> str:
    if fmt is not None:
        return FORMAT_NAMES[fmt]
    return FORMAT_NAMES["hdf5" if Path(out).suffix in (".h5", ".hdf5", ".hdf") else "v1"]


def _kind(fmt: str) -> str:
    return "hdf5" if fmt == FORMAT_NAMES["hdf5"] else "parquet"


def run(args: argparse.Namespace) -> int:
    from muongen.checkpoint import resolve
    from muongen.inference import is_url, local_copy, open_for_inference
    from muongen.storage.files import expand_inputs

    if args.batch < 1 or args.seed < 0:
        raise ConfigError("--batch must be >= 1 and --seed >= 0")
    if args.events is not None and args.events < 1:
        raise ConfigError(f"--events {args.events}: give at least 1 (or leave it out for all)")
    fmt = output_format(args.out, args.format)
    files = expand_inputs(args.primaries) if args.primaries else []
    checkpoint = args.checkpoint if is_url(args.checkpoint) else local_copy(args.checkpoint)
    inputs = [*files, *_checkpoint_files(checkpoint, resolve, is_url)]
    outputs.check_file(args.out, inputs=inputs, overwrite=args.overwrite, kind=_kind(fmt))
    if args.flux:
        outputs.check_folder(
            _report_dir(args), ["flux.json"], flag="--report", inputs=inputs,
            overwrite=args.overwrite,
        )  # fmt: skip
    device = resolve_device(args.device)
    model = open_for_inference(checkpoint, device)
    generator = model.generator
    if args.flux:
        return run_flux(args, model, device, fmt)
    if args.grid:
        conditions = parse_grid(args.grid)
        if args.events is not None:
            conditions = conditions[: args.events]
        source = f"grid {args.grid}"
    else:
        conditions = read_inputs(files, args.events).conditions.numpy()
        source = ", ".join(args.primaries)
    if len(conditions) == 0:
        raise ConfigError(f"no primaries in {source}: the files hold no events")
    training_domain.check(model.domain, conditions, args.domain)
    batch, speed = timed_generate(
        generator, conditions, device=device, batch_events=args.batch, seed=args.seed
    )
    with outputs.writing(args.out):
        write_sample(args.out, batch, fmt, seed=args.seed)
    print(speed.line())
    _warn_capped(generator, batch)
    print(f"wrote {args.out} ({fmt}, {batch.n_events:,} events from {source})")
    return 0


def _checkpoint_files(checkpoint: str, resolve, is_url) -> list[str]:
    """The local files of the checkpoint (its manifest and .pt), which no output may be."""
    if is_url(checkpoint):
        return []
    try:
        manifest = resolve(checkpoint)
    except Exception:  # a missing checkpoint is reported when it is opened
        return [checkpoint]
    return [str(manifest), str(manifest.with_suffix(".pt"))]


def _report_dir(args: argparse.Namespace) -> str:
    return args.report or f"{Path(args.out).with_suffix('')!s}-report"


def _warn_capped(generator, batch) -> None:
    cap = getattr(generator, "max_muons", 0)
    capped = int((batch.counts >= cap).sum()) if cap else 0
    if capped:
        print(
            f"warning: {capped:,} of {batch.n_events:,} bundles reached the generator's cap of "
            f"{cap:,} muons (model.max_generated_muons) and were cut there; raise the cap in "
            "the checkpoint's config if these bundles matter downstream",
            file=sys.stderr,
        )


def run_flux(args: argparse.Namespace, model, device, fmt: str) -> int:
    """--flux: weighted primaries -> bundles at every depth -> file + report."""
    from muongen.evaluate import plots
    from muongen.evaluate.flux import FluxWeighter, Generation
    from muongen.evaluate.flux_report import flux_report

    if not args.showers or args.showers < 1:
        raise ConfigError("--flux needs --showers N (N >= 1)")
    try:
        masses = tuple(float(t) for t in args.masses.split(","))
    except ValueError:
        raise ConfigError(f"--masses {args.masses!r} must be mass numbers, e.g. 1,4,14") from None
    zen = parse_range(args.zenith, "zenith", "degrees")
    gen = Generation(
        showers=args.showers,
        energy_gev=parse_range(args.energy, "energy", "GeV"),
        zenith_rad=(math.radians(zen[0]), math.radians(zen[1])),
        masses=masses,
        gamma=args.gamma,
    )
    depths = parse_depths(args.depths)
    weighter = FluxWeighter(args.flux, masses)
    for m, ids in zip(masses, weighter.groups):
        if not ids:
            print(f"note: {args.flux} has no element near A = {m:g}; its showers get weight 0")
    primaries = weighter.sample(gen, seed=args.seed, area=args.area)
    conditions, weights, shower = primaries.conditions(depths)
    extrapolated = training_domain.check(
        model.domain, conditions, args.domain, weights=weights, what="primary rows"
    )
    generator = model.generator
    batch, speed = timed_generate(
        generator, conditions, device=device, batch_events=args.batch, seed=args.seed
    )
    with outputs.writing(args.out):
        write_sample(args.out, batch, fmt, seed=args.seed, minor=shower, weights=weights)
    print(speed.line())
    _warn_capped(generator, batch)
    report_dir = _report_dir(args)
    footer = plots.provenance(
        {
            "checkpoint": model.source,
            "step": model.meta.get("step"),
            "data": f"{args.flux} flux, {args.showers:,} showers, seed {args.seed}",
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "muongen_version": __version__,
        }
    )
    with outputs.writing(report_dir, "--report"):
        summary = flux_report(
            report_dir,
            primaries,
            batch.counts.numpy(),
            depths,
            weighter,
            gen,
            domain=model.domain,
            extrapolated=extrapolated,
            provenance=footer,
        )
    r = summary["rates"]
    print(
        f"{args.flux}: model integral {r['model_integral_rate']:.5g} /(m^2 s), weighted sample "
        f"{r['sample_rate']:.5g} +- {r['sample_rate_err']:.2g} /(m^2 s) ({args.area} area, "
        f"E {gen.energy_gev[0]:g}-{gen.energy_gev[1]:g} GeV, zenith {zen[0]:g}-{zen[1]:g} deg)"
    )
    for d in r["by_depth"][:10]:
        print(
            f"  depth {d['depth_m']:.0f} m: bundles (N >= 1) {d['bundle_rate']:.4g} +- "
            f"{d['bundle_rate_err']:.2g} /(m^2 s) from {d['bundles']:,} of "
            f"{primaries.n_showers:,} showers"
        )
    print(
        f"wrote {args.out} ({fmt}, {batch.n_events:,} rows = {primaries.n_showers:,} showers x "
        f"{len(depths)} depths, weight column in 1/(m^2 s)) and {report_dir}/flux.json + plots"
    )
    return 0
