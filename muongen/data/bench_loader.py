"""`muongen bench loader`: the data pipeline against the raw pyarrow read limit.

For each multiplicity mix (``production``: ~0.37 muons per row, mostly empty rows;
``rich``: ~12 muons per row) synthetic v1 files are written once, then two readers
run over the same files, each in a fresh subprocess (so peak RSS is its own):

* raw: ``ParquetFile.iter_batches(columns=["primary", "muons"])`` and the list offsets
  flattened to numpy; no muongen code, no validation, no shuffling, no batching.
* stream: :class:`muongen.data.stream.EventStream` with its defaults (shuffle buffer on,
  4 open files, batches of 4096 events, validation, outliers siphoned), one epoch.

It prints events/s and muons/s of both, their ratio, and the peak RSS for growing numbers
of files (memory should stay flat as the dataset grows). Figures, never assertions.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HELP = "loader throughput (events/s, muons/s) vs the raw pyarrow limit, and peak RSS"

MIXES = ("production", "rich")
READ_ROWS = 65536  # Arrow record batch rows, as data.read_rows


def raw_pass(paths: list[str], read_rows: int) -> tuple[int, int]:
    """The raw limit: decode and flatten to numpy, nothing else. Returns (events, muons)."""
    import numpy as np
    import pyarrow.parquet as pq

    events = muons = 0
    for path in paths:
        for rb in pq.ParquetFile(path).iter_batches(
            batch_size=read_rows, columns=["primary", "muons"]
        ):
            primary, mu = rb.column(0), rb.column(1)
            off = primary.offsets.to_numpy()
            cond = primary.values.to_numpy()[off[0] : off[-1]].reshape(-1, 4)
            m_off = mu.offsets.to_numpy()
            inner = mu.values
            i_off = inner.offsets.to_numpy()
            flat = inner.values.to_numpy()[i_off[m_off[0]] : i_off[m_off[-1]]].reshape(-1, 3)
            counts = np.diff(m_off)
            events += len(counts)
            assert len(cond) == len(counts)
            muons += len(flat)
    return events, muons


def stream_pass(
    paths: list[str], outlier_dir: str, overrides: dict | None = None
) -> tuple[int, int]:
    """One epoch of EventStream (defaults, or ``overrides`` of the data config)."""
    from muongen.config import DataConfig
    from muongen.data.outliers import OutlierWriter
    from muongen.data.stream import EventStream

    cfg = DataConfig(max_epochs=1, **(overrides or {}))
    events = muons = 0
    with OutlierWriter(outlier_dir) as writer:
        stream = EventStream(paths, cfg, outliers=writer)
        for batch in stream:
            events += batch.n_events
            muons += batch.n_muons
        events += stream.stats["outliers"]  # read and delivered, to the outlier dataset
    return events, muons


def child(mode: str, paths: list[str], repeat: int, read_rows: int, overrides: dict) -> dict:
    """One measurement in this (fresh) process: the best of ``repeat`` passes."""
    import torch

    torch.set_num_threads(1)
    best = best_cpu = None
    for i in range(repeat + 1):  # the first pass warms the page cache and is not counted
        t0, c0 = time.perf_counter(), time.process_time()
        if mode == "raw":
            events, muons = raw_pass(paths, read_rows)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                events, muons = stream_pass(paths, tmp, overrides)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        if i == 0:
            continue
        best = dt if best is None else min(best, dt)
        best_cpu = cpu if best_cpu is None else min(best_cpu, cpu)
    return {
        "mode": mode,
        "events": events,
        "muons": muons,
        "seconds": best,
        "cpu_seconds": best_cpu,  # all threads of the process
        "events_per_s": events / best,
        "muons_per_s": muons / best,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _measure(mode: str, paths: list[str], repeat: int, overrides: dict) -> dict:
    argv = ["--child", mode, str(repeat), str(READ_ROWS), json.dumps(overrides), *paths]
    out = subprocess.run(
        [sys.executable, "-m", "muongen.data.bench_loader", *argv],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def configure(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--rows", type=int, default=2_000_000, help="rows of the largest dataset (default 2M)")
    add("--rows-per-file", type=int, default=100_000, help="rows per file (default 100k)")
    add("--mix", choices=[*MIXES, "both"], default="both", help="multiplicity mix (default both)")
    add("--sizes", default="0.25,0.5,1", help="dataset sizes as fractions of --rows (RSS curve)")
    add("--repeat", type=int, default=3, help="passes per measurement; the best counts")
    add("--data", default="", help="folder for the synthetic files, reused (default: temp)")
    add(
        "--stream",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="data config of the stream, e.g. shuffle_buffer_events=0 (repeatable)",
    )
    add("--json", action="store_true", help="print one JSON object instead of a table")


def _dataset(folder: Path, files: int, rows: int, mix: str) -> list[str]:
    from muongen.data.synth import file_path, write_synthetic

    paths = [str(file_path(folder, k, "parquet-v1")) for k in range(files)]
    if all(Path(p).exists() for p in paths):
        return paths
    return write_synthetic(folder, files=files, events_per_file=rows, mix=mix, seed=1)


def run(args: argparse.Namespace) -> int:
    from muongen.config import DataConfig

    overrides = {}
    for item in args.stream:
        key, _, value = item.partition("=")
        overrides[key] = json.loads(value)
    DataConfig(**overrides)  # a bad key fails here, not in the subprocess
    mixes = MIXES if args.mix == "both" else (args.mix,)
    fractions = sorted(float(f) for f in args.sizes.split(","))
    n_files = max(1, round(args.rows * max(fractions)) // args.rows_per_file)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.data or tmp)
        for mix in mixes:
            paths = _dataset(base / f"{mix}-{args.rows_per_file}", n_files, args.rows_per_file, mix)
            for frac in fractions:
                subset = paths[: max(1, round(args.rows * frac) // args.rows_per_file)]
                raw = _measure("raw", subset, args.repeat, overrides)
                stream = _measure("stream", subset, args.repeat, overrides)
                results.append(
                    {
                        "mix": mix,
                        "files": len(subset),
                        "rows": len(subset) * args.rows_per_file,
                        "stream_config": overrides,
                        "raw": raw,
                        "stream": stream,
                        "ratio": stream["events_per_s"] / raw["events_per_s"],
                        "cpu_ratio": raw["cpu_seconds"] / stream["cpu_seconds"],
                    }
                )
                if not args.json:
                    _print_row(results[-1], header=len(results) == 1)
    if args.json:
        print(json.dumps({"results": results}, indent=2))
    return 0


def _print_row(r: dict, header: bool) -> None:
    if header:
        print(
            f"{'mix':<11}{'rows':>10}{'muons':>11} | "
            f"{'raw ev/s':>10}{'raw mu/s':>10}{'RSS MB':>8} | "
            f"{'stream ev/s':>12}{'stream mu/s':>12}{'RSS MB':>8} | {'ratio':>6}{'cpu':>6}"
        )
    raw, st = r["raw"], r["stream"]
    print(
        f"{r['mix']:<11}{r['rows']:>10}{raw['muons']:>11} | {raw['events_per_s'] / 1e6:>9.2f}M"
        f"{raw['muons_per_s'] / 1e6:>9.2f}M{raw['peak_rss_mb']:>8.0f} | "
        f"{st['events_per_s'] / 1e6:>11.2f}M"
        f"{st['muons_per_s'] / 1e6:>11.2f}M{st['peak_rss_mb']:>8.0f} | {r['ratio']:>6.2f}"
        f"{r['cpu_ratio']:>6.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        mode, repeat, read_rows, overrides, *paths = argv[1:]
        print(json.dumps(child(mode, paths, int(repeat), int(read_rows), json.loads(overrides))))
        return 0
    parser = argparse.ArgumentParser(prog="muongen bench loader", description=HELP)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
