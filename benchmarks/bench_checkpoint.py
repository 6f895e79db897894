"""Checkpoint save / verify / load time and size for a model config (default: production).

    python benchmarks/bench_checkpoint.py [--config production-a100] [--repeat 5]

Builds the models and a GanStep whose Adam moments are populated by one real step, then
times ``checkpoint.save`` (serialise + sha256 + atomic write of .pt and manifest),
``checkpoint.verify`` (re-hash) and ``checkpoint.load`` (verify + torch.load). Prints
figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

from muongen import checkpoint as ckpt
from muongen.config import load_config
from muongen.data.batch import RaggedBatch
from muongen.model import build_models
from muongen.train.step import GanStep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="production-a100")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(args.config, ["train.device=cpu", "train.precision=fp32"])
    g, c = build_models(cfg.model)
    step = GanStep(g, c, cfg.optim, cfg.train, torch.device("cpu"))
    counts = torch.randint(0, 5, (256,))
    n_feat = g.n_features
    batch = RaggedBatch(torch.randn(256, 4), torch.randn(int(counts.sum()), n_feat), counts)
    step([batch])  # populate optimizer state
    state = {
        "generator": g.state_dict(),
        "critic": c.state_dict(),
        "optim": step.state_dict(),
        "config": cfg.to_dict(),
    }
    n_params = sum(p.numel() for p in g.parameters()) + sum(p.numel() for p in c.parameters())
    save_s, verify_s, load_s = [], [], []
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.repeat):
            t0 = time.perf_counter()
            saved = ckpt.save(state, d, f"b{i}", step=i)
            save_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ckpt.verify(saved.manifest)
            verify_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ckpt.load(saved.manifest)
            load_s.append(time.perf_counter() - t0)
    out = {
        "config": args.config,
        "parameters": n_params,
        "size_bytes": saved.size,
        "save_ms": round(1e3 * statistics.median(save_s), 2),
        "verify_ms": round(1e3 * statistics.median(verify_s), 2),
        "load_ms": round(1e3 * statistics.median(load_s), 2),
    }
    print(
        f"{args.config}: {n_params:,} parameters, checkpoint {saved.size / 1e6:.2f} MB; "
        f"save {out['save_ms']} ms, verify {out['verify_ms']} ms, load {out['load_ms']} ms "
        f"(median of {args.repeat})"
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
