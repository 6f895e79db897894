"""`muongen <verb> ...`: a thin argparse front over the package.

Each verb lives in its own module, imported only when that verb runs (so `muongen inspect`
does not pay for TensorBoard). A verb module defines::

    HELP = "one line for `muongen --help`"
    def configure(parser: argparse.ArgumentParser) -> None: ...
    def run(args: argparse.Namespace) -> int: ...

Errors a user can cause (MuongenError) are printed without a traceback and exit non-zero.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys

from muongen import __version__
from muongen.errors import MuongenError

#: verb -> module implementing it (configure/run/HELP).
VERBS: dict[str, str] = {
    "train": "muongen.train.command",
    "chain": "muongen.chain",
    "sample": "muongen.evaluate.sample_command",
    "export": "muongen.export",
    "evaluate": "muongen.evaluate.command",
    "synth": "muongen.data.synth",
    "inspect": "muongen.data.inspect",
    "outliers": "muongen.data.outliers",
    "tb-merge": "muongen.monitor.tb_merge",
    "compare": "muongen.compare",
    "bench": "muongen.bench",
    "doctor": "muongen.doctor",
    "config": "muongen.config_command",
}

#: verbs whose own work is numpy's (the evaluation's metrics over the held-out splits):
#: their numpy and scipy BLAS (OpenBLAS) runs on one thread, see :func:`limit_blas_threads`
ONE_BLAS_THREAD = frozenset({"evaluate"})


def limit_blas_threads(verb: str | None) -> None:
    """For a verb in :data:`ONE_BLAS_THREAD`: OpenBLAS (numpy's and scipy's BLAS) on one
    thread, unless ``OPENBLAS_NUM_THREADS`` is set already. Its extra threads bought
    ``muongen evaluate`` nothing (1000000 held-out rows on 2 cores: 58 s either way) and
    spun between calls, 35 s of CPU that, beside other work on the machine, made it 1.7x
    slower (one busy core) and two evaluations side by side many times slower. OpenBLAS
    reads the variable once, when numpy loads: nothing changes once numpy is imported."""
    if verb in ONE_BLAS_THREAD and "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def build_parser(verbs: dict[str, str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="muongen",
        description="Train and run a conditional WGAN-GP generator of IceCube muon bundles.",
    )
    parser.add_argument("--version", action="version", version=f"muongen {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    sub.required = True
    for verb, modname in (verbs or VERBS).items():
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            if exc.name and modname.startswith(exc.name):
                continue  # verb not built in this installation
            raise
        p = sub.add_parser(
            verb, help=getattr(mod, "HELP", ""), description=getattr(mod, "HELP", "")
        )
        mod.configure(p)
        p.set_defaults(_run=mod.run)
    return parser


def catch_signals(verb: str | None, argv: list[str]):
    """For a verb that checkpoints or runs nodes (train, chain): catch SIGTERM and SIGINT
    now, before its module and torch load (:mod:`muongen.train.signals`). Until the verb's
    module is in, a signal ends the process at once with one line and the verb's exit code
    (85 for train and a node, 128 + the signal's number for a local chain)."""
    if verb not in ("train", "chain"):
        return None
    from muongen.train.signals import EXIT_RESTART, StopRequest

    local_chain = verb == "chain" and "--node" not in argv
    stop = StopRequest(verb, 128 + signal.SIGTERM if local_chain else EXIT_RESTART)
    stop.bare = True
    return stop.install().make_active()


def main(argv: list[str] | None = None) -> int:
    whole_process = argv is None  # the console script or `python -m muongen`
    argv = sys.argv[1:] if argv is None else argv
    # Import only the module of the verb asked for (fast startup, fewer heavy imports).
    verbs = VERBS
    first = next((a for a in argv if not a.startswith("-")), None)
    if first in VERBS:
        verbs = {first: VERBS[first]}
    stop = catch_signals(first, argv)  # first: a SIGTERM from the first second on counts
    try:
        code = _main(argv, verbs, first, stop)
    finally:
        if stop is not None and not whole_process:
            stop.restore()  # called in-process (tests): leave the handlers as they were
    if stop is not None and whole_process:
        # Everything is written and closed: a signal from here on leaves at once, with
        # this code (or the signal's), instead of being lost while the interpreter shuts
        # down; one that came since the verb last looked is not dropped either.
        stop.finished_code = code
        code = stop.late(code)
        # and no interpreter shutdown: it resets the handlers to the default, where a
        # SIGTERM kills the process by signal 15 (or, past the last bytecode, is dropped)
        _exit_now(code)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _exit_now(code)
    return code


def _main(argv: list[str], verbs: dict[str, str], first: str | None, stop) -> int:
    limit_blas_threads(first)  # before the verb's module loads numpy
    parser = build_parser(verbs)
    args = parser.parse_args(argv)  # SystemExit for --help and usage errors, as argparse does
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    evicted: tuple[type[BaseException], ...] = ()  # (an empty tuple catches nothing)
    if stop is not None:
        from muongen.train.signals import Evicted

        evicted = (Evicted,)
    try:
        if stop is not None:
            stop.bare = False  # from here on the handler records; code acts at safe points
            stop.check()
        code = int(args._run(args) or 0)
    except evicted as exc:  # a SIGTERM acted on at a safe point of start-up
        print(f"muongen {args.verb}: {exc}", file=sys.stderr)
        code = exc.exit_code
    except MuongenError as exc:
        print(f"muongen {args.verb}: error: {exc}", file=sys.stderr)
        code = exc.exit_code
    except KeyboardInterrupt:
        print(f"muongen {args.verb}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `muongen inspect ... | head`: quiet exit, and keep Python from complaining at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    return code


def _exit_now(code: int) -> None:
    """Leave a torchrun worker (or a train/chain process, see :func:`main`) without
    interpreter finalisation.

    With pyarrow loaded, a gloo worker aborted at exit in about one run in ten ("terminate
    called without an active exception", in C++ static destructors after all Python code
    had finished). Everything durable (checkpoints, manifests, audit files, TensorBoard
    events) is already written, fsynced and closed at this point, so flush and go.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
