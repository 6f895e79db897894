"""SIGTERM during start-up (config, data listing, model build) exits 85 with a message."""

from __future__ import annotations

import os
import signal
import time

import pytest

from muongen import cli
from muongen.train import command
from muongen.train.signals import EXIT_RESTART

from .conftest import tiny_overrides


def _sigterm_then(real):
    def startup_step(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # the eviction arrives in the middle of start-up
        time.sleep(0.5)  # (the handler only records it; start-up acts at its next safe point)
        return real(*args, **kwargs)

    return startup_step


@pytest.mark.parametrize("where", ["config", "model build"])
def test_sigterm_during_startup_exits_85_with_a_message(
    tiny_data, tmp_path, monkeypatch, capsys, where
):
    if where == "config":
        monkeypatch.setattr(command, "load_config", _sigterm_then(command.load_config))
    else:
        import muongen.model

        monkeypatch.setattr(
            muongen.model, "build_models", _sigterm_then(muongen.model.build_models)
        )
    argv = ["train", "--config", "demo", "--out", str(tmp_path / "r")]
    argv += [a for s in tiny_overrides(tiny_data) for a in ("--set", s)]
    assert cli.main(argv) == EXIT_RESTART
    err = capsys.readouterr().err
    assert "received SIGTERM during start-up" in err and "exit 85" in err
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_sigterm_during_a_chain_nodes_startup_exits_85(tiny_data, tmp_path, monkeypatch, capsys):
    import muongen.config

    monkeypatch.setattr(muongen.config, "load_config", _sigterm_then(muongen.config.load_config))
    argv = ["chain", "--node", "--range", "0000000-0000999", "--data", str(tiny_data)]
    argv += ["--preset", "demo", "--scratch", str(tmp_path)]
    assert cli.main(argv) == EXIT_RESTART
    assert "received SIGTERM during start-up" in capsys.readouterr().err


def test_the_handler_is_in_place_before_the_verbs_module_loads(monkeypatch):
    # a SIGTERM that lands while `muongen train` imports its module (and torch after it)
    # must find muongen's handler, never the default one (death by signal 15)
    seen = []
    real = cli.build_parser

    def spy(verbs=None):
        seen.append(signal.getsignal(signal.SIGTERM))
        return real(verbs)

    monkeypatch.setattr(cli, "build_parser", spy)
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    assert seen and callable(seen[0]) and seen[0] not in (signal.SIG_DFL, signal.SIG_IGN)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored in-process


def test_a_handler_never_raises_it_records(monkeypatch):
    from muongen.train.signals import Evicted, StopRequest

    stop = StopRequest().install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # lands "inside an import": nothing is raised
        time.sleep(0.05)
        assert stop.signum == signal.SIGTERM
        with pytest.raises(Evicted, match="exit 85"):
            stop.check()  # the safe point acts on it
    finally:
        stop.restore()


def test_sigterm_after_the_last_step_is_not_dropped(tiny_data, tmp_path, monkeypatch, capsys):
    from muongen.train.checkpoint import Checkpointer

    real_save = Checkpointer.save

    def save_then_sigterm(self, state, step, *again):
        saved = real_save(self, state, step, *again)
        if step == 6:  # the last step's checkpoint: the eviction lands while it is written
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        return saved

    monkeypatch.setattr(Checkpointer, "save", save_then_sigterm)
    argv = ["train", "--config", "demo", "--out", str(tmp_path / "r"), "--max-steps", "6"]
    sets = [*tiny_overrides(tiny_data), "train.signal_exit_code=85", "checkpoint.every_steps=50"]
    argv += [a for s in sets for a in ("--set", s)]
    assert cli.main(argv) == EXIT_RESTART  # was 0: the eviction silently dropped
    err = capsys.readouterr().err
    assert "received SIGTERM after the last step" in err and "Traceback" not in err


def test_sigterm_mid_run_with_the_default_code_is_a_stop_not_a_finished_run(
    tiny_data, tmp_path, monkeypatch, capsys, caplog
):
    # Interactive default (train.signal_exit_code: 0): the run stops at its next step with a
    # checkpoint; nothing may claim that it ran to the end ("after the last step").
    from muongen.train.trainer import Trainer

    real_step = Trainer.train_step

    def step_then_sigterm(self, batch):
        out = real_step(self, batch)
        if self.step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(Trainer, "train_step", step_then_sigterm)
    argv = ["train", "--config", "demo", "--out", str(tmp_path / "r"), "--max-steps", "50"]
    sets = [*tiny_overrides(tiny_data), "checkpoint.every_steps=100"]
    argv += [a for s in sets for a in ("--set", s)]
    with caplog.at_level("INFO"):
        assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "after the last step" not in err and "Traceback" not in err
    assert "stopping after SIGTERM" in caplog.text
    assert "reached train.max_steps" not in caplog.text
