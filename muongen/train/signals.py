"""SIGTERM / SIGINT: a checkpoint and a documented exit code, from the first second on.

An eviction (HTCondor, ``docker stop``, a batch system) sends SIGTERM and, after a grace
period, SIGKILL. During training the request is a flag the loop reads between steps: it
then writes a checkpoint and exits with ``train.signal_exit_code``. Before training starts
(config, data listing, model build, resume) there is nothing to checkpoint yet: the
handler raises :class:`Evicted` at once, which leaves with exit code 85 ("restart me") and
one line saying why, never a bare death by signal 15.
"""

from __future__ import annotations

import contextlib
import logging
import signal

from submit.constants import EXIT_SELF_CHECKPOINT

log = logging.getLogger(__name__)

EXIT_RESTART = EXIT_SELF_CHECKPOINT  # HTCondor's checkpoint_exit_code: nothing lost, run me again


class Evicted(BaseException):
    """SIGTERM arrived before training started: nothing to checkpoint, exit 85.

    A BaseException so that no ``except Exception`` in the start-up code swallows it.
    """

    exit_code = EXIT_RESTART


class StopRequest:
    """Catches SIGTERM and SIGINT for one process; ``install()`` early, ``training = True``
    once the loop runs, ``restore()`` at the end."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.training = False
        self._old: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def install(self) -> StopRequest:
        for sig in (signal.SIGTERM, signal.SIGINT):
            # ValueError: not the main thread (tests calling train() in a thread)
            with contextlib.suppress(ValueError):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        for sig, handler in self._old.items():
            with contextlib.suppress(ValueError):
                signal.signal(sig, handler)
        self._old.clear()

    def _handle(self, signum: int, _frame) -> None:
        name = signal.Signals(signum).name
        if signum == signal.SIGINT and (self.requested or not self.training):
            raise KeyboardInterrupt  # Ctrl-C at start-up, or a second one: stop at once
        if not self.training:
            raise Evicted(
                f"received {name} during start-up, before the first training step: nothing "
                f"to checkpoint yet; exit {EXIT_RESTART} (run the same command again)"
            )
        self.signum = signum
        log.warning("received %s: will checkpoint and stop after this step", name)
