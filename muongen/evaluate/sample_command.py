"""`muongen sample`: generate muon bundles for given primaries and write them to a file.

    muongen sample --checkpoint CKPT (--primaries FILE... | --grid SPEC) --out FILE
                   [--format v1|v2|hdf5] [--device auto] [--batch 4096] [--seed 0]
                   [--events N]

The output has the production schema the trainer reads (v1 with shower ids), so it
round-trips through `muongen inspect` and the loader. Prints events/s and muons/s.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from muongen.errors import ConfigError
from muongen.evaluate.sample import (
    FORMAT_NAMES,
    GRID_EXAMPLE,
    parse_grid,
    read_inputs,
    resolve_device,
    timed_generate,
    write_sample,
)

HELP = "generate muon bundles for primaries from a file or a grid; write v1/v2/HDF5 files"
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
        help="Parquet/HDF5 event files (or folders, globs) whose primaries are used; muons ignored",
    )
    src.add_argument(
        "--grid",
        metavar="SPEC",
        help=(
            f"grid of primaries, e.g. {GRID_EXAMPLE} (energy GeV, log-spaced for a:b:n; "
            "zenith rad; mass A; depth m; count events per point)"
        ),
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


def output_format(out: str, fmt: str | None) -> str:
    if fmt is not None:
        return FORMAT_NAMES[fmt]
    return FORMAT_NAMES["hdf5" if Path(out).suffix in (".h5", ".hdf5", ".hdf") else "v1"]


def run(args: argparse.Namespace) -> int:
    from muongen.checkpoint import load_for_inference

    if args.batch < 1 or args.seed < 0:
        raise ConfigError("--batch must be >= 1 and --seed >= 0")
    fmt = output_format(args.out, args.format)
    device = resolve_device(args.device)
    generator, _ = load_for_inference(args.checkpoint, device)
    if args.grid:
        conditions = parse_grid(args.grid)
        if args.events is not None:
            conditions = conditions[: args.events]
        source = f"grid {args.grid}"
    else:
        conditions = read_inputs(args.primaries, args.events).conditions.numpy()
        source = ", ".join(args.primaries)
    if len(conditions) == 0:
        raise ConfigError(f"no primaries in {source}")
    batch, speed = timed_generate(
        generator, conditions, device=device, batch_events=args.batch, seed=args.seed
    )
    write_sample(args.out, batch, fmt, seed=args.seed)
    print(speed.line())
    cap = getattr(generator, "max_muons", 0)
    capped = int((batch.counts >= cap).sum()) if cap else 0
    if capped:
        print(
            f"warning: {capped:,} of {batch.n_events:,} bundles reached the generator's cap of "
            f"{cap:,} muons (model.max_generated_muons) and were cut there; raise the cap in "
            "the checkpoint's config if these bundles matter downstream",
            file=sys.stderr,
        )
    print(f"wrote {args.out} ({fmt}, {batch.n_events:,} events from {source})")
    return 0
