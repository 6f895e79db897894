"""`muongen bench step`: training-step throughput on a synthetic batch (figures, no asserts).

The batch imitates production's multiplicity (``--mix production``: about 10% empty
events, the rest a Pareto tail P(n >= x) = x^-1.3, a few muons per event on average and
hundreds in the largest) or a muon-rich one (``--mix rich``: no empty events, 20x the
muons). Defaults are the production preset (5 critic steps, GP every 2 critic steps with
at most 4096 pairs, lambda 10, Adam; fp32 with TF32 on CUDA). Events/s and muons/s count
the batch's events and muons once per step (one step = n_critic critic updates + one
generator update), as the original trainer's 390k events/s on an A100 did.

``--config`` times another preset's step (its batch, critic updates, penalty, model and
CPU shards and threads; ``--set`` changes any of it, as for ``muongen train``), and
``--data`` takes the batch from real files (the same number of events from the start of
each file given, in the preset's feature representation) instead of the synthetic mix:
``muongen bench step --config quality --data quality-wide`` times the quality preset's
step on its own showers, without a training run.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time

log = logging.getLogger(__name__)

HELP = "training-step throughput (events/s, muons/s) on a production-like synthetic batch"

MAX_MUONS_PER_EVENT = 20000

#: the preset timed without --config, and its batch on the bench (its own is 48000)
DEFAULT_CONFIG = "production-a100"
DEFAULT_BATCH = 4096


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default=None,
        help="default: cuda when available, else cpu",
    )
    parser.add_argument(
        "--config",
        default=DEFAULT_CONFIG,
        help=f"the preset (or YAML file) whose step is timed ({DEFAULT_CONFIG})",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change a config value, as for `muongen train` (repeatable)",
    )
    parser.add_argument(
        "--data",
        nargs="+",
        default=None,
        metavar="PATH",
        help="take the batch from these Parquet/HDF5 files, folders or globs (as many events "
        "from the start of each file) instead of the synthetic --mix",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=None,
        help=f"events per batch ({DEFAULT_BATCH} for {DEFAULT_CONFIG}, else the preset's; "
        "with --data, the preset's data.batch_muons applies as in training)",
    )
    parser.add_argument("--steps", type=int, default=10, help="timed steps (10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (3)")
    parser.add_argument(
        "--gp-every",
        type=int,
        default=None,
        help="GP every K critic steps; 0 turns the GP off (the preset's: 2 for production-a100)",
    )
    parser.add_argument("--gp-pairs", type=int, default=None, help="max GP pairs (the preset's)")
    parser.add_argument("--optimizer", choices=["adam", "sgd"], default=None)
    parser.add_argument(
        "--n-critic", type=int, default=None, help="critic updates per step (the preset's)"
    )
    parser.add_argument(
        "--precision",
        choices=["fp32", "bf16", "fp16"],
        default=None,
        help="autocast on CUDA (default: the production-a100 preset's; fp32 on CPU)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the generator and the critic's WGAN terms, also on the CPU "
        "(train.compile=true; production-a100 compiles on CUDA only: --set "
        "train.compile=false times its step uncompiled)",
    )
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
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads (0: the preset's train.cpu_threads, else torch's default)",
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


def _events_for_files(paths: list[str], data_cfg) -> int:
    """The events a training run on ``paths`` would batch (``data.batch_muons``)."""
    from muongen.storage import expand_inputs
    from muongen.train.batch_size import events_for_muons, mean_muons_per_event

    mean, rows = mean_muons_per_event(expand_inputs(paths), data_cfg)
    if not rows:
        return data_cfg.batch_events
    return events_for_muons(data_cfg.batch_events, data_cfg.batch_muons, mean)


def batch_from_files(paths: list[str], n_events: int, representation: str = "xy"):
    """A RaggedBatch in feature units: ``n_events`` valid events of the input files
    ``paths`` names (files, folders, globs, as for ``muongen train``: expand_inputs), the
    same number from the start of each file (a training batch draws from every file of a
    shuffled dataset: the first events of one file can be all of one kind of shower)."""
    from muongen import schema
    from muongen.data.batch import RaggedBatch
    from muongen.data.reader import read_events
    from muongen.errors import ConfigError
    from muongen.storage import expand_inputs

    files = expand_inputs(paths)  # a StorageError names a path that matches nothing
    per_file = -(-n_events // len(files))
    parts, have = [], 0
    for f in files:
        part = read_events(f, max_events=min(per_file, n_events - have))
        parts.append(part)
        have += part.n_events
        if have >= n_events:
            break
    raw = RaggedBatch.concat(parts)
    if raw.n_events < n_events:
        log.warning(
            "--data: %d valid events from %d file(s) (up to %d from each), fewer than the "
            "batch's %d: timing those",
            raw.n_events,
            len(files),
            per_file,
            n_events,
        )
    if raw.n_events == 0:
        raise ConfigError(f"--data {' '.join(paths)}: no valid events in {len(files)} file(s)")
    return RaggedBatch(
        schema.condition_features(raw.conditions),
        schema.muon_features(raw.muons, representation),
        raw.counts,
    )


def _overrides(args: argparse.Namespace, batch_events: int | None, device: str) -> list[str]:
    """The config changes the bench's own flags ask for (none: the preset's values)."""
    out = [f"train.device={device}"]
    if batch_events is not None:
        out.append(f"data.batch_events={batch_events}")
    if args.optimizer:
        out.append(f"optim.optimizer={args.optimizer}")
    if args.n_critic is not None:
        out.append(f"optim.n_critic={args.n_critic}")
    if args.gp_pairs is not None:
        out.append(f"optim.gp_max_pairs={args.gp_pairs}")
    if args.compile:
        out.append("train.compile=true")
    if args.cuda_graphs:
        out.append("train.cuda_graphs=true")
    if args.precision:
        out.append(f"train.precision={args.precision}")
    if args.gp_every is not None:
        out.append(f"optim.gp_every={args.gp_every}" if args.gp_every > 0 else "optim.gp_lambda=0")
    if args.reference_gp:
        # the reference draws its pairs in one piece and reads counts on the host: no
        # shards (whose pairs are drawn ahead for the batch), no CUDA graph
        out += ["train.step_shards=1", "train.cuda_graphs=false"]
    return out


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
    batch_events = args.batch
    if batch_events is None and args.config == DEFAULT_CONFIG:
        batch_events = DEFAULT_BATCH
    if args.steps < 1 or (batch_events is not None and batch_events < 1):
        raise ConfigError("--steps and --batch must be >= 1")
    cfg = load_config(args.config, [*_overrides(args, batch_events, device), *args.set])
    gp_every = cfg.optim.gp_every if cfg.optim.gp_lambda > 0 else 0
    threads = args.threads or (cfg.train.cpu_threads if device == "cpu" else 0)
    if threads > 0:
        torch.set_num_threads(threads)
    precision = cfg.train.precision if device == "cuda" else "fp32"  # no autocast on the CPU

    torch.manual_seed(0)
    generator, critic = build_models(cfg.model)
    generator.to(device)
    critic.to(device)
    penalty = reference_gradient_penalty if args.reference_gp else gradient_penalty
    step = GanStep(generator, critic, cfg.optim, cfg.train, device, penalty_fn=penalty)
    n_events = cfg.data.batch_events
    if args.data and args.batch is None and cfg.data.batch_muons > 0:
        n_events = _events_for_files(args.data, cfg.data)  # as `muongen train` decides
    if args.data:
        batch = batch_from_files(args.data, n_events, cfg.model.representation)
        mix = "files"
    else:
        batch = synthetic_batch(n_events, args.mix)
        mix = args.mix
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
        "config": args.config,
        "batch": batch.n_events,
        "muons": batch.n_muons,
        "mean_muons_per_event": round(float(counts.mean()), 3),
        "empty_fraction": round(float((counts == 0).float().mean()), 3),
        "max_muons_per_event": int(counts.max()),
        "microbatches": len(micro),
        "mix": mix,
        "steps": args.steps,
        "warmup": args.warmup,
        "n_critic": cfg.optim.n_critic,
        "gp_every": gp_every,
        "gp_pairs": cfg.optim.gp_max_pairs,
        "gp_lambda": cfg.optim.gp_lambda,
        "optimizer": cfg.optim.optimizer,
        "precision": precision if device == "cuda" else "fp32",
        # the library of the CPU's products outside autograd (train.cpu_matmul, resolved)
        "cpu_matmul": ("onednn" if step.onednn else "blas") if device == "cpu" else None,
        "compile": step.compiled,
        "cuda_graphs": step.graphs is not None,
        "graph_replays": step.graphs.replays if step.graphs is not None else 0,
        "reference_gp": args.reference_gp,
    }
    figures = {
        "events_per_s": args.steps * batch.n_events / dt,
        "muons_per_s": args.steps * batch.n_muons / dt,
        "ms_per_step": 1000.0 * dt / args.steps,
        "events_per_s_median": batch.n_events / median,
        "muons_per_s_median": batch.n_muons / median,
        "ms_per_step_median": 1000.0 * median,
        "max_memory_gib": (
            round(torch.cuda.max_memory_reserved() / 2**30, 2) if device == "cuda" else None
        ),
        "c_loss": float(out["c_loss"]),
        "skipped": int(out["skipped"]),
    }
    if gp_every > 0:
        kind = ", per-event reference" if args.reference_gp else ""
        gp = f"every {gp_every} ({cfg.optim.gp_max_pairs} pairs{kind})"
    else:
        gp = "off"
    source = f"{len(args.data)} data path(s)" if args.data else f"{mix} mix"
    print(
        f"bench step ({args.config}) on {settings['device']} ({settings['threads']} threads, "
        f"{settings['shards']} shard(s)): batch of the {source}, "
        f"{batch.n_events} events / {batch.n_muons} muons ({settings['mean_muons_per_event']} per "
        f"event, {settings['empty_fraction']:.0%} empty, max {settings['max_muons_per_event']}),"
        f" n_critic {cfg.optim.n_critic}, GP {gp}, {cfg.optim.optimizer}, {settings['precision']}"
        + (f", {settings['cpu_matmul']} products" if settings["cpu_matmul"] else "")
        + (", compiled" if step.compiled else "")
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
