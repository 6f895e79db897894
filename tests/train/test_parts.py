"""The Trainer is composed of stateful parts: a checkpoint is the union of their states, a
fresh start resets every one, and a new part plugs in with ``add_part``. The training step
is injected here (``make_step``): these tests exercise the loop, not the GAN."""

from __future__ import annotations

import torch

from muongen import checkpoint as ckpt
from muongen.train.trainer import Trainer


class CountingStep:
    """A stand-in training step: no model update, fixed losses, a counter as its state."""

    def __init__(self, *args) -> None:
        self.calls = 0
        self.timer = None

    def __call__(self, micro):
        self.calls += 1
        zero = torch.zeros(())
        return {k: zero for k in ("c_loss", "g_loss", "m_loss", "gp", "w_gap", "skipped")}

    def learning_rates(self):
        return {"generator": 1e-4, "critic": 1e-4}

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state):
        self.calls = state["calls"]


class Tally:
    """A part like an EMA or a best-checkpoint tracker would be."""

    def __init__(self, follows_data: bool = False) -> None:
        self.follows_data = follows_data
        self.value = 0

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]

    def reset(self):
        self.value = -1


def trainer(tiny_config, run, steps, **extra):
    t = Trainer(tiny_config(train__max_steps=steps, **extra), run, make_step=CountingStep)
    t.add_part("tally", Tally())
    t.add_part("data_tally", Tally(follows_data=True))
    return t


def test_a_checkpoint_is_the_union_of_the_parts(tiny_config, tmp_path):
    t = trainer(tiny_config, tmp_path / "r", 10)
    t.resume(None)  # a fresh start: every part reset
    assert t.parts["tally"].value == -1
    t.parts["tally"].value = t.parts["data_tally"].value = 7
    t.train()
    payload = ckpt.load(ckpt.find_latest(tmp_path / "r" / "checkpoints"))
    assert set(t.parts) <= set(payload)
    assert payload["tally"] == {"value": 7} and payload["optim"] == {"calls": 10}
    assert payload["trainer"]["step"] == 10 and len(payload["data"]) == 1  # one rank

    again = trainer(tiny_config, tmp_path / "r", 20)
    again.resume("auto")
    assert again.parts["tally"].value == 7 and again.parts["data_tally"].value == 7
    assert again.step_fn.calls == 10

    fresh = trainer(tiny_config, tmp_path / "other", 20)
    fresh.parts["tally"].value = fresh.parts["data_tally"].value = 5
    fresh.resume(None)
    assert fresh.parts["tally"].value == -1 and fresh.parts["data_tally"].value == -1


def test_other_inputs_reset_only_the_parts_that_follow_the_data(tiny_config, tiny_data, tmp_path):
    files = sorted(str(p) for p in tiny_data.glob("*.parquet"))
    t = trainer(tiny_config, tmp_path / "a", 10, data__paths=f"[{files[0]}]")
    t.resume(None)
    t.parts["tally"].value = t.parts["data_tally"].value = 3
    t.train()
    node = trainer(tiny_config, tmp_path / "b", 20, data__paths=f"[{files[1]}]")
    node.resume(str(tmp_path / "a" / "checkpoints"))
    assert node.parts["tally"].value == 3  # the model's side continues
    assert node.parts["data_tally"].value == -1  # the data's side starts afresh
