"""`muongen bench <what>`: throughput benchmarks that print figures (never assertions).

``step``: the training step (model + GP + optimizers) on a production-like synthetic batch.
``loader``: the data pipeline against the raw pyarrow read limit.
"""

from __future__ import annotations

import argparse
import importlib

HELP = "benchmarks: `bench step` (training step), `bench loader` (data pipeline)"

#: sub-benchmark -> module defining configure(parser) and run(args)
BENCHES = {
    "step": "muongen.train.bench_step",
    "loader": "muongen.data.bench_loader",
}


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", metavar="WHAT")
    sub.required = True
    for name, modname in BENCHES.items():
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            if exc.name and modname.startswith(exc.name):
                continue
            raise
        p = sub.add_parser(name, help=getattr(mod, "HELP", ""))
        mod.configure(p)
        p.set_defaults(_bench_run=mod.run)


def run(args: argparse.Namespace) -> int:
    return int(args._bench_run(args) or 0)
