"""SIGTERM / SIGINT: a checkpoint and a documented exit code, from the first second on.

An eviction (HTCondor, ``docker stop``, a batch system) sends SIGTERM and, after a grace
period, SIGKILL. The handler never raises: an exception raised wherever a signal lands
(inside ``import torch``, half-way through numpy's imports) is swallowed by C start-up code
or leaves a module half-loaded. It only records the signal, except in two phases:

- ``bare``: ``muongen`` itself is still importing the verb's module and nothing is open:
  the handler prints one line and leaves at once with :func:`os._exit`;
- ``finished``: the verb has returned and everything is written and closed: the same.

In between, code acts on the record at safe points: during start-up (config, data
listing, model build, resume) :meth:`StopRequest.check` raises :class:`Evicted` (exit 85,
"restart me", nothing to checkpoint yet) or KeyboardInterrupt (exit 130); once training
runs, the loop reads :attr:`StopRequest.requested` between steps, writes a checkpoint and
exits with ``train.signal_exit_code`` (130 after SIGINT). A second Ctrl-C during training
stops at once (KeyboardInterrupt), as a user pressing it twice expects.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys

from submit.constants import EXIT_SELF_CHECKPOINT

log = logging.getLogger(__name__)

EXIT_RESTART = EXIT_SELF_CHECKPOINT  # HTCondor's checkpoint_exit_code: nothing lost, run me again
EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130: the shell's code for a Ctrl-C

_active: StopRequest | None = None


def active() -> StopRequest | None:
    """The StopRequest that ``muongen``'s main installed for this process, if any."""
    return _active


class Evicted(BaseException):
    """SIGTERM arrived before training started: nothing to checkpoint, exit 85.

    A BaseException so that no ``except Exception`` in the start-up code swallows it.
    """

    exit_code = EXIT_RESTART

    def __init__(self, message: str, exit_code: int = EXIT_RESTART) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class StopRequest:
    """Catches SIGTERM and SIGINT for one process; ``install()`` early, ``check()`` at the
    safe points of start-up, ``training = True`` once the loop runs, ``restore()`` at the end.

    Args:
        verb: names the command in the one line printed (``muongen <verb>: ...``).
        startup_code: the exit code of a SIGTERM before training (85: restart me).
    """

    def __init__(self, verb: str = "train", startup_code: int = EXIT_RESTART) -> None:
        self.signum: int | None = None
        self.training = False
        self.verb = verb
        self.startup_code = startup_code
        self.bare = False  # nothing open yet: the handler may leave at once
        self.finished_code: int | None = None  # the verb's result, once everything is closed
        self.acted = False  # the training loop stopped on the signal (its code says so)
        self.signal_code = startup_code  # the exit code of a run stopped by SIGTERM
        self._late_said = False
        self._old: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        """The signal received (``SIGTERM``), for messages; ``a signal`` when none was here
        (another rank's, under torchrun)."""
        return signal.Signals(self.signum).name if self.signum else "a signal"

    @property
    def interrupted(self) -> bool:
        """The stop was a Ctrl-C (SIGINT)."""
        return self.signum == signal.SIGINT

    def install(self) -> StopRequest:
        for sig in (signal.SIGTERM, signal.SIGINT):
            # ValueError: not the main thread (tests calling train() in a thread)
            with contextlib.suppress(ValueError):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def make_active(self) -> StopRequest:
        """Make this the process's StopRequest (:func:`active`)."""
        global _active
        _active = self
        return self

    def restore(self) -> None:
        global _active
        for sig, handler in self._old.items():
            with contextlib.suppress(ValueError):
                signal.signal(sig, handler)
        self._old.clear()
        if _active is self:
            _active = None

    # ------------------------------------------------------------------ acting on it

    def startup_message(self) -> str:
        name = signal.Signals(self.signum or signal.SIGTERM).name
        return (
            f"received {name} during start-up, before the first training step: nothing to "
            f"checkpoint yet; exit {self.startup_code} (run the same command again)"
        )

    def check(self) -> None:
        """A safe point of start-up: act on a signal received so far.

        Raises:
            KeyboardInterrupt: after SIGINT (the CLI exits 130).
            Evicted: after SIGTERM (exit ``startup_code``).
        """
        if self.signum is None or self.training:
            return
        if self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Evicted(self.startup_message(), self.startup_code)

    def late(self, code: int, signal_code: int | None = None) -> int:
        """The exit code of a run that ended with ``code``: a signal that came after the last
        step (while the final checkpoint was written, published or closed) is not dropped:
        ``signal_code`` (default :attr:`signal_code`; 130 after SIGINT) instead of 0, with
        one line."""
        if signal_code is not None:
            self.signal_code = signal_code
        if code != 0 or self.signum is None or self.acted:
            return code
        late = EXIT_INTERRUPTED if self.interrupted else self.signal_code
        if not self._late_said:
            self._late_said = True
            name = signal.Signals(self.signum).name
            print(
                f"muongen {self.verb}: received {name} after the last step: the run is "
                f"complete and its final checkpoint written; exit {late}",
                file=sys.stderr,
            )
        return late

    def _leave_now(self, signum: int) -> None:
        """Print one line and exit at once (only while nothing is open)."""
        name = signal.Signals(signum).name
        if self.finished_code is not None:
            code = self.finished_code
            if code == 0:
                code = EXIT_INTERRUPTED if signum == signal.SIGINT else self.signal_code
            line = f"received {name} while exiting: the run had ended; exit {code}"
        elif signum == signal.SIGINT:
            code, line = EXIT_INTERRUPTED, "interrupted"
        else:
            code = self.startup_code
            self.signum = signum
            line = self.startup_message()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        with contextlib.suppress(Exception):
            os.write(2, f"muongen {self.verb}: {line}\n".encode())
        os._exit(code)

    def _handle(self, signum: int, _frame) -> None:
        if self.bare or self.finished_code is not None:
            self._leave_now(signum)
        if signum == signal.SIGINT and self.requested and self.training:
            raise KeyboardInterrupt  # a second Ctrl-C while training: stop at once
        if self.signum is None:
            self.signum = signum
        if self.training:
            log.warning(
                "received %s: will checkpoint and stop after this step",
                signal.Signals(signum).name,
            )
