"""Exported generators: file sizes, load times, and bundles/s against `muongen sample`.

    python benchmarks/bench_export.py CHECKPOINT [--events 20000] [--batch 4096]
                                      [--repeat 3] [--threads 1] [--noise-per-event 64]

Exports CHECKPOINT as TorchScript and ONNX (``muongen export``), times loading each file
(``torch.jit.load``, ``onnxruntime.InferenceSession``), then generates bundles for the
same primaries (log-uniform 1e5-1e8 GeV, zenith 0-60 deg, A in 1/4/14/56, depth
1.5-2.5 km) ``--batch`` events per call with muongen's own sampler (eager PyTorch,
``muongen.evaluate.sample.generate``), the TorchScript file and the ONNX file (noise
drawn outside, as a C++ caller would, included in the time). Prints figures (best of
``--repeat``); asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import torch

from muongen.evaluate.sample import generate
from muongen.export import PhysicalGenerator, export, noise_inputs


def primaries(n: int, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    cond = np.column_stack(
        [
            10 ** rng.uniform(5, 8, n),
            np.radians(rng.uniform(0, 60, n)),
            rng.choice([1.0, 4.0, 14.0, 56.0], n),
            rng.uniform(1500, 2500, n),
        ]
    )
    return torch.as_tensor(cond, dtype=torch.float32)


def best(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def run_exported(
    call, module: PhysicalGenerator, cond: torch.Tensor, batch: int, per_event: int
) -> int:
    """Generate for all ``cond`` ``batch`` at a time; noise for ``per_event`` muons per
    event, with a second call for a batch that needs more (the documented protocol)."""
    g = torch.Generator().manual_seed(0)
    muons = 0
    for start in range(0, len(cond), batch):
        c = cond[start : start + batch]
        event, muon = noise_inputs(module, len(c), per_event * len(c), generator=g)
        counts, out = call(c, event, muon)
        n = int(counts.sum())
        if n > muon.shape[0]:
            _, muon = noise_inputs(module, len(c), n, generator=g)
            counts, out = call(c, event, muon)
        muons += int(out.shape[0])
    return muons


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--noise-per-event", type=int, default=64, help="muon-noise rows drawn per event"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import onnxruntime as ort

    cond = primaries(args.events)
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for fmt, name in (("torchscript", "gen.pt"), ("onnx", "gen.onnx")):
            path = os.path.join(tmp, name)
            t0 = time.perf_counter()
            module = export(args.checkpoint, fmt, path)
            files[fmt] = path
            print(
                f"export {fmt:11s}: {os.path.getsize(path) / 1e6:7.3f} MB, "
                f"written in {time.perf_counter() - t0:.2f} s"
            )
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        opts.inter_op_num_threads = 1
        t_ts, scripted = best(lambda: torch.jit.load(files["torchscript"]), args.repeat)
        t_onnx, session = best(
            lambda: ort.InferenceSession(files["onnx"], opts, providers=["CPUExecutionProvider"]),
            args.repeat,
        )
        print(f"load torchscript (torch.jit.load): {t_ts * 1e3:.1f} ms")
        print(f"load onnx (onnxruntime.InferenceSession): {t_onnx * 1e3:.1f} ms")

        from muongen.inference import load_for_inference

        t_ck, (generator, _) = best(lambda: load_for_inference(args.checkpoint), args.repeat)
        print(f"load checkpoint (muongen load_for_inference): {t_ck * 1e3:.1f} ms")

        def ours():
            return int(generate(generator, cond, batch_events=args.batch, seed=0).n_muons)

        def onnx_call(c, e, m):
            counts, muons = session.run(
                None, {"conditions": c.numpy(), "event_noise": e.numpy(), "muon_noise": m.numpy()}
            )
            return torch.from_numpy(counts), torch.from_numpy(muons)

        with torch.inference_mode():
            runs = {
                "muongen sample (eager)": ours,
                "torchscript": lambda: run_exported(
                    scripted, module, cond, args.batch, args.noise_per_event
                ),
                "onnxruntime": lambda: run_exported(
                    onnx_call, module, cond, args.batch, args.noise_per_event
                ),
            }
            for name, fn in runs.items():
                fn()  # warm-up
                seconds, muons = best(fn, args.repeat)
                print(
                    f"{name:24s}: {args.events / seconds:10,.0f} events/s "
                    f"{muons / seconds:10,.0f} muons/s ({muons:,} muons, {args.threads} thread(s))"
                )


if __name__ == "__main__":
    main()
