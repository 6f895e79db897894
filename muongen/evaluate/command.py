"""`muongen evaluate`: how close is a generator to the simulation it replaces?

    muongen evaluate --checkpoint CKPT --data HELD_OUT... --out DIR [--events N]
                     [--device auto] [--n-splits N] [--seed 0]
                     [--bins log10_energy=5,6,7,8 ...] [--min-bin-events 50]
                     [--ratio-target 3] [--batch 4096] [--exact-w1] [--single-draw]

Reads held-out events, generates bundles for their primaries (anew for each split's
half, and once for all of them for the plots), and compares them with
the held-out muons (metrics.py) against the statistical floor (floors.py) and the
condition-ignoring baseline (baseline.py). Writes ``DIR/metrics.json`` (every value),
``DIR/report.md`` (tables) and PNG plots, and prints a short summary (report.console_summary).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure

from muongen import __version__
from muongen.data.batch import RaggedBatch
from muongen.errors import ConfigError, MuongenError
from muongen.evaluate import plots, report
from muongen.evaluate.baseline import baseline_for
from muongen.evaluate.features import CONDITION_VARIABLES, EventSample, shower_groups
from muongen.evaluate.floors import BIN_VARIABLES, compare, default_bins
from muongen.evaluate.metrics import parse_edges
from muongen.evaluate.sample import read_inputs, resolve_device, split_draws, timed_generate
from muongen.evaluate.sample_command import add_output_options

#: what evaluate writes into --out besides the plots (an earlier evaluation there is refused
#: without --overwrite)
OUTPUT_FILES = ("metrics.json", "report.md")

#: Held-out events used by default and the splits averaged over: at this size (1000 showers
#: of 100 rows) and this many splits the floors are known to about 20 % (measured in
#: benchmarks/bench_floors.py; the README gives the table).
DEFAULT_EVENTS = 100000
DEFAULT_SPLITS = 16

HELP = "compare a checkpoint's bundles with held-out simulation: metrics.json, report.md, plots"
log = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--checkpoint",
        required=True,
        help="checkpoint .pt, its .json manifest, or a checkpoint folder (newest valid)",
    )
    parser.add_argument(
        "--data",
        required=True,
        nargs="+",
        metavar="HELD_OUT",
        help="held-out files, folders, globs",
    )
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument(
        "--events",
        type=int,
        default=DEFAULT_EVENTS,
        help=f"held-out events used (default {DEFAULT_EVENTS}: floors known to about 20 %%)",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N, mps")
    parser.add_argument("--batch", type=int, default=4096, help="events per generator call")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for generating on the CPU (default 1: the evaluation's own work "
        "is single-threaded numpy, and spare threads slow it down on a busy machine; "
        "0: torch's default)",
    )
    parser.add_argument(
        "--n-splits",
        type=int,
        default=DEFAULT_SPLITS,
        help=f"random half splits averaged over; errors from their spread ({DEFAULT_SPLITS})",
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds generation, splits, baseline")
    parser.add_argument(
        "--bins",
        action="append",
        default=[],
        metavar="VAR=EDGES",
        help=(
            "bin edges of a condition variable, e.g. log10_energy=5,6,7,8 (repeatable; variables: "
            f"{', '.join(BIN_VARIABLES)}; default: 4 equally populated bins each)"
        ),
    )
    parser.add_argument(
        "--min-bin-events",
        type=int,
        default=50,
        help="bins with fewer events per half are sparse, and a metric is left out of a split "
        "whose reference half gives it fewer events to rest on (events with muons, or "
        "bundles of its multiplicity bin)",
    )
    parser.add_argument(
        "--no-shower-groups",
        action="store_true",
        help="split and bootstrap single rows, not whole showers (for files of independent rows)",
    )
    parser.add_argument(
        "--ratio-target", type=float, default=3.0, help="a metric passes within this x its floor"
    )
    parser.add_argument(
        "--exact-w1",
        action="store_true",
        help="per-muon W1 by exact sorts instead of the fine grid (slower; same to ~0.1 %%)",
    )
    parser.add_argument(
        "--single-draw",
        action="store_true",
        help="measure the model on one generation for all splits (as before 2026-11-27: "
        "faster, but that draw's noise is in every split and not in the errors)",
    )
    parser.add_argument(
        "--uncalibrated",
        action="store_true",
        help="the generator's own muon energies and radii, without the calibrations the "
        "checkpoint carries (train.calibrate_rows)",
    )
    add_output_options(parser)  # --overwrite, --domain


def parse_bins(items: list[str], real: EventSample, n_bins: int = 4) -> dict[str, np.ndarray]:
    """``VAR=e1,e2,...`` items -> edges; variables not given get ``n_bins`` quantile bins."""
    bins = default_bins(real, n_bins)
    for item in items:
        var, sep, text = item.partition("=")
        var = var.strip()
        if not sep or var not in CONDITION_VARIABLES:
            raise ConfigError(
                f"--bins {item!r}: expected VAR=e1,e2,... with VAR one of "
                f"{', '.join(CONDITION_VARIABLES)}"
            )
        try:
            bins[var] = parse_edges(text)
        except ValueError as exc:
            raise ConfigError(f"--bins {item!r}: {exc}") from None
    return bins


def evaluate_generator(
    generator: torch.nn.Module,
    real_batch: RaggedBatch,
    *,
    device: torch.device | str | None = None,
    batch_events: int = 4096,
    seed: int = 0,
    n_splits: int = DEFAULT_SPLITS,
    bins: dict[str, np.ndarray] | list[str] | None = None,
    min_events: int = 50,
    ratio_target: float = 3.0,
    group_showers: bool = True,
    fast: bool = True,
    redraw: bool = True,
) -> tuple[dict[str, Any], dict[str, EventSample]]:
    """Generate for ``real_batch``'s primaries and compare (see floors.compare).

    With ``group_showers`` the rows of one shower (consecutive events with the same primary,
    one per depth) stay together in the half split and the bootstrap. With ``redraw`` the
    model is generated anew for each split's half (seeded by ``seed`` and the split): its
    own noise then averages down over the splits and enters the errors, as the floor's and
    the baseline's do; without, one draw for all primaries serves every split. That draw
    is made either way (the plots, the throughput and the W1 grid use it).

    Returns:
        (result dict with "throughput" added, {"real", "model", "baseline"} samples for plots;
        this baseline is pooled from all held-out events, the one in the metrics from half B)
    """
    real = EventSample.from_batch(real_batch)
    if group_showers:
        real = real.with_groups(shower_groups(real.conditions))
    if real.n_events < 4:
        raise ConfigError(f"evaluation needs at least 4 held-out events, got {real.n_events}")
    if bins is None or isinstance(bins, list):
        bins = parse_bins(bins or [], real)
    fake_batch, speed = timed_generate(
        generator, real_batch.conditions, device=device, batch_events=batch_events, seed=seed
    )
    # identical primaries (float32 both ways), so the samples align event by event
    model = EventSample.from_arrays(
        real.conditions, fake_batch.muons.numpy(), fake_batch.counts.numpy()
    )
    draws = None
    if redraw:
        kw = {"device": device, "batch_events": batch_events, "seed": seed}
        draws = {"model": split_draws(generator, real_batch.conditions, **kw)}
    result = compare(
        real,
        {"model": model},
        bins=bins,
        n_splits=n_splits,
        min_events=min_events,
        seed=seed,
        ratio_target=ratio_target,
        fast=fast,
        redraw=draws,
    )
    result["split"]["model_draws"] = "per split" if redraw else "one"
    result["throughput"] = speed.as_dict()
    base = baseline_for(real, real.conditions, np.random.default_rng(seed + 1))
    return result, {"real": real, "model": model, "baseline": base}


def make_figures(samples: dict[str, EventSample], result: dict[str, Any]) -> dict[str, Figure]:
    """The evaluation plots, name -> Figure, each with a provenance footer (result["meta"])."""
    real = samples["real"]
    others = {k: v for k, v in samples.items() if k != "real"}
    figures = {
        **plots.feature_figures(real, others),
        "multiplicity_vs_energy": plots.multiplicity_vs_energy(real, others),
        "by_depth": plots.by_depth(real, {"model": samples["model"]}),
        "binned_ratios": plots.binned_ratios(result),
    }
    footer = plots.provenance(result.get("meta"))
    return {name: plots.add_footer(fig, footer) for name, fig in figures.items()}


def write_outputs(
    out_dir: str | Path,
    result: dict[str, Any],
    figures: Callable[[], dict[str, Figure]],
) -> tuple[dict[str, Path], str | None]:
    """metrics.json, the PNGs and report.md in ``out_dir``.

    metrics.json is written first, so the figures (drawn by ``figures()``) cannot cost the
    metrics: when drawing fails, report.md is written without plots and the reason is
    returned. Returns the paths and that reason (None when every plot was written).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"metrics": report.write_metrics_json(out_dir / "metrics.json", result)}
    failed = None
    try:
        pngs = plots.save_figures(figures(), out_dir)
    except Exception as exc:
        log.debug("plotting failed", exc_info=True)
        pngs, failed = [], f"{type(exc).__name__}: {exc}"
    paths["report"] = report.write_report(out_dir / "report.md", result, pngs)
    paths.update({p.stem: p for p in pngs})
    return paths, failed


def run(args: argparse.Namespace) -> int:
    if args.events is not None and args.events < 4:
        raise ConfigError("--events must be >= 4")
    if args.n_splits < 1 or args.batch < 1 or args.threads < 0:
        raise ConfigError(
            "--n-splits must be >= 1 (>= 2 for errors and verdicts), --batch >= 1, --threads >= 0"
        )
    _check_outputs(args)  # before minutes of work
    device = resolve_device(args.device)
    before = torch.get_num_threads()
    if device.type == "cpu" and args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        return _evaluate(args, device)
    finally:
        torch.set_num_threads(before)  # for callers in this process (tests, notebooks)


def _check_outputs(args: argparse.Namespace) -> None:
    """--out must be a folder that can be written and holds no earlier evaluation (unless
    --overwrite); an input file is never an output."""
    from muongen.outputs import check_folder
    from muongen.storage.files import expand_inputs

    args.data_files = expand_inputs(args.data)
    check_folder(args.out, OUTPUT_FILES, inputs=args.data_files, overwrite=args.overwrite)


def _calibration_note(generator: torch.nn.Module, kind: str = "energy") -> str:
    calibration = getattr(generator, f"{kind}_calibration", None)
    return "none" if calibration is None else calibration.describe()


def _evaluate(args: argparse.Namespace, device: torch.device) -> int:
    from muongen import domain as training_domain
    from muongen.inference import open_for_inference

    model = open_for_inference(args.checkpoint, device, calibrated=not args.uncalibrated)
    generator = model.generator
    real = read_inputs(args.data_files, args.events)
    extrapolated = training_domain.check(
        model.domain, real.conditions.numpy(), args.domain, what="held-out primaries"
    )
    log.info("evaluating on %d held-out events (%d muons)", real.n_events, real.n_muons)
    result, samples = evaluate_generator(
        generator,
        real,
        device=device,
        batch_events=args.batch,
        seed=args.seed,
        n_splits=args.n_splits,
        bins=args.bins,
        min_events=args.min_bin_events,
        ratio_target=args.ratio_target,
        group_showers=not args.no_shower_groups,
        fast=not args.exact_w1,
        redraw=not args.single_draw,
    )
    result["meta"] = {
        "checkpoint": model.source,
        "step": model.meta.get("step"),
        "range": model.meta.get("range"),
        "data": list(args.data),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "muongen_version": __version__,
        "device": str(device),
        "seed": args.seed,
        "energy_calibration": _calibration_note(generator),
        "radius_calibration": _calibration_note(generator, "radius"),
    }
    result["training_domain"] = extrapolated
    from muongen.outputs import writing

    with writing(args.out):
        paths, failed = write_outputs(args.out, result, lambda: make_figures(samples, result))
    print(report.console_summary(result))  # the tables are in report.md
    print(
        f"wrote metrics.json, report.md (the full tables) and {len(paths) - 2} plots in {args.out}"
    )
    if failed:
        raise MuongenError(
            f"the plots could not be drawn ({failed}); {paths['metrics']} and "
            f"{paths['report']} are complete. Reinstall muongen with its dependencies "
            "(pip install -e .) and run evaluate again for the plots"
        )
    return 0
