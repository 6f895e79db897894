"""Small test models as ``--set`` override strings; each test adds its own.

``TINY``: the model and batch the chain tests train (test_chain.py, test_chaos.py), seconds
per range on a CPU. ``SMALL_MODEL``: the smallest model the export, input and CLI tests
build, with ``SMALL_CRITIC`` its critic (the evaluation tests use that critic too).
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
