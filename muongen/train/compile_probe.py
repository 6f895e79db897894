"""Whether ``train.compile`` compiles the step here: the compile probe.

torch.compile generates C++ (CPU) or Triton (CUDA) code and builds it with the host's C
compiler at run time; where something it needs is missing, the step runs uncompiled and
a warning says what to install (:func:`compiles`).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

#: torch.compile's backend for ``train.compile`` (a name or a callable; tests swap it)
COMPILE_BACKEND: str | Callable = "inductor"


def c_compiler() -> str | None:
    """The C compiler torch.compile's code generation would call (``CC``, else cc, gcc or
    clang on the PATH), or None."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def compiles(setting: bool | str, device: torch.device) -> bool:
    """Whether ``train.compile`` (true, false or ``cuda``) compiles the step on ``device``:
    where it asks for it and it can work (:func:`_can_compile`)."""
    wanted = setting is True or (setting == "cuda" and device.type == "cuda")
    return wanted and _can_compile(device)


def _can_compile(device: torch.device) -> bool:
    """Whether ``train.compile`` can work here; logs why not (the step then runs as usual).

    torch.compile generates C++ (CPU) or Triton (CUDA) code and builds it with the host's C
    compiler at run time; some images have none (pytorch/pytorch's runtime images before
    2026)."""
    missing = []
    if c_compiler() is None:
        missing.append("a C compiler (none of $CC, cc, gcc, clang is on the PATH)")
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            missing.append("the triton package")
    if missing:
        log.warning(
            "train.compile needs %s: the step runs uncompiled (install it, or set "
            "train.compile=false to silence this)",
            " and ".join(missing),
        )
        return False
    return True
