"""Time to stream N small input files over a federation with added latency, with and
without the Prefetcher.

Starts the tests' local Pelican federation (HTTPS on 127.0.0.1, real pelicanfs client),
adds ``--latency-ms`` to every request (director and origin), puts ``--files`` small
synthetic Parquet files in range folders of a token-protected namespace, and reads them
all three ways, each with prefetch off and with ``--ahead`` files staged ahead:

- raw: every file read fully (open_input / the staged copy);
- reader: every file decoded by muongen.data.reader (Parquet -> RaggedBatch);
- stream: one epoch of muongen.data.stream.EventStream (the training loader).

Run:  python benchmarks/bench_prefetch.py [--files 200] [--latency-ms 50] [--ahead 8]
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the local federation lives with the tests

from pelican_federation import Federation  # noqa: E402

from muongen.storage import files  # noqa: E402
from muongen.storage.prefetch import Prefetcher  # noqa: E402


class RemoteFederation:
    """The federation in its own process, so that its servers do not share this process's
    GIL with the client threads being timed (a real federation is on other machines)."""

    def __init__(self, root: Path, latency_s: float) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(str(root), latency_s, child), daemon=True)
        self._proc.start()
        self.host, self.ca_file, storage = self._conn.recv()
        self._local = Federation.__new__(Federation)  # only for url()/put_bytes()/token()
        self._local.storage, self._local.director_port = Path(storage), int(self.host.split(":")[1])
        self.requests = 0

    def url(self, path: str) -> str:
        return self._local.url(path)

    def put_bytes(self, path: str, data: bytes) -> None:
        self._local.put_bytes(path, data)

    token = staticmethod(Federation.token)

    def set_latency(self, seconds: float) -> None:
        self._conn.send(("latency", seconds))
        self._conn.recv()

    def count_requests(self) -> int:
        self._conn.send(("count", None))
        return int(self._conn.recv())

    def stop(self) -> None:
        self._conn.send(("stop", None))
        self._proc.join(10)


def _serve(root: str, latency_s: float, conn) -> None:
    fed = Federation(Path(root), latency_s=latency_s).start()
    conn.send((fed.host, fed.ca_file, str(fed.storage)))
    while True:
        what, arg = conn.recv()
        if what == "latency":
            fed.latency_s = arg
            conn.send(True)
        elif what == "count":
            n = len(fed.log)
            fed.log.clear()
            conn.send(n)
        else:
            fed.stop()
            return


def make_files(fed: RemoteFederation, n: int, events: int, scratch: Path) -> list[str]:
    """n small synthetic Parquet files in 1000-file range folders on the origin."""
    try:
        from muongen.data.synth import write_synthetic
    except ImportError:  # data area not built: plain bytes still time the transfers
        write_synthetic = None
    urls = []
    if write_synthetic is not None:
        local = write_synthetic(scratch / "synth", files=n, events_per_file=events, ranges=True)
        for p in local:
            rel = Path(p).relative_to(scratch / "synth").as_posix()
            fed.put_bytes(f"/icecube/bench/{rel}", Path(p).read_bytes())
    else:
        for k in range(n):
            first = k // 1000 * 1000
            folder = f"/icecube/bench/{first:07d}-{first + 999:07d}"
            fed.put_bytes(f"{folder}/{k:07d}.parquet", os.urandom(20_000))
    urls = files.expand_inputs(fed.url("/icecube/bench/*-*/*.parquet"))
    assert len(urls) == n, (len(urls), n)
    return urls


def read_raw(urls: list[str], pf: Prefetcher | None) -> int:
    total = 0
    if pf:
        pf.schedule(urls)
    for url in urls:
        local = pf.local_path(url) if pf else None
        with open(local, "rb") if local else files.open_input(url) as f:
            total += len(f.read())
        if pf:
            pf.release(url)
    return total


def read_decoded(urls: list[str], pf: Prefetcher | None) -> int:
    from muongen.data.reader import iter_file

    events = 0
    if pf:
        pf.schedule(urls)
    for i, url in enumerate(urls):
        local = pf.local_path(url) if pf else None
        events += sum(b.n_events for b in iter_file(url, i, local_path=local))
        if pf:
            pf.release(url)
    return events


def read_stream(urls: list[str], pf: Prefetcher | None) -> int:
    from muongen.config import DataConfig
    from muongen.data.stream import EventStream

    cfg = DataConfig(batch_events=4096, max_epochs=1, shuffle_buffer_events=0, open_files=4)
    return sum(b.n_events for b in EventStream(urls, cfg, prefetcher=pf))


def timed(
    name: str, fn: Callable, urls: list[str], ahead: int, cache: Path, fed: RemoteFederation
) -> dict:
    out = {}
    for mode in ("none", f"ahead {ahead}"):
        files.clear_caches()  # each run pays federation discovery once, like a fresh job
        fed.count_requests()
        pf = Prefetcher(str(cache / name), ahead=ahead, max_bytes=2**30) if mode != "none" else None
        t0 = time.perf_counter()
        try:
            amount = fn(urls, pf)
        finally:
            if pf:
                pf.close()
        dt = time.perf_counter() - t0
        out[mode] = (dt, amount, fed.count_requests())
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--events-per-file", type=int, default=200)
    ap.add_argument("--latency-ms", type=float, default=50.0)
    ap.add_argument("--ahead", type=int, default=8)
    ap.add_argument("--only", choices=("raw", "reader", "stream"), action="append")
    args = ap.parse_args(argv)
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass
    with tempfile.TemporaryDirectory(prefix="bench-prefetch-") as tmp:
        scratch = Path(tmp)
        os.environ["XDG_RUNTIME_DIR"] = str(scratch)  # keep the user's tokens out of it
        fed = RemoteFederation(scratch / "fed", 0.0)
        try:
            os.environ["SSL_CERT_FILE"] = fed.ca_file
            os.environ["BEARER_TOKEN"] = fed.token("storage.read:/icecube")
            urls = make_files(fed, args.files, args.events_per_file, scratch)
            size = sum(files.size(u) for u in urls[:5]) / 5
            fed.set_latency(args.latency_ms / 1000.0)
            print(
                f"{args.files} files of ~{size / 1024:.0f} KiB, {args.latency_ms:.0f} ms added "
                f"per request, prefetch ahead {args.ahead} (workers {min(args.ahead, 8)})"
            )
            head = ("path", "prefetch", "seconds", "files/s", "requests", "speed-up")
            print("{:<8} {:<9} {:>8} {:>8} {:>9} {:>9}".format(*head))
            benches = {"raw": read_raw, "reader": read_decoded, "stream": read_stream}
            for name in args.only or list(benches):
                try:
                    res = timed(name, benches[name], urls, args.ahead, scratch / "cache", fed)
                except ImportError as exc:
                    print(f"{name:<8} skipped ({exc})")
                    continue
                base = res["none"][0]
                for mode, (dt, _amount, nreq) in res.items():
                    print(
                        f"{name:<8} {mode:<9} {dt:8.2f} {args.files / dt:8.1f} {nreq:9d} "
                        f"{base / dt:8.1f}x"
                    )
        finally:
            fed.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
