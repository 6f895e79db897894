"""One config tree: nested dataclasses per concern, YAML presets, dotted overrides.

Precedence, lowest first: defaults in code < preset or config file < ``--set key=value``.
Unknown keys and values of the wrong type are errors naming the key. The resolved config
is written to the run folder and into every checkpoint (it never holds a token).
"""

from __future__ import annotations

import dataclasses
import itertools
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from muongen.errors import ConfigError
from submit.constants import EXIT_SELF_CHECKPOINT


@dataclass
class DataConfig:
    paths: list[str] = field(default_factory=list)
    """Input files, directories, globs or URLs (file://, pelican://, osdf:///)."""
    synth_if_missing: bool = False
    """Write synthetic files into paths[0] (a directory) when it has none (the demo)."""
    synth_files: int = 8
    """Number of synthetic files written when synth_if_missing applies."""
    synth_events_per_file: int = 20000
    """Rows per synthetic file when synth_if_missing applies."""
    synth_mix: Literal["production", "rich", "broad", "wide"] = "production"
    """Multiplicity mix of those files (muongen synth --mix): production = ~0.37 muons per
    row, 96% empty; rich = primaries >= 1e5 GeV, ~13 muons per row, 35% empty; broad =
    showers from rich (2/3) and production (1/3), ~8 muons per row, 57% empty; wide =
    rich (1/4) and production (3/4), ~3.4 muons per row, 82% empty."""
    batch_events: int = 4096
    """Events per training batch (see batch_muons)."""
    batch_muons: int = 0
    """Muons a batch should hold at most: a fresh run halves batch_events (at most twice)
    while batch_events x the mean muons per row of its input files exceeds this, and its
    checkpoints keep the decision (muongen/train/batch_size.py). 0: batch_events as it is."""
    max_muons_per_batch: int = 262144
    """Upper bound of sum(counts) per microbatch (bounds GPU memory); events never split."""
    max_muons_per_event: int = 20000
    """Events with more muons go to the outlier dataset instead of training (0: no limit)."""
    keep_empty: bool = True
    """Keep events without muons (they teach the multiplicity head about zero)."""
    shuffle_files: bool = True
    """Shuffle the file order each epoch (seeded)."""
    shuffle_buffer_events: int = 100000
    """Events held in the shuffle buffer that mixes rows of several open files (0: off)."""
    open_files: int = 4
    """Files read at once into the shuffle buffer."""
    read_rows: int = 65536
    """Rows per Arrow record batch read from Parquet."""
    num_workers: int = 0
    """DataLoader worker processes per rank (0: read in the training process)."""
    max_epochs: int = 0
    """Passes over the files (0: no limit, run until train.max_steps)."""
    strict: bool = False
    """Fail the run on the first bad input file instead of skipping and reporting it."""
    outlier_dir: str = ""
    """Where outlier events are written (default: <run dir>/outliers)."""
    outlier_shard_events: int = 10000
    """Events per outlier Parquet shard."""
    val_paths: list[str] = field(default_factory=list)
    """Held-out files evaluated every logging.val_every steps (empty: no validation)."""


@dataclass
class ModelConfig:
    representation: Literal["xy", "radial"] = "xy"
    """Muon features: xy = [log E, x, y]; radial = [log E, r] with azimuth drawn uniformly."""
    z_global: int = 32
    """Size of the per-event noise vector."""
    z_local: int = 16
    """Size of the per-muon noise vector."""
    context: int = 128
    """Width of the generator's event context. 128 (256 until 2026-11): at the quality
    preset as faithful on two training seeds x three held-out sets, and a ~5% faster
    rich-mix step on the CPU (docs/fidelity.md). A checkpoint keeps its own width."""
    global_hidden: list[int] = field(default_factory=lambda: [256])
    """Hidden widths of the generator's global network before its context layer
    ([z_global + 5 -> global_hidden... -> context]; the original's is [128])."""
    mult_hidden: list[int] = field(default_factory=lambda: [64, 128, 64])
    """Hidden widths of the multiplicity head's MLPs (see model.multiplicity)."""
    local_hidden: list[int] = field(default_factory=lambda: [128, 64])
    """Hidden widths of the generator's per-muon network."""
    critic_muon_hidden: list[int] = field(default_factory=lambda: [64, 128])
    """Pointnet critic: hidden widths of its per-muon network."""
    critic_head_hidden: list[int] = field(default_factory=lambda: [128, 64])
    """Pointnet critic: hidden widths of its event-level head."""
    pooling: Literal["amax", "mean"] = "amax"
    """How the pointnet critic pools muons per event."""
    critic: Literal["pointnet", "epic"] = "epic"
    """The critic": epic (default) = EPiC-style, muons and their event exchange information
    in residual layers, so it judges the distribution inside a bundle; pointnet = the
    original's (per-muon MLP, one pooling, event head). Measured (docs/fidelity.md, "The critic"):
    the quality preset at 5500 steps on two seeds, median ratio to the floor 2.03-2.29
    and worst 9.9-14.7 with epic (1 layer) against 2.10-2.45 and 11.7-26.5 with pointnet."""
    critic_local_width: int = 32
    """EPiC critic: width of each muon's vector."""
    critic_global_width: int = 64
    """EPiC critic: width of each event's vector (128 measured no better, and slower; 32
    gives a 1.1-1.2x faster step but a worse pooled muon radius: docs/fidelity.md)."""
    critic_layers: int = 1
    """EPiC critic: muon <-> event exchange layers (2 measured no better, and slower)."""
    critic_attention_heads: int = 0
    """EPiC critic: heads of an attention pool beside the mean and the max in each exchange
    layer (0, the default: none; :mod:`muongen.model.attention_pool`). Each muon gets a
    weight per head from its own vector and its event's (a softmax within the event), and
    each head pools its share of the ``critic_local_width`` channels with them, so the
    critic can pick out the few muons that matter, such as the most energetic ones of a
    rich bundle, which the mean dilutes by 1/N. Must divide ``critic_local_width``. Zero at
    the start and made without random draws (a seeded run keeps the other weights of the
    run without it). Off by default, and not in a preset: on the 17-a-row physics (4 heads,
    2 seeds x 2 held-out sets, paired controls) it made the worst ratio worse on all 4
    pairs, and it costs 18% of the step (docs/fidelity.md, "Attention pooling in the
    critic")."""
    muon_critic: list[int] = field(default_factory=list)
    """Hidden widths of a per-muon critic beside the set critic (empty, the default: none;
    :mod:`muongen.model.muon_critic`). It scores each muon alone, s(muon, condition,
    log(1 + N)), and its WGAN term (weight ``optim.muon_critic_weight``) compares the
    pooled real and fake muons of a batch with every muon counting alike, where the set
    critic's events weigh a muon of an N-muon bundle ~1/N: the pooled per-muon spectra of
    the richest, most energetic bundles. Its gradient penalty is per muon. Needs
    train.fake_counts = real. The quality preset uses [32, 32] (issue 52's rich physics, 2
    seeds x 2 held-out sets, with ``local_exp_noise: 4``: pooled muon log10 E 1.73-1.84x the
    floor against 1.94-2.72 without either; ~22% more time a rich step; docs/fidelity.md,
    "The per-muon critic and the exponential noise")."""
    critic_log_radius: bool = False
    """xy representation: the critic also sees each muon's log distance to the axis,
    0.5 log(x^2 + y^2 + 0.03^2) in standardised units, as a fourth input, and the gradient
    penalty holds it to the same unit slope as the others (it interpolates in that
    space): a critic Lipschitz in x and y alone can tell little about the radii of the
    muons closest to the axis, which log-radius metrics weigh as much as the far ones.
    The presets turn it on (quality preset, 2 seeds x 2 rich held-out sets: worst ratio to
    the floor 1.8-3.6 against 3.6-5.0 without it; docs/fidelity.md); off by default so
    that checkpoints written before it keep their critic's shape."""
    critic_log_radius_floor: float = 0.03
    """The floor under the critic's log radius, in standardised x and y units (0.03 is
    ~0.2 m at the demo physics' spread of ~7 m): nearer the axis the log radius flattens.
    0.01 made the quality preset's medians worse and its worst no better (2 seeds;
    docs/fidelity.md)."""
    slant_depth: bool = False
    """Both models also see the slant depth, depth / cos(zenith) in km (cos clamped at
    SLANT_MIN_COS), as a fifth condition feature: the muons' energy threshold grows
    exponentially with it, so the log of the count falls about linearly in it, which the
    four features (log E, cos zenith, log A, depth) give an MLP only as a product of two
    inputs and a steep curve near the horizon. Off by default so that checkpoints
    written before it keep their shapes (docs/fidelity.md, "The slant depth")."""
    max_generated_muons: int = 20000
    """Cap on the muons the generator makes for one event (protects memory; 0: no cap)."""
    multiplicity: Literal["lognormal", "hurdle", "round"] = "hurdle"
    """Counts from the head: lognormal = draw log10(N + 1) ~ Normal(mean, std) per event
    and round (mean and std trained by Gaussian NLL); hurdle = P(N = 0) (trained by BCE)
    and a quantile function of log10(N + 1) above it (mult_knots knots, pinball loss);
    round = round the mean (the original)."""
    mult_knots: int = 16
    """hurdle: knots of the quantile function of log10(N + 1) given N >= 1."""
    mult_exact: int = 0
    """hurdle: the counts 1..mult_exact get probabilities of their own, P(N = m | N >= m)
    from an MLP (binary cross-entropy each), and the knots fit only N > mult_exact. The
    knots alone put ~8-10% of the single-muon events of production showers at two or more
    muons; 2 takes that away (not in the quality preset yet: docs/fidelity.md, "The exact small
    counts")."""
    mult_knot_z: float = 2.5
    """hurdle: the knots sit at the levels Phi(z), z evenly spaced in [-mult_knot_z,
    mult_knot_z]; beyond them the quantile function continues with exponential tails."""
    mult_trunk: Literal["separate", "shared"] = "separate"
    """hurdle: its outputs (P(N = 0), the exact counts' probabilities, the knots) each
    from an MLP of its own (separate), or all from one MLP of widths mult_hidden with one
    output layer (shared: the original trainer's single multiplicity MLP; half the head's
    cost, which is computed on every event of a batch: 5-7% off the production-mix step on
    the CPU, ~2% off the rich one). Not in the presets: the quality preset's medians were
    unchanged on 3 seeds but its worst ratios came out 1.52-2.11 against 1.52-1.73
    (docs/speed.md, "The multiplicity head's trunk")."""
    lateral_transform: Literal["linear", "asinh"] = "linear"
    """xy representation: the models see x and y standardised linearly, or as
    asinh(x / s) with s the fitted median |x| (linear core, logarithmic heavy tails)."""
    lateral_centred: bool = True
    """xy representation: fix the standardiser's x and y mean at 0 (the azimuth is uniform)
    instead of fitting it, so the generator has no location to wander to."""
    lateral_rotate: bool = True
    """xy representation: turn each generated bundle by a uniform random azimuth, so the
    generated bundles are exactly invariant under azimuthal rotation, as the physics is
    (x and y have mean 0 and one marginal by construction, not by training)."""
    lateral_head: Literal["xy", "polar"] = "xy"
    """xy representation: what the generator's per-muon net outputs for a muon's place.
    ``xy``: x and y (standardised), the bundle then turned (``lateral_rotate``). ``polar``:
    the log of the distance to the axis (standardised by its own fitted mean and spread),
    turned by a uniform azimuth drawn for each muon, x = r sin(phi), y = r cos(phi): the
    lateral profile is learnt in log r, where radii from 0.2 to 35 m (1% to 99% of the
    synthetic muons) are a few standard deviations apart (in x and y the inner 16% lie
    within 0.2 standard deviations of the axis), and each muon's azimuth is uniform and
    independent of the others', as in a shower whose muons come from independent meson
    decays (a correlation of the azimuths within a bundle cannot be learnt). The critic and
    the data are unchanged (xy). The quality preset turns it on: worst ratio to the floor
    1.47-1.96 against 1.54-3.23 with ``xy`` (the rich-only preset of 2026-11-25, 4 seeds x
    2 rich held-out sets; docs/fidelity.md, "The polar head"); ``xy`` by default so that older
    checkpoints keep their shape."""
    local_exp_noise: int = 0
    """How many of each muon's z_local noise inputs are exponential, Exp(1) - 1, instead of
    N(0, 1): each is drawn N(0, 1) and mapped by e = -log(Phi(-z)) (z clamped at 5), so
    the noise inputs, their order and an export's muon noise stay N(0, 1). A muon's energy
    within a bundle falls as a power law, an exponential in log E: a linear map of an
    exponential input makes that tail, where Gaussian inputs give a tail that falls as
    exp(-x^2) unless the network bends them. 0 (default): all N(0, 1). The quality preset
    uses 4, with ``muon_critic`` (docs/fidelity.md, "The per-muon critic and the exponential
    noise")."""
    energy_reference: Literal["none", "per_nucleon"] = "none"
    """Where the generator's muon energies are measured from. ``none``: log10(E / 1e6 GeV)
    itself, standardised over all muons. ``per_nucleon``: log10(E / (E0 / A)), the muon's
    energy over the primary's energy per nucleon, standardised over all muons, the
    per-nucleon energy then added back: a muon of a nucleus of mass A and energy E0 comes
    from a nucleon of energy E0 / A (the superposition model), so the top of every bundle's
    spectrum sits near 0 on this scale whatever the condition, and the generator does not
    have to move it across six decades of E0 / A. The critic then also sees each muon's
    energy on this scale, as one more input. No energy is bounded here: a muon above
    E0 / A can still be drawn (``energy_fold`` bounds it). Off by default so that older
    checkpoints keep their shape."""
    energy_fold: bool = False
    """Fold every generated muon energy into the range the simulation allows: one above
    the primary's energy per nucleon E0 / A is reflected below it, then one below the least
    muon energy of the events the normalisers are fitted on (the data's threshold, kept in
    the checkpoint) is reflected above it, both in log10 E (and again, should one overshoot
    the other edge too: :func:`muongen.model.generator.fold_energy`). A generator smooths the sharp
    edges of a spectrum: without the fold it draws a few muons beyond them (~0.04% under
    the threshold, ~0.002% over E0 / A on the 17-a-row physics) and too few just inside;
    the fold puts that mass back inside. Off by default so that older checkpoints keep their
    shape; the ``quality`` preset sets it (docs/fidelity.md, "The energy's edges")."""
    energy_scale_head: bool = False
    """A head for each bundle's energy scale: a linear map of the event's context to a shift
    a and a log width b, and every muon's standardised energy output e of that event
    becomes a + exp(b) e (b clamped to [-4, 2]). The local net adds its context and noise
    inputs in its first layer, so a bundle-wide spread of the muon energies, which
    multiplies the noise's effect, it can make only through its bends; the head makes it
    one product. Zero at the start (the map is the identity), made without random draws (a
    seeded run keeps the other weights of the run without it). Off by default, and not in
    a preset: on the 17-a-row physics (2 seeds x 2 held-out sets, paired controls) it made the
    worst ratio worse on 3 of 4 pairs and the pooled muon energy on all 4 (docs/fidelity.md,
    "A head for the bundle's energy scale")."""


@dataclass
class OptimConfig:
    optimizer: Literal["adam", "sgd"] = "adam"
    """Adam with betas (beta1, beta2) or SGD with momentum."""
    lr_generator: float = 1e-4
    """Generator learning rate (peak, after warm-up)."""
    lr_critic: float = 1e-4
    """Critic learning rate (peak, after warm-up)."""
    betas: list[float] = field(default_factory=lambda: [0.0, 0.9])
    """Adam betas."""
    momentum: float = 0.9
    """SGD momentum."""
    weight_decay: float = 0.0
    """Decoupled weight decay."""
    schedule: Literal["constant", "cosine"] = "constant"
    """Learning-rate schedule, a pure function of the step."""
    warmup_steps: int = 0
    """Linear warm-up steps."""
    min_lr_ratio: float = 0.1
    """Final / peak learning rate for the cosine schedule."""
    decay_steps: int = 0
    """Generator steps over which the cosine schedule decays (0: train.max_steps)."""
    grad_clip: float = 0.0
    """Clip gradient norms to this value (0: off)."""
    n_critic: int = 5
    """Critic updates per generator update."""
    gp_lambda: float = 10.0
    """Gradient-penalty weight (0: GP off)."""
    gp_every: int = 2
    """Apply the gradient penalty every N critic steps."""
    gp_max_pairs: int = 4096
    """At most this many (real, fake) muon pairs enter the penalty."""
    gp_fraction: float = 1.0
    """Fraction of events that contribute pairs to the penalty."""
    gp_draw: Literal["muons", "events"] = "muons"
    """How the gp_max_pairs pairs are drawn when there are more: muons (a uniform subset
    of the pairs, the original's) or events (whole events in a random order until the
    cap, the last one cut; each pair is in with the same probability, and the penalty's
    critic scores about a muon-count fewer events: 6-7% off the production preset's rich
    CPU step, the quality preset's fidelity within its seeds' spread; docs/speed.md)."""
    gp_norm: Literal["muon", "event"] = "muon"
    """Gradient norm penalised: per paired muon (the original's) or per event's paired set.
    The quality preset uses event: median ratio to the floor 1.34-1.57 against 1.62-1.79
    with muon (15000 steps, 2 seeds, 2 held-out sets; docs/fidelity.md)."""
    event_weight: Literal["none", "log", "sqrt"] = "none"
    """Weight of each event in the critic's and the generator's WGAN losses: none (every
    event alike, the original's), log = log(1 + N) or sqrt = sqrt(N), normalised to mean 1
    over the batch, so the big bundles (few events, most muons) count more (in the rich
    mix the 1.6% of events with N >= 100 carry 62% of the muons, 8% of the log weight and
    18% of the sqrt weight). The same weight applies to an event's real and fake bundles,
    so the optimum is unchanged; needs train.fake_counts = real. The gradient penalty stays
    unweighted. The quality preset uses log: median ratio to the floor 1.10-1.21, worst
    4.4-7.2 against 1.16-1.34 and 6.0-7.7 with none (15000 steps, 2 seeds, 2 held-out
    sets); sqrt moved the worst bins from big shallow bundles to small deep ones and the
    medians up (1.08-1.17 against 1.05-1.09 with log at 20000 steps; docs/fidelity.md)."""
    energy_balance: float = 0.0
    """Flatten the primary spectrum the losses see (0: off; :mod:`muongen.train.
    energy_balance`): each event's WGAN weight (and its muons' weight in the per-muon
    critic) times (n_max / n_bin) ** energy_balance, at most ``energy_balance_max``, where
    n_bin counts the batch's events with muons in its 0.5-dex bin of log10 E0 and n_max
    those of the fullest bin (1: every bin the same total weight). Real and fake bundles
    take the same weight, so the optimum is unchanged; needs train.fake_counts = real.
    Measured (2 seeds each) on a 17-muons-a-row E^-1.3 physics against 6000 held-out
    showers, with paired runs without it (same seeds, one shard): the 10-99-muon bundles'
    energies at the top primary bin went from 1.48-1.88x the floor to 2.21-2.69x at 0.5,
    and to 1.54-2.30x at 1 (worse on one seed, a little better on the other); at 0.5 on
    the `rich` mix, held-out D's deep band did not move (2.62-2.87 against 2.66-2.78).
    So ``quality`` leaves it off (docs/fidelity.md, "Energy-balanced weights" and
    "Exponent 0.5, a paired control")."""
    energy_balance_max: float = 10.0
    """The largest factor ``energy_balance`` gives an event (>= 1)."""
    muon_critic_weight: float = 1.0
    """Weight of the per-muon critic's WGAN term (``model.muon_critic``) in the critic's
    and the generator's losses, beside the set critic's (weight 1); its gradient penalty
    takes ``gp_lambda`` and ``gp_every`` as the set critic's does. At 3 (no extra time) the
    quality preset met the goal on issue 52's muon-rich physics with every seed tried
    (0-6: worst 1.55-1.96; seed 2 scores 2.48 and 2.44 at 1), but one seed on the preset's
    sparse `wide` blend lost its richest bundles' radii (2.59 and 2.75 against 1.71 and
    1.83), so the preset keeps 1 and sets ``muon_critic_weight_rich`` to 3 (docs/fidelity.md,
    "The shape inside bundles" and "The per-muon weight from the data")."""
    muon_critic_weight_rich: float = 0.0
    """The per-muon critic's weight on muon-rich data (0: off, ``muon_critic_weight``
    everywhere): when a run starts fresh and its input files hold at least
    ``rich_muons_per_row`` muons a row (the rows ``data.batch_muons`` reads), it replaces
    ``muon_critic_weight``; a resumed run and the next node of a chain keep the decision
    saved in the checkpoint (:mod:`muongen.train.muon_weight`)."""
    rich_muons_per_row: float = 16.0
    """The mean muons per row (over the input files' non-empty rows unless
    ``data.keep_empty``) from which ``muon_critic_weight_rich`` applies."""
    muon_gp_rows: int = 4096
    """About this many muons of a batch (drawn uniformly with replacement, an alpha each)
    enter the per-muon critic's gradient penalty."""
    quantile_match: float = 0.0
    """Weight of the generator's quantile-matching term (0: off;
    :mod:`muongen.model.quantile_match`): the scored events cut into
    ``quantile_match_groups`` groups along a random direction of the condition drawn at
    every step, and in each group the sorted fake muons compared with the sorted real ones,
    feature by feature of the critic's inputs (the exact pooled W1 of each group;
    ``quantile_match_weigh`` says how the groups add up). Needs train.fake_counts = real.
    On issue 52's rich physics (2 seeds x 2 held-out sets; weight 1, ``muons``, 4 groups):
    the pooled muon energies 1.45x the floor on average against 1.80 and the 100+-muon
    bundles' worst 1.81 against 2.10, but the 10-99-muon bundles' energies worse and the
    worst ratio 3.05 against 2.73, so ``quality`` leaves it off (docs/fidelity.md,
    "Quantile matching"). Costs 9-15% of a rich CPU step."""
    quantile_match_groups: int = 4
    """Groups of events per step of ``quantile_match`` (about equal numbers of events),
    cut along a random direction of the conditions and log(1 + N)."""
    quantile_match_sizes: bool = False
    """Cut each of ``quantile_match``'s groups again by bundle size (1, 2-9, 10-99, 100+
    muons, the evaluation's classes), so that ranks are matched among bundles of one size
    class only: in a group of mixed sizes a fake muon of a small bundle can take the rank
    of a real muon of a big one and be pulled towards it. Measured (issue 52's rich
    physics, 2 seeds x 2 held-out sets): the 100+-muon bundles' worst 1.59x the floor on
    average (1.81 without), the medians 1.08-1.09, the 10-99-muon energies no better
    (docs/fidelity.md, "Quantile matching")."""
    quantile_match_weigh: Literal["muons", "groups"] = "muons"
    """How ``quantile_match`` weighs its groups: ``muons``: every muon alike (the richest
    bundles dominate, as in the pooled spectra; the better of the two on issue 52's rich
    physics); ``groups``: each group's W1 alike (a group of small bundles counts as much as
    one of big bundles)."""
    mult_weight: float = 1.0
    """Weight of the multiplicity loss in the generator loss (MSE for round, NLL for
    lognormal, BCE plus pinball loss for hurdle)."""
    ema_decay: float = 0.999
    """Decay of the exponential moving average of the generator's weights that sampling,
    evaluation and export use (warmed up as min(decay, (1 + t) / (10 + t)); 0: off)."""


@dataclass
class TrainConfig:
    max_steps: int = 1000
    """Generator steps in this run (0: no limit, stop at the end of the data)."""
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    """Device; auto picks cuda, then mps, then cpu."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Autocast precision on CUDA (fp16 uses a GradScaler). fp32 with ``tf32`` is the
    faster here: this model's products are small, and bf16 autocast adds casts and slower
    bf16 scatter-adds (an H200 step of 48k events: 58 ms fp32, 84-104 ms bf16)."""
    tf32: bool = False
    """Allow TF32 matmuls on Ampere and newer GPUs."""
    compile: bool | Literal["cuda"] = False
    """torch.compile the generator and the critic's WGAN terms (the gradient penalty's
    double backward stays uncompiled): true, false, or ``cuda`` (on a CUDA device only;
    ``production-a100``'s setting: with CUDA graphs an H200 step of 48k events took 23.0
    ms against 33.5, docs/speed.md, "On a GPU", while on a 2-core CPU the compiled step was
    slower than the eager one). Needs a C compiler on the host (and triton on CUDA);
    without one the step runs uncompiled, with a warning, as does code whose compilation
    fails (torch logs the error)."""
    cpu_threads: int = 0
    """Threads of torch's CPU operations when training on the CPU (0: torch's default,
    one per core). The step's operations are small and the data pipeline runs in the same
    process: on a 2-core machine one shard on 2 threads trained the quality preset no
    faster than on 1 thread (2026-11-26); 2 shards of 1 thread each (``step_shards``) took
    13-16% less time a step (docs/speed.md, "Shards on the CPU"). The demo uses 1; the quality
    preset 2, in 2 shards."""
    cpu_keep_memory: bool = True
    """On the CPU, ask glibc's malloc to keep freed memory in the process instead of
    handing it back to the kernel after every step (:mod:`muongen.train.memory`: ~8000
    page faults and ~20 ms of kernel time per step fewer on the shared bench's batch).
    Process-wide, once; nothing off glibc."""
    step_shards: int = 0
    """On the CPU, split each batch into this many shards of events whose forward and
    backward passes run at once, one thread each (torch's threads shared out among them),
    their gradients summed in shard order; each shard draws its noise from its own RNG,
    seeded from the global one every step. Every normaliser (events, event weights, the
    penalty's pairs, drawn once per batch) is the whole batch's, so for the same draws a
    sharded step makes the unsharded step's update. The step's operations are too small
    for torch's intra-op threads (a second thread made it ~8% faster on 2 cores, two
    shards 9-27% on the shared bench's rich batch; docs/speed.md, "Shards on the CPU").
    0: auto, 2 when torch has 2 or more threads on the CPU, else 1 (and 1 off the CPU,
    where the device runs ahead of Python, and with ``compile``)."""
    cpu_matmul: Literal["auto", "onednn", "blas"] = "auto"
    """Which library runs the model's fp32 matrix products outside autograd on the CPU (the
    critic's fake sets, sampling, evaluation; :func:`muongen.model.layers.linear`):
    ``onednn``, or ``blas``, torch's own (MKL in its x86 wheels). ``auto``: oneDNN on AMD
    processors, where MKL runs its AVX2 kernels and oneDNN ran this model's products 2x
    faster (AVX-512 EPYC, 2026-11-28), torch's BLAS elsewhere (on an AVX-512 Xeon, where
    MKL runs its AVX-512 kernels, oneDNN's padded rows made the step 10-12% and sampling
    18-25% slower, 2026-12-01). Under autograd the products are torch's own either way:
    through oneDNN there they cost a Python backward per product, which made the step in 2
    shards 20-30% slower (docs/speed.md, "oneDNN for the products outside autograd").
    Process-wide; ``blas`` where the build has no oneDNN."""
    fake_counts: Literal["real", "predicted"] = "real"
    """Muons per fake event in training: the real event's count, or the head's prediction."""
    cuda_graphs: bool = False
    """On CUDA, record each training step as a CUDA graph and replay it: one launch instead
    of ~2700 kernel launches from Python, which bound the step there. Each microbatch's
    muons are padded up to one of a few sizes (held by extra events, left out of every
    loss) so that batches of the same events and padded size share a graph
    (:mod:`muongen.train.graphs`; with ``compile``, the compiled kernels are recorded).
    Needs ``fake_counts: real``, fp32 or bf16; applies to single-process runs with
    ``optim.optimizer: adam`` (with DDP or SGD the step runs as usual). Faster where the
    host bounds the step (few muons per batch: 6-7x on an H200), no faster where the GPU
    does (docs/speed.md, "On a GPU")."""
    cuda_graphs_max: int = 64
    """At most this many recorded graphs (padded shapes x penalty patterns; none either
    while less than a quarter of the GPU's memory is free); a batch of another shape then
    runs as usual."""
    seed: int = 0
    """Seed of every RNG (per rank: seed + rank)."""
    deterministic: bool = False
    """Use deterministic algorithms (slower; exact resume on GPU)."""
    log_every: int = 50
    """Log metrics every N steps."""
    nonfinite_rollback_after: int = 5
    """Roll back to the last good checkpoint after this many non-finite steps in a row."""
    max_rollbacks: int = 3
    """Stop the run after this many rollbacks."""
    time_budget_s: float = 0.0
    """Checkpoint and exit with budget_exit_code after this many seconds (0: off)."""
    budget_minutes: float = 0.0
    """Wall-clock minutes one run should take, whatever the muons per row (0: off). Early in
    the run the seconds a step takes are measured, and max_steps (never above its value)
    and the cosine schedule's horizon (with optim.decay_steps 0) are set to what fits; every
    1000 steps after that the end is set again from the mean step since (never past
    max_steps), for a machine whose pace changed. The run then ends as usual. The rule and
    its constants: :mod:`muongen.train.budget`."""
    calibrate_rows: int = 0
    """At the end of a run that finished (not one stopped by a signal or
    ``time_budget_s``), map the generator's muon energies onto the training files' with
    this many of their rows (0: no map; their first rows, file after file): the finished
    generator draws bundles for those primaries and, for each of 16 classes of muons (the
    bundle's size in 1, 2-9, 10-99, 100+, times the quartile of the primary's energy), its
    log10 muon energies are matched quantile by quantile onto the training muons'
    (:mod:`muongen.model.calibration`). The map is monotone (each muon keeps its rank
    in its class) and is stored in the final checkpoint only; sampling, evaluation and
    export apply it (``muongen evaluate --uncalibrated``: without it). The `quality`
    preset's 640000 rows took 23-29 s on issue 52's muon-rich data (17 million muons), where
    the pooled muon energies of three seeds went 1.09-1.74x the floor -> 0.91-1.05 at 6000
    held-out showers (docs/fidelity.md, "The muon energies calibrated after training")."""
    calibrate_depth_bins: int = 1
    """With ``calibrate_rows``, also split the energy map's classes by this many quantiles
    of the training rows' depth (1: none; 4: 64 classes)."""
    calibrate_radius: bool = True
    """With ``calibrate_rows``, also map the muons' distances to the bundle's axis, from the
    same draw: for each of 16 classes (the bundle's size, times the quartile of cos zenith)
    the generator's log10 radii are matched quantile by quantile onto the training muons',
    and each muon is moved along its own direction from the axis (its azimuth and its rank
    in its class are the generator's). Stored beside the energy map, under
    ``radius_calibration`` (docs/fidelity.md, "The radii calibrated after training")."""
    budget_exit_code: int = EXIT_SELF_CHECKPOINT
    """Exit code after the time budget (85: HTCondor's 'checkpointed, restart me')."""
    signal_exit_code: int = 0
    """Exit code after a SIGTERM checkpoint (after a Ctrl-C/SIGINT checkpoint: 130)."""


@dataclass
class CheckpointConfig:
    dir: str = ""
    """Checkpoint folder (default: <run dir>/checkpoints)."""
    every_steps: int = 500
    """Checkpoint every N steps (0: off)."""
    every_minutes: float = 15.0
    """Checkpoint every M minutes (0: off)."""
    keep_last: int = 3
    """Keep this many step checkpoints (older ones are removed)."""


@dataclass
class LoggingConfig:
    tensorboard: bool = True
    """Write TensorBoard event files."""
    tb_dir: str = ""
    """TensorBoard folder (default: <run dir>/tb)."""
    progress: Literal["auto", "bar", "plain"] = "auto"
    """A progress bar on a terminal, plain log lines otherwise (auto)."""
    ma_window: int = 500
    """Steps in the moving average of w_gap."""
    hist_every: int = 500
    """Histograms of real vs generated features every N steps (0: off); their noise comes
    from a fork of the RNGs, so they leave the trained model as without them."""
    hist_max_muons: int = 100000
    """At most this many muons per histogram."""
    gpu_monitor: bool = True
    """Sample GPU utilisation and memory with NVML in a thread (silent without a GPU)."""
    val_every: int = 0
    """Evaluate data.val_paths every N steps (0: off)."""
    val_events: int = 20000
    """Held-out events used per validation."""
    audit_events: bool = False
    """Record the key of every event trained on in <run dir>/audit/ (exactly-once audits)."""


@dataclass
class StorageConfig:
    token_file: str = ""
    """Bearer token file for pelican:// and osdf:// (else BEARER_TOKEN[_FILE], _CONDOR_CREDS)."""
    prefetch: int = 0
    """Input files staged ahead by a background thread (0: read directly)."""
    cache_dir: str = ""
    """Local cache for prefetched files (default: a temp folder in the scratch dir)."""
    cache_max_bytes: int = 8 * 1024**3
    """Upper bound of the prefetch cache's size."""
    delete_after_use: bool = True
    """Delete a prefetched file once the stream has read it."""
    retries: int = 5
    """Attempts of a remote read, listing or publish before giving up."""
    retry_wait_s: float = 1.0
    """First back-off between attempts; doubles each retry (plus random jitter)."""
    retry_max_wait_s: float = 30.0
    """Longest back-off between two attempts."""
    timeout_s: float = 60.0
    """Seconds without progress (connect or read) after which a transfer is retried."""
    token_name: str = ""
    """Name of the HTCondor credential to use ($_CONDOR_CREDS/<name>.use; empty: any)."""
    publish_url: str = ""
    """Where final checkpoints are published (immutable names; empty: not published)."""
    tb_sync_url: str = ""
    """Remote folder TensorBoard event files are synced to (empty: no sync)."""
    tb_sync_every_s: float = 300.0
    """Seconds between TensorBoard syncs."""


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)

    def __post_init__(self) -> None:
        validate(self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def validate(cfg: Config) -> None:
    """Cross-field checks; raises ConfigError naming the key."""
    checks = [
        ("data.batch_events", cfg.data.batch_events > 0, "must be > 0"),
        ("data.batch_muons", cfg.data.batch_muons >= 0, "must be >= 0 (0: off)"),
        ("data.max_muons_per_batch", cfg.data.max_muons_per_batch > 0, "must be > 0"),
        ("data.max_muons_per_event", cfg.data.max_muons_per_event >= 0, "must be >= 0"),
        ("data.open_files", cfg.data.open_files >= 1, "must be >= 1"),
        ("optim.n_critic", cfg.optim.n_critic >= 1, "must be >= 1"),
        ("optim.gp_every", cfg.optim.gp_every >= 1, "must be >= 1"),
        ("optim.gp_fraction", 0.0 < cfg.optim.gp_fraction <= 1.0, "must be in (0, 1]"),
        ("optim.gp_max_pairs", cfg.optim.gp_max_pairs >= 0, "must be >= 0 (0: no cap)"),
        ("model.max_generated_muons", cfg.model.max_generated_muons >= 0, "must be >= 0"),
        ("optim.betas", len(cfg.optim.betas) == 2, "must hold two numbers"),
        ("optim.lr_generator", cfg.optim.lr_generator > 0, "must be > 0"),
        ("optim.lr_critic", cfg.optim.lr_critic > 0, "must be > 0"),
        ("train.max_steps", cfg.train.max_steps >= 0, "must be >= 0"),
        ("train.budget_minutes", cfg.train.budget_minutes >= 0, "must be >= 0 (0: off)"),
        ("train.calibrate_rows", cfg.train.calibrate_rows >= 0, "must be >= 0 (0: no maps)"),
        ("train.calibrate_depth_bins", cfg.train.calibrate_depth_bins >= 1, "must be >= 1"),
        ("train.log_every", cfg.train.log_every >= 1, "must be >= 1"),
        ("train.cpu_threads", cfg.train.cpu_threads >= 0, "must be >= 0 (0: torch's default)"),
        ("train.step_shards", cfg.train.step_shards >= 0, "must be >= 0 (0: auto)"),
        ("train.cuda_graphs_max", cfg.train.cuda_graphs_max >= 1, "must be >= 1"),
        ("model.critic_log_radius_floor", cfg.model.critic_log_radius_floor > 0, "must be > 0"),
        (
            "model.critic_attention_heads",
            cfg.model.critic_attention_heads == 0
            or (
                cfg.model.critic_attention_heads > 0
                and cfg.model.critic_local_width % cfg.model.critic_attention_heads == 0
            ),
            "must be 0 (none) or a positive divisor of model.critic_local_width",
        ),
        (
            "model.local_exp_noise",
            0 <= cfg.model.local_exp_noise <= cfg.model.z_local,
            "must be between 0 and model.z_local",
        ),
        ("optim.energy_balance", cfg.optim.energy_balance >= 0, "must be >= 0 (0: off)"),
        ("optim.energy_balance_max", cfg.optim.energy_balance_max >= 1, "must be >= 1"),
        ("optim.muon_critic_weight", cfg.optim.muon_critic_weight >= 0, "must be >= 0"),
        ("optim.muon_critic_weight_rich", cfg.optim.muon_critic_weight_rich >= 0, "must be >= 0"),
        ("optim.rich_muons_per_row", cfg.optim.rich_muons_per_row >= 0, "must be >= 0"),
        ("optim.muon_gp_rows", cfg.optim.muon_gp_rows >= 1, "must be >= 1"),
        ("optim.quantile_match", cfg.optim.quantile_match >= 0, "must be >= 0 (0: off)"),
        ("optim.quantile_match_groups", cfg.optim.quantile_match_groups >= 1, "must be >= 1"),
        (
            "model.muon_critic",
            all(w >= 1 for w in cfg.model.muon_critic),
            "must hold positive widths (or be empty: no per-muon critic)",
        ),
        ("checkpoint.keep_last", cfg.checkpoint.keep_last >= 1, "must be >= 1"),
    ]
    for key, ok, why in checks:
        if not ok:
            raise ConfigError(f"config key {key} {why} (got {_get(cfg, key)!r})")
    if cfg.model.lateral_head == "polar" and cfg.model.representation != "xy":
        raise ConfigError(
            "model.lateral_head=polar is the xy representation's (the radial one has no x "
            f"and y; got model.representation={cfg.model.representation}): set "
            "model.lateral_head=xy or model.representation=xy"
        )
    t = cfg.train
    if t.cuda_graphs and (t.fake_counts != "real" or t.precision == "fp16"):
        raise ConfigError(
            "train.cuda_graphs records the step with the real counts in fp32 or bf16 "
            f"(got train.fake_counts={t.fake_counts}, train.precision={t.precision}): set "
            "train.cuda_graphs=false or those keys back"
        )
    if cfg.model.muon_critic and t.fake_counts != "real":
        raise ConfigError(
            "model.muon_critic pairs each real muon with the fake muon in its place and "
            f"needs train.fake_counts=real (got {t.fake_counts}): set model.muon_critic=[] "
            "or train.fake_counts=real"
        )
    horizon = cfg.optim.decay_steps or cfg.train.max_steps
    if cfg.optim.schedule == "cosine" and horizon <= cfg.optim.warmup_steps:
        raise ConfigError(
            "optim.schedule=cosine needs optim.decay_steps (or, when it is 0, train.max_steps) "
            f"larger than optim.warmup_steps (got {horizon} <= {cfg.optim.warmup_steps}): set "
            "optim.decay_steps to the number of generator steps the learning rate decays over"
        )


# --------------------------------------------------------------------------- loading


def preset_names() -> list[str]:
    """Names of the presets shipped in muongen/presets/."""
    files = resources.files("muongen.presets").iterdir()
    return sorted(p.name[:-5] for p in files if p.name.endswith(".yaml"))


def load_config(source: str | None = None, overrides: list[str] | None = None) -> Config:
    """Build the config: defaults < preset name or YAML file ``source`` < ``overrides``.

    Args:
        source: a preset name (``demo``, ``production-a100``, ...) or a YAML file path.
        overrides: ``key=value`` strings with dotted keys, e.g. ``optim.lr_critic=2e-5``;
            values are parsed as YAML scalars/lists.
    """
    tree: dict[str, Any] = {}
    if source:
        tree = _read_source(source)
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"override {item!r} is not of the form key=value (e.g. optim.lr_critic=2e-5)"
            )
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {item!r}: value is not valid YAML ({exc})") from None
        _set_dotted(tree, key.strip(), value)
    return from_dict(tree)


def _read_source(source: str) -> dict[str, Any]:
    path = Path(source)
    # A bare preset name is the preset even where a folder of that name sits in the working
    # directory (`--out demo` makes one); a path to a YAML file is read as a file.
    shadowed = path.is_dir() and source in preset_names()
    if not shadowed and (path.suffix in (".yaml", ".yml") or path.exists()):
        if not path.is_file():
            what = "is a folder, not a file" if path.is_dir() else "does not exist"
            raise ConfigError(f"config file {source} {what}")
        where = str(path)
        text = _read_text(path)
    else:
        if source not in preset_names():
            raise ConfigError(
                f"unknown preset {source!r}; presets: {', '.join(preset_names())} "
                "(or give a YAML file)"
            )
        text = resources.files("muongen.presets").joinpath(f"{source}.yaml").read_text()
        where = f"preset {source}"
    try:
        tree = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is not valid YAML: {exc}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{where} must be a mapping of sections (data:, model:, ...)")
    return tree


def _read_text(path: Path) -> str:
    """A config file's text; a binary or unreadable file is a one-line ConfigError."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read ({exc.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {path} is not a YAML text file (byte {data[exc.start]:#04x} at "
            f"offset {exc.start} is not UTF-8 text); give a preset name or a YAML config file"
        ) from None
    if "\x00" in text:
        raise ConfigError(
            f"config file {path} is not a YAML text file (it holds NUL bytes); give a preset "
            "name or a YAML config file"
        )
    return text


def _set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"override {key}: {p} is not a section")
        node = nxt
    node[parts[-1]] = value


def from_dict(tree: dict[str, Any]) -> Config:
    """Strictly build a Config from a nested dict (unknown keys and wrong types rejected)."""
    return _build(Config, tree, "")


def _build(cls: type, tree: Any, prefix: str):
    if not isinstance(tree, dict):
        raise ConfigError(f"config section {prefix.rstrip('.') or '<root>'} must be a mapping")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in tree:
        if key not in names:
            raise ConfigError(
                f"unknown config key {prefix}{key}; valid keys here: {', '.join(sorted(names))}"
            )
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in tree:
            continue
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            kwargs[f.name] = _build(hint, tree[f.name], f"{prefix}{f.name}.")
        else:
            kwargs[f.name] = _coerce(tree[f.name], hint, f"{prefix}{f.name}")
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"config section {prefix.rstrip('.')}: {exc}") from None


def _coerce(value: Any, hint: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"config key {key} must be one of {list(args)}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        for a in args:
            if a is type(None) and value is None:
                return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0])
    if origin is list:
        if not isinstance(value, list):
            if isinstance(value, str) and hint == list[str]:
                value = [value]
            else:
                raise ConfigError(f"config key {key} must be a list, got {value!r}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config key {key} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"config key {key} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            if isinstance(value, str):
                try:
                    return float(value)  # YAML 1.1 reads "1e-4" as a string
                except ValueError:
                    pass
            raise ConfigError(f"config key {key} must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"config key {key} must be a string, got {value!r}")
        return value
    raise ConfigError(f"config key {key}: unsupported type {hint}")


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def describe() -> str:
    """Every key with its default and docstring, for `muongen config --list`."""
    lines = []
    for section in dataclasses.fields(Config):
        cls = typing.get_type_hints(Config)[section.name]
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            default = _get(Config(), f"{section.name}.{f.name}")
            lines.append(f"{section.name}.{f.name} = {default!r}\n    {docs.get(f.name, '')}")
    return "\n".join(lines)


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (the string literal under each field) of dataclass ``cls``, read
    from its source, each on one line (also docs/gen_reference.py's, for campaign files)."""
    import ast
    import inspect

    tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for prev, node in itertools.pairwise(body):
        if (
            isinstance(prev, ast.AnnAssign)
            and isinstance(prev.target, ast.Name)
            and isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            docs[prev.target.id] = " ".join(node.value.value.split())  # one line
    return docs
