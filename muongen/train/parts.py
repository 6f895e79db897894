"""The Trainer's small stateful parts. A checkpoint is the union of the parts' states.

Every part has ``state_dict()``, ``load_state_dict(state)`` and ``reset()`` (a fresh start:
forget anything a previous attempt left, on disk too). A part with ``follows_data = True``
belongs to one input list: a checkpoint made on other files (a chain node continuing the
previous range's model) restores the model but resets these parts. A part with
``per_rank = True`` is saved once per process (:class:`PerRank` gathers them). A
checkpoint older than a part resets it, unless the part has ``missing(config)``: then it
takes what that checkpoint's config records (the batch and the per-muon weight a run
decided from its files, :mod:`muongen.train.batch_size`, :mod:`muongen.train.muon_weight`).

To add a part (an EMA of the generator, a best-checkpoint tracker), give it these three
methods and register it with :meth:`muongen.train.trainer.Trainer.add_part`.
"""

from __future__ import annotations

import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from muongen.checkpoint import load_module
from muongen.train import distributed as ddp


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def reset(self) -> None: ...


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Weights:
    """A model's weights; loading refuses another shape with the settings that differ."""

    def __init__(self, module: nn.Module, what: str, differences=lambda state: []) -> None:
        self.module, self.what, self.differences = module, what, differences
        self.source: Any = "checkpoint"  # named in error messages; set by the trainer

    def state_dict(self) -> dict[str, Any]:
        return self.module.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_module(self.module, state, self.what, self.source, self.differences(state))

    def reset(self) -> None:
        pass  # a fresh start keeps the freshly initialised weights


@dataclass
class Counters:
    """Progress over all resumed runs: generator steps, events and muons trained on,
    non-finite steps and rollbacks."""

    step: int = 0
    events_seen: int = 0
    muons_seen: int = 0
    nonfinite_total: int = 0
    rollbacks: int = 0

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, int(value))

    def reset(self) -> None:
        self.load_state_dict(asdict(Counters()))


class StreamState:
    """The input stream's cursor on this rank, and the steps taken on this input list."""

    follows_data = True

    def __init__(self, make_stream) -> None:
        self.make_stream = make_stream
        self.stream = make_stream()
        self.steps = 0

    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self.stream.state_dict(), "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stream = self.make_stream()
        self.stream.load_state_dict(state["cursor"])
        self.steps = int(state["steps"])

    def reset(self) -> None:
        self.stream = self.make_stream()
        self.steps = 0


class RngState:
    """Python, NumPy, torch (and CUDA) random states; a reset seeds from ``seed_fn()``."""

    follows_data = True

    def __init__(self, seed_fn) -> None:
        self.seed_fn = seed_fn

    def state_dict(self) -> dict[str, Any]:
        state = {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
        }
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"].cpu())
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])

    def reset(self) -> None:
        seed_everything(self.seed_fn())


class AuditLog:
    """The key of every event trained on, one file per rank (``logging.audit_events``).

    Keys are appended when a checkpoint is taken, so the file always matches the
    checkpointed state; a resume truncates it to the length its checkpoint recorded, and a
    fresh start removes it.
    """

    follows_data = True

    def __init__(self, path: str | os.PathLike, enabled: bool) -> None:
        self.path, self.enabled = Path(path), enabled
        self._pending: list[torch.Tensor] = []

    def record(self, keys: torch.Tensor | None) -> None:
        if self.enabled and keys is not None:
            self._pending.append(keys.clone())

    def state_dict(self) -> dict[str, Any]:
        if not self.enabled:
            return {"bytes": 0}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "ab") as f:
            for keys in self._pending:
                f.write(keys.cpu().numpy().astype("<i8").tobytes())
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        self._pending.clear()
        return {"bytes": size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._pending.clear()
        if self.path.exists():
            with open(self.path, "r+b") as f:
                f.truncate(int(state["bytes"]))

    def reset(self) -> None:
        self._pending.clear()
        self.path.unlink(missing_ok=True)


class PerRank:
    """Saves ``part`` once per process: the state is the list of every rank's state."""

    def __init__(self, part, dist: ddp.DistInfo) -> None:
        self.part, self.dist = part, dist
        self.follows_data = getattr(part, "follows_data", False)

    def state_dict(self) -> list[Any]:  # collective under torchrun
        return ddp.gather_objects(self.part.state_dict(), self.dist)

    def load_state_dict(self, state: list[Any]) -> None:
        self.part.load_state_dict(state[self.dist.rank])

    def reset(self) -> None:
        self.part.reset()
