"""`muongen bench step`: training-step throughput on a synthetic batch (figures, no asserts).

The batch imitates production's multiplicity (``--mix production``: about 10% empty
events, the rest a Pareto tail P(n >= x) = x^-1.3, a few muons per event on average and
hundreds in the largest) or a muon-rich one (``--mix rich``: no empty events, 20x the
muons). Defaults are the production preset (5 critic steps, GP every 2 critic steps with
at most 4096 pairs, lambda 10, Adam; fp32 with TF32 on CUDA). Events/s and muons/s count
the batch's events and muons once per step (one step = n_critic critic updates + one
generator update), as the original trainer's 390k events/s on an A100 did.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

HELP = "training-step throughput (events/s, muons/s) on a production-like synthetic batch"

MAX_MUONS_PER_EVENT = 20000


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default=None,
        help="default: cuda when available, else cpu",
    )
    parser.add_argument("--batch", type=int, default=4096, help="events per batch (4096)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps (10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (3)")
    parser.add_argument(
        "--gp-every", type=int, default=2, help="GP every K critic steps; 0 turns the GP off (2)"
    )
    parser.add_argument("--gp-pairs", type=int, default=4096, help="max GP pairs (4096)")
    parser.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    parser.add_argument("--n-critic", type=int, default=5, help="critic updates per step (5)")
    parser.add_argument(
        "--precision",
        choices=["fp32", "bf16", "fp16"],
        default=None,
        help="autocast on CUDA (default: the production-a100 preset's; fp32 on CPU)",
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile the generator")
    parser.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="record the step as CUDA graphs and replay them (train.cuda_graphs)",
    )
    parser.add_argument(
        "--mix",
        choices=["production", "rich"],
        default="production",
        help="multiplicity mix of the synthetic batch",
    )
    parser.add_argument(
        "--reference-gp",
        action="store_true",
        help="use the per-event reference GP (for the speed-up ratio)",
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="torch CPU threads (0: torch's default)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also profile 3 steps and print the top operators/kernels",
    )
    parser.add_argument(
        "--profile-dir", default="", help="where the profiler trace goes (default: a temp folder)"
    )
    parser.add_argument(
        "--json", action="store_true", help="end with one JSON line of the figures and settings"
    )


def synthetic_batch(n_events: int, mix: str = "production", seed: int = 0):
    """A RaggedBatch in feature units with a production-like (or muon-rich) multiplicity."""
    import torch

    from muongen.data.batch import RaggedBatch

    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(n_events, generator=gen).clamp_min(1e-12)
    tail = u.pow(-1.0 / 1.3)  # Pareto: P(n >= x) = x^-1.3 for x >= 1
    if mix == "production":
        counts = torch.floor(tail)
        counts = torch.where(torch.rand(n_events, generator=gen) < 0.1, 0.0, counts)
    else:
        counts = torch.floor(20.0 * tail)
    counts = counts.clamp(max=MAX_MUONS_PER_EVENT).to(torch.int64)
    n = int(counts.sum())
    r = torch.rand(n_events, 4, generator=gen)
    cond = torch.stack(
        [4 * r[:, 0] - 1, 0.2 + 0.8 * r[:, 1], 1.75 * r[:, 2], 1 + 1.8 * r[:, 3]], -1
    )
    muons = torch.cat(
        [
            -1.0 + 0.5 * torch.randn(n, 1, generator=gen),
            0.2 * torch.randn(n, 2, generator=gen),
        ],
        -1,
    )
    return RaggedBatch(cond, muons, counts)


def run(args: argparse.Namespace) -> int:
    import torch

    from muongen.config import load_config
    from muongen.errors import ConfigError
    from muongen.model import build_models
    from muongen.model.penalty import gradient_penalty, reference_gradient_penalty
    from muongen.train.step import GanStep

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible; use --device cpu")
    if args.steps < 1 or args.batch < 1:
        raise ConfigError("--steps and --batch must be >= 1")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    overrides = [
        f"data.batch_events={args.batch}",
        f"optim.optimizer={args.optimizer}",
        f"optim.n_critic={args.n_critic}",
        f"optim.gp_max_pairs={args.gp_pairs}",
        f"train.device={device}",
        f"train.compile={str(args.compile).lower()}",
    ]
    if args.cuda_graphs:
        overrides.append("train.cuda_graphs=true")
    if args.precision:
        overrides.append(f"train.precision={args.precision}")
    if args.gp_every > 0:
        overrides.append(f"optim.gp_every={args.gp_every}")
    else:
        overrides.append("optim.gp_lambda=0")
    cfg = load_config("production-a100", overrides)
    precision = cfg.train.precision if device == "cuda" else "fp32"  # no autocast on the CPU

    torch.manual_seed(0)
    generator, critic = build_models(cfg.model)
    generator.to(device)
    critic.to(device)
    penalty = reference_gradient_penalty if args.reference_gp else gradient_penalty
    step = GanStep(generator, critic, cfg.optim, cfg.train, device, penalty_fn=penalty)
    batch = synthetic_batch(args.batch, args.mix)
    micro = [m.to(device) for m in batch.split_by_muons(cfg.data.max_muons_per_batch)]

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    warmup = args.warmup
    if step.graphs is not None:  # each penalty pattern's warm-ups and recording, untimed
        from muongen.train.graphs import WARMUP_STEPS

        warmup = max(warmup, 2 * (WARMUP_STEPS + 1))
    for _ in range(warmup):
        step(micro)
    sync()
    times = []  # per step, synchronised: shared machines are noisy, the median tells
    for _ in range(args.steps):
        t0 = time.perf_counter()
        out = step(micro)
        sync()
        times.append(time.perf_counter() - t0)
    dt = sum(times)
    median = sorted(times)[len(times) // 2]

    counts = batch.counts.float()
    settings = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "threads": torch.get_num_threads(),
        "shards": step.shards,
        "batch": args.batch,
        "muons": batch.n_muons,
        "mean_muons_per_event": round(float(counts.mean()), 3),
        "empty_fraction": round(float((counts == 0).float().mean()), 3),
        "max_muons_per_event": int(counts.max()),
        "microbatches": len(micro),
        "mix": args.mix,
        "steps": args.steps,
        "warmup": args.warmup,
        "n_critic": cfg.optim.n_critic,
        "gp_every": args.gp_every,
        "gp_pairs": cfg.optim.gp_max_pairs,
        "gp_lambda": cfg.optim.gp_lambda,
        "optimizer": cfg.optim.optimizer,
        "precision": precision if device == "cuda" else "fp32",
        "compile": args.compile,
        "cuda_graphs": step.graphs is not None,
        "graph_replays": step.graphs.replays if step.graphs is not None else 0,
        "reference_gp": args.reference_gp,
    }
    figures = {
        "events_per_s": args.steps * args.batch / dt,
        "muons_per_s": args.steps * batch.n_muons / dt,
        "ms_per_step": 1000.0 * dt / args.steps,
        "events_per_s_median": args.batch / median,
        "muons_per_s_median": batch.n_muons / median,
        "ms_per_step_median": 1000.0 * median,
        "max_memory_gib": (
            round(torch.cuda.max_memory_reserved() / 2**30, 2) if device == "cuda" else None
        ),
        "c_loss": float(out["c_loss"]),
        "skipped": int(out["skipped"]),
    }
    if args.gp_every > 0:
        kind = ", per-event reference" if args.reference_gp else ""
        gp = f"every {args.gp_every} ({cfg.optim.gp_max_pairs} pairs{kind})"
    else:
        gp = "off"
    print(
        f"bench step on {settings['device']} ({settings['threads']} threads, "
        f"{settings['shards']} shard(s)): batch "
        f"{args.batch} events / {batch.n_muons} muons ({settings['mean_muons_per_event']} per "
        f"event, {settings['empty_fraction']:.0%} empty, max {settings['max_muons_per_event']}),"
        f" n_critic {cfg.optim.n_critic}, GP {gp}, {cfg.optim.optimizer}, {settings['precision']}"
        + (", CUDA graphs" if step.graphs is not None else "")
    )
    print(
        f"  {figures['events_per_s']:,.0f} events/s  {figures['muons_per_s']:,.0f} muons/s  "
        f"{figures['ms_per_step']:.1f} ms/step (median step: "
        f"{figures['events_per_s_median']:,.0f} events/s, {figures['ms_per_step_median']:.1f} ms)"
    )
    if args.profile:
        from muongen.monitor.profiler import profile

        out_dir = args.profile_dir or tempfile.mkdtemp(prefix="muongen-bench-profile-")
        profile(lambda: step(micro), 3, out_dir, device)
    if args.json:
        print(json.dumps({**figures, **settings}))
    return 0
