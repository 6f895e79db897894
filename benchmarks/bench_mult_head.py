"""How well the multiplicity head alone learns the counts, without training the GAN.

    python benchmarks/bench_mult_head.py --train quality-wide --held-out h-prod h-rich
        [--config quality] [--set model.mult_exact=2 ...] [--steps 11000] [--seed 0]

The head learns only from its own loss (the generator's update adds it to the WGAN term,
and the rest of the generator is fed the real counts), so training it alone with the
preset's optimizer, batch, learning-rate schedule and weight average gives the head a
full run would give, in minutes (checked: the quality preset's head alone and in a full
run put 0.919 and 0.916 of the single-muon share of held-out production showers).
Printed for each held-out set: P(N <= k | N >= 1) of the data and the head's ratio to it
(k = 1, 2, 3, 5, 9, 99: where the low counts' mass goes) and P(N = 0) of both, from the
head's exact probabilities and its quantile function on a fine grid of levels (no draw
noise), and by cos(zenith) the events with muons of the data against the sum of the
head's P(N >= 1) (near the horizon P(N >= 1) falls steeply with the slant depth; compare
--set model.slant_depth=true). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time

import numpy as np
import torch

from muongen import schema
from muongen.config import load_config
from muongen.evaluate.sample import read_inputs
from muongen.model import build_models
from muongen.model.ema import GeneratorEMA
from muongen.model.multiplicity import interpolate_quantiles
from muongen.train.step import lr_factor, make_optimizer

#: P(N <= k | N >= 1) is printed at these k
KS = (1, 2, 3, 5, 9, 99)
#: the events with muons are compared in these bins of cos(zenith)
COS_ZENITH_EDGES = (0.0, 0.17, 0.23, 0.31, 0.54, 1.0)


def train_head(cfg, train, steps: int, seed: int) -> torch.nn.Module:
    """The generator (its head trained alone, as in the generator update) and its average."""
    torch.manual_seed(seed)
    generator, _ = build_models(cfg.model)
    generator.cond_norm.fit(schema.condition_features(train.conditions))
    head = generator.multiplicity
    opt = make_optimizer(head.parameters(), cfg.optim, cfg.optim.lr_generator, torch.device("cpu"))
    decay = cfg.optim.decay_steps or steps
    ema = GeneratorEMA(generator, cfg.optim.ema_decay) if cfg.optim.ema_decay > 0 else None
    rng = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        cond = generator.cond_norm(schema.condition_features(train.conditions))
    counts = train.counts
    batch = cfg.data.batch_events
    t0 = time.perf_counter()
    for step in range(steps):
        factor = lr_factor(
            step,
            schedule=cfg.optim.schedule,
            warmup_steps=cfg.optim.warmup_steps,
            decay_steps=decay,
            min_lr_ratio=cfg.optim.min_lr_ratio,
        )
        for group in opt.param_groups:
            group["lr"] = cfg.optim.lr_generator * factor
        pick = torch.randint(0, len(counts), (batch,), generator=rng)
        loss = cfg.optim.mult_weight * head.loss(cond[pick], counts[pick], generator=rng)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if ema is not None:
            ema.update()
        if (step + 1) % max(steps // 5, 1) == 0:
            seconds = time.perf_counter() - t0
            print(f"  step {step + 1}/{steps}: loss {loss.detach().item():.4f} ({seconds:.0f} s)")
    return ema.module if ema is not None else generator


@torch.no_grad()
def low_counts(
    generator, conditions: torch.Tensor, levels: int = 400
) -> tuple[np.ndarray, list[float]]:
    """Each event's P(N >= 1) and P(N <= k | N >= 1) for k in KS over the events'
    conditions: each event's share of k or fewer muons weighted by its P(N >= 1), in
    blocks of events (the quantile function on ``levels`` levels of every event at once
    would not fit)."""
    head = generator.multiplicity
    c_all = generator.cond_norm(schema.condition_features(conditions))
    tau = (torch.arange(levels, dtype=torch.float64) + 0.5) / levels
    some_all, below_sum = [], np.zeros(len(KS))
    for start in range(0, len(c_all), 2000):
        c = c_all[start : start + 2000]
        b = len(c)
        logit, knots = head.params(c)
        p0 = torch.sigmoid(logit.double())
        if head.exact is not None:
            h = torch.sigmoid(head.exact(c).double())  # (B, M): P(N = m | N >= m)
            left = torch.cumprod(1.0 - h, dim=1)  # P(N > m | N >= 1)
            exact = torch.cat([torch.zeros(b, 1, dtype=torch.float64), 1.0 - left], dim=1)
            above = left[:, -1]
        else:
            exact = torch.zeros(b, 1, dtype=torch.float64)
            above = torch.ones(b, dtype=torch.float64)
        q = interpolate_quantiles(
            knots.double().repeat_interleave(levels, dim=0), head.levels.double(), tau.repeat(b)
        )
        q = q.reshape(b, levels).clamp(min=head.lowest)
        some = 1.0 - p0
        for i, k in enumerate(KS):
            below = exact[:, min(k, head.n_exact)]
            below = below + above * (q < math.log10(k + 1.5)).double().mean(1)
            below_sum[i] += float((below * some).sum())
        some_all.append(some.numpy())
    some_all = np.concatenate(some_all)
    return some_all, list(below_sum / some_all.sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--train", nargs="+", required=True, help="training files, folders, globs")
    ap.add_argument("--held-out", nargs="+", required=True, help="held-out folders (one per set)")
    ap.add_argument("--config", default="quality", help="preset or YAML (default quality)")
    ap.add_argument("--set", action="append", default=[], help="config override key=value")
    ap.add_argument("--steps", type=int, default=0, help="generator steps (default: the config's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--events", type=int, default=200000, help="held-out events per set")
    a = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(a.config, a.set)
    steps = a.steps or cfg.train.max_steps
    train = read_inputs(a.train)
    print(
        f"head: {cfg.model.multiplicity}, {cfg.model.mult_knots} knots, exact counts "
        f"{cfg.model.mult_exact}; {steps} steps x {cfg.data.batch_events} events of "
        f"{train.n_events:,} training events"
    )
    generator = train_head(cfg, train, steps, a.seed)
    for path in a.held_out:
        held = read_inputs([path], max_events=a.events)
        n = held.counts
        some = n[n > 0]
        data = [float((some <= k).double().mean()) for k in KS]
        some, model = low_counts(generator, held.conditions)
        ratio = np.array(model) / np.array(data)
        print(
            f"{path}: P(N = 0) data {float((n == 0).double().mean()):.4f} head "
            f"{1 - some.mean():.4f}; P(N <= k | N >= 1) for k = {', '.join(map(str, KS))}: "
            f"data {np.round(data, 4)}, head / data {np.round(ratio, 4)}"
        )
        cos_z = np.cos(held.conditions[:, 1].numpy())
        with_muons = (n > 0).numpy()
        cells = []
        for lo, hi in itertools.pairwise(COS_ZENITH_EDGES):
            sel = (cos_z >= lo) & (cos_z < hi)
            cells.append(f"{lo:.2f}-{hi:.2f}: {with_muons[sel].sum()} vs {some[sel].sum():.1f}")
        print(f"  events with muons by cos zenith, data vs head: {'; '.join(cells)}")


if __name__ == "__main__":
    main()
