"""Small test models as ``--set`` override strings; each test adds its own.

``TINY``: the model and batch the chain tests train (test_chain.py, test_chaos.py), seconds
per range on a CPU. ``SMALL_MODEL``: the smallest model the export, input and CLI tests
build, with ``SMALL_CRITIC`` its critic (the evaluation tests use that critic too).
:func:`set_multiplicity` gives an untrained generator muons to make.
"""

SMALL_CRITIC = [
    "model.critic_muon_hidden=[8]",
    "model.critic_head_hidden=[8]",
    "model.critic_local_width=8",
    "model.critic_global_width=8",
]

SMALL_MODEL = [
    "model.z_global=4",
    "model.z_local=3",
    "model.context=16",
    "model.mult_hidden=[8]",
    "model.local_hidden=[16]",
    *SMALL_CRITIC,
]

BATCH = 32


def set_multiplicity(generator, log_mult: float) -> None:
    """Make an untrained generator's head give about 10^log_mult - 1 muons per event
    (untrained, it gives about none), whatever its mode. Call under torch.no_grad().

    round/lognormal: the mean's bias. hurdle: the lowest knot at log_mult (at least one
    muon), and most events empty where log_mult < 0.5, few otherwise."""
    head = generator.multiplicity
    if generator.multiplicity_mode == "hurdle":
        head.output_bias("knots")[0] = max(log_mult, 0.3)
        head.output_bias("zero").fill_(-3.0 if log_mult > 0.5 else 2.0)
    else:
        head[-1].bias.fill_(log_mult)


TINY = [
    f"data.batch_events={BATCH}",
    "data.shuffle_buffer_events=128",
    "data.max_muons_per_event=1000000",
    "model.z_global=8",
    "model.z_local=4",
    "model.context=32",
    "model.mult_hidden=[16]",
    "model.local_hidden=[16]",
    "model.critic_local_width=8",
    "model.critic_global_width=16",
    "model.critic_muon_hidden=[16]",
    "model.critic_head_hidden=[16]",
    "optim.n_critic=1",
    "optim.gp_max_pairs=64",
    "train.device=cpu",
    "train.log_every=5",
    "checkpoint.every_minutes=0",
    "logging.hist_every=0",
    "logging.gpu_monitor=false",
]
