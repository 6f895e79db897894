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
        time.sleep(0.5)  # (the handler raises here, on the main thread)
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
