"""A trained checkpoint with its muon energies calibrated after training, on `muongen
evaluate`'s yardstick: what ``train.calibrate_rows`` would have given it, without training
it again.

    python benchmarks/calibrated_candidate.py --checkpoint run/checkpoints --fit train \
        --data heldA --out ev-cal-heldA [--fit-rows N] [--by off] [--depth-bins 4]

The map is the trainer's own (:func:`muongen.train.calibrate.fit_on_files`, the classes and
quantile matching of :mod:`muongen.model.calibration`), fitted on the first ``--fit-rows``
rows of the training files ``--fit`` (all by default) and attached to the checkpoint's
generator as `muongen.inference.open_for_inference` attaches a stored one; the
candidate is then scored by `muongen evaluate`'s own code (the same splits, bins, tail rows
and W1, drawn anew in every split). ``--by off`` scores the checkpoint as it is (the
control: evaluate's numbers). Writes metrics.json and report.md and prints evaluate's
summary. Asserts nothing; the held-out files are scored, never fitted on.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch

from muongen.evaluate import report
from muongen.evaluate.command import DEFAULT_SPLITS, evaluate_generator
from muongen.evaluate.sample import read_inputs
from muongen.inference import open_for_inference
from muongen.model.calibration import EnergyCalibration, RadiusCalibration
from muongen.storage.files import expand_inputs
from muongen.train.calibrate import fit_on_files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--fit", nargs="+", required=True, help="training files or folders")
    ap.add_argument("--fit-rows", type=int, default=None, help="first N training rows (all)")
    ap.add_argument("--data", nargs="+", required=True, help="held-out files or folders")
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--by",
        choices=["off", "mult-energy"],
        default="mult-energy",
        help="mult-energy: the trainer's map (bundle size x primary-energy quartile); "
        "off: none, the control",
    )
    ap.add_argument(
        "--depth-bins",
        type=int,
        default=1,
        help="also split the classes by this many depth quantiles (1: none, as the trainer)",
    )
    ap.add_argument(
        "--radius",
        choices=["off", "mult-zenith"],
        default="off",
        help="mult-zenith: also map the muons' distances to the axis (bundle size x cos "
        "zenith quantile)",
    )
    ap.add_argument("--zenith-bins", type=int, default=4, help="the radius map's cos z classes")
    ap.add_argument(
        "--radius-energy-bins", type=int, default=1, help="the radius map's E0 classes (1: none)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-splits", type=int, default=DEFAULT_SPLITS)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    model = open_for_inference(a.checkpoint, "cpu", calibrated=False)
    generator = model.generator
    if a.by != "off" or a.radius != "off":
        files = expand_inputs(a.fit)
        rows = a.fit_rows or 2**62
        states = fit_on_files(
            generator,
            files,
            rows,
            device="cpu",
            seed=a.seed,
            depth_bins=a.depth_bins,
            radius=a.radius != "off",
            zenith_bins=a.zenith_bins,
            radius_energy_bins=a.radius_energy_bins,
        )
        if a.by != "off":
            generator.energy_calibration = EnergyCalibration(states["energy"])
            print(f"energy calibration: {generator.energy_calibration.describe()}")
        if a.radius != "off":
            generator.radius_calibration = RadiusCalibration(states["radius"])
            print(f"radius calibration: {generator.radius_calibration.describe()}")
    real = read_inputs(a.data)
    result, _ = evaluate_generator(generator, real, device="cpu", seed=a.seed, n_splits=a.n_splits)
    result["meta"] = {
        "checkpoint": f"{model.source}"
        + ("" if a.by == "off" else " + energy calibration")
        + ("" if a.radius == "off" else " + radius calibration"),
        "step": model.meta.get("step"),
        "seed": a.seed,
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    report.write_metrics_json(out / "metrics.json", result)
    report.write_report(out / "report.md", result)
    print(report.console_summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
