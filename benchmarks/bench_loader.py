"""Loader throughput against the raw pyarrow limit, and peak RSS as the dataset grows.

Run:  python benchmarks/bench_loader.py [--rows 2000000] [--mix production|rich|both] [--json]
(the same as `muongen bench loader`; see muongen/data/bench_loader.py). Prints figures;
asserts nothing.
"""

from __future__ import annotations

import sys

from muongen.data.bench_loader import main

if __name__ == "__main__":
    sys.exit(main())
