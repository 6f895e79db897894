"""`muongen doctor`: what this machine or container can see, and whether muongen can run here.

Reports the versions (muongen, Python, torch with its CUDA and cuDNN build, pyarrow, h5py,
pelicanfs, htcondor2 when installed), the GPUs NVML sees, whether torch can use CUDA, the
bearer token (source, scopes, expiry: never its value), the scratch dir, threads and the
allocator setting. Exit code 1 when something blocks a run:

- torch does not import;
- the installed versions differ from the image's pinned lock (``--lock`` / $MUONGEN_LOCK);
- the scratch dir is not writable;
- ``--require-gpu`` and no usable GPU, or a driver too old for torch's CUDA build;
- the token found has expired.

``--quick`` (the Docker HEALTHCHECK) never touches CUDA itself: GPUs come from NVML only, so
no CUDA context is created beside a running trainer.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import shutil
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from muongen import __version__

HELP = "report versions, GPUs, token, scratch dir; exit non-zero on a blocking problem"

#: distribution name -> name shown (htcondor's wheel provides the htcondor2 module)
PACKAGES = {
    "numpy": "numpy",
    "pyarrow": "pyarrow",
    "h5py": "h5py",
    "fsspec": "fsspec",
    "pelicanfs": "pelicanfs",
    "tensorboard": "tensorboard",
    "nvidia-ml-py": "nvidia-ml-py",
    "htcondor": "htcondor2",
}
LOW_SCRATCH_BYTES = 1024**3
GIB = 1024**3


@dataclass
class Report:
    """Everything doctor found; ``problems`` block a run, ``warnings`` do not."""

    info: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "problems": self.problems, "warnings": self.warnings, **self.info}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--quick", action="store_true", help="skip the CUDA checks (NVML only): the health check"
    )
    parser.add_argument(
        "--scratch",
        metavar="DIR",
        default=None,
        help="folder that must be writable (default: $_CONDOR_SCRATCH_DIR, $TMPDIR, /tmp)",
    )
    parser.add_argument(
        "--require-gpu", action="store_true", help="a missing or unusable GPU is a problem"
    )
    parser.add_argument(
        "--lock",
        metavar="FILE",
        default=os.environ.get("MUONGEN_LOCK") or None,
        help="pinned versions that must be installed (default: $MUONGEN_LOCK, set in the images)",
    )


def run(args: argparse.Namespace) -> int:
    report = diagnose(
        scratch=args.scratch, quick=args.quick, require_gpu=args.require_gpu, lock=args.lock
    )
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print(format_text(report))
    return 0 if report.ok else 1


def diagnose(
    *,
    scratch: str | None = None,
    quick: bool = False,
    require_gpu: bool = False,
    lock: str | None = None,
    nvml: Any = None,
) -> Report:
    """Run every check. ``nvml`` replaces the ``pynvml`` module (tests use a stand-in)."""
    r = Report()
    r.info["versions"] = package_versions()
    if lock:
        check_lock(r, lock)
    torch = check_torch(r, quick=quick)
    check_nvml(r, nvml)
    check_cuda(r, torch, quick=quick, require_gpu=require_gpu)
    check_token(r)
    check_scratch(r, scratch or default_scratch())
    check_environment(r)
    return r


def package_versions() -> dict[str, str | None]:
    """Installed versions by metadata (no imports); None for packages not installed."""
    out: dict[str, str | None] = {
        "muongen": __version__,
        "python": platform.python_version(),
    }
    for dist, shown in PACKAGES.items():
        try:
            out[shown] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[shown] = None
    return out


def check_lock(r: Report, lock: str) -> None:
    """Every ``name==version`` line of the lock must be what is installed."""
    from packaging.requirements import Requirement

    try:
        with open(lock, encoding="utf-8") as f:
            lines = [ln.split("#")[0].strip() for ln in f]
    except OSError as exc:
        r.problems.append(f"lock file {lock}: {exc.strerror}; pass --lock or unset MUONGEN_LOCK")
        return
    mismatched = []
    pins = [Requirement(ln) for ln in lines if ln]
    for req in pins:
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            have = None
        if have is None or not req.specifier.contains(have, prereleases=True):
            mismatched.append(f"{req.name} {have or 'missing'} (lock: {req.specifier})")
    r.info["lock"] = {"path": lock, "pins": len(pins), "mismatched": mismatched}
    if mismatched:
        r.problems.append(
            f"installed packages differ from the image's pins in {lock}: "
            + ", ".join(mismatched)
            + "; rebuild the image instead of installing into it"
        )


def check_torch(r: Report, *, quick: bool) -> Any:
    """Import torch (a failure blocks everything); its version, CUDA build and threads."""
    try:
        import torch
    except Exception as exc:  # ImportError, or OSError from a broken CUDA library
        r.info["torch"] = {"error": f"{type(exc).__name__}: {exc}"}
        r.problems.append(f"torch does not import ({type(exc).__name__}: {exc})")
        return None
    info: dict[str, Any] = {
        "version": torch.__version__,
        "cuda_build": torch.version.cuda,
        "threads": torch.get_num_threads(),
    }
    if not quick and torch.version.cuda:
        try:
            info["cudnn"] = torch.backends.cudnn.version()
        except Exception as exc:  # cuDNN library missing from the image
            info["cudnn"] = None
            r.warnings.append(f"cuDNN is not loadable: {exc}")
    from muongen.model import layers  # imports torch, which just worked

    # which library the CPU's products outside autograd take by default (train.cpu_matmul:
    # auto): a step or sampling figure differs by 10-25% between them on one machine
    info["cpu_vendor"] = layers.cpu_vendor() or None
    info["cpu_matmul"] = "onednn" if layers.onednn_for("auto") else "blas"
    r.info["torch"] = info
    return torch


def _text(value: Any) -> str:
    # Older pynvml releases return bytes.
    return value.decode() if isinstance(value, bytes) else str(value)


def check_nvml(r: Report, nvml: Any = None) -> None:
    """GPUs and driver as NVML sees them; quietly empty without NVML or a driver."""
    info: dict[str, Any] = {"available": False, "gpus": []}
    r.info["nvml"] = info
    try:
        if nvml is None:
            import pynvml as nvml
        nvml.nvmlInit()
    except Exception as exc:  # no nvidia-ml-py, no libnvidia-ml, no driver
        info["reason"] = str(exc) or type(exc).__name__
        return
    try:
        info["available"] = True
        info["driver"] = _text(nvml.nvmlSystemGetDriverVersion())
        cuda = int(nvml.nvmlSystemGetCudaDriverVersion())  # e.g. 12080
        info["driver_cuda"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(h)
            info["gpus"].append(
                {
                    "index": i,
                    "name": _text(nvml.nvmlDeviceGetName(h)),
                    "memory_gib": round(mem.total / GIB, 1),
                    "memory_used_gib": round(mem.used / GIB, 1),
                    "capability": f"{major}.{minor}",
                }
            )
    except Exception as exc:
        info["reason"] = f"NVML query failed: {exc}"
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _major_minor(version: str) -> tuple[int, int]:
    major, _, rest = version.partition(".")
    return int(major), int(rest.split(".")[0] or 0)


def check_cuda(r: Report, torch: Any, *, quick: bool, require_gpu: bool) -> None:
    """Can torch use a GPU? Driver vs. CUDA build; a tiny matmul unless --quick."""
    nvml = r.info["nvml"]
    cuda: dict[str, Any] = {"checked": not quick}
    r.info["cuda"] = cuda
    build = torch.version.cuda if torch is not None else None
    blocking = r.problems if require_gpu else r.warnings

    driver_cuda = nvml.get("driver_cuda")
    if build and driver_cuda and _major_minor(driver_cuda)[0] < _major_minor(build)[0]:
        blocking.append(
            f"the NVIDIA driver {nvml['driver']} supports CUDA {driver_cuda}, but torch was "
            f"built for CUDA {build}: use a node with a newer driver (gpus_minimum_runtime = "
            f"{build}) or an image built on a CUDA {driver_cuda.split('.')[0]} base"
        )
    if quick:
        if require_gpu and not nvml["gpus"]:
            r.problems.append("--require-gpu: NVML sees no GPU (run with --nv / --gpus all?)")
        return
    if torch is None:
        return
    cuda["available"] = bool(torch.cuda.is_available())
    cuda["visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not cuda["available"]:
        if require_gpu:
            why = "this torch is a CPU build" if not build else "no GPU visible to CUDA"
            r.problems.append(f"--require-gpu: torch.cuda is not available ({why})")
        elif nvml["gpus"]:
            r.warnings.append("NVML sees GPUs but torch.cuda is not available")
        return
    cuda["devices"] = [
        {
            "name": torch.cuda.get_device_name(i),
            "capability": "{}.{}".format(*torch.cuda.get_device_capability(i)),
        }
        for i in range(torch.cuda.device_count())
    ]
    try:  # proves kernels for this GPU are in the build and memory can be allocated
        x = torch.ones(64, 64, device="cuda")
        cuda["matmul_ok"] = bool((x @ x).sum().item() == 64.0**3)
    except Exception as exc:
        cuda["matmul_ok"] = False
        blocking.append(f"a small matmul on cuda:0 failed: {exc}")


def check_token(r: Report) -> None:
    """Tokens that discovery sees (muongen.storage.tokens): source, scopes, expiry, never
    the value. Only expired tokens block; none at all is fine (public data needs none)."""
    try:
        tokens = importlib.import_module("muongen.storage.tokens")
    except ModuleNotFoundError:
        r.info["token"] = {"checked": False, "reason": "token support is not in this build"}
        return
    try:
        found = tokens.candidates()  # never starts a device flow
    except Exception as exc:  # a token file that is present but unreadable
        r.info["token"] = {"checked": True, "found": 0, "error": str(exc)}
        r.warnings.append(f"token: {exc}")
        return
    described = [t.describe() for t in found]
    usable = [d for d in described if d["expires_in_s"] is None or d["expires_in_s"] > 0]
    r.info["token"] = {"checked": True, "found": len(described), "tokens": described}
    if described and not usable:
        first = described[0]
        r.problems.append(
            f"every bearer token found has expired (first: {first['source']}, expired "
            f"{first['expires']}): get a fresh one (htgettoken, or the job's credentials) "
            "before reading pelican:// or osdf:// data"
        )
    elif len(usable) < len(described):
        r.warnings.append(
            "expired token(s) ignored: "
            + ", ".join(d["source"] for d in described if d not in usable)
        )


def default_scratch() -> str:
    env = os.environ
    return env.get("_CONDOR_SCRATCH_DIR") or env.get("TMPDIR") or tempfile.gettempdir()


def check_scratch(r: Report, path: str) -> None:
    """The scratch dir must exist and take a small write; low free space is a warning."""
    info: dict[str, Any] = {"path": path, "writable": False}
    r.info["scratch"] = info
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".muongen-doctor-") as f:
            f.write(b"muongen doctor\n")
            f.flush()
            os.fsync(f.fileno())
        info["writable"] = True
        info["free_gib"] = round(shutil.disk_usage(path).free / GIB, 1)
    except OSError as exc:
        r.problems.append(
            f"scratch dir {path} is not writable ({exc.strerror or exc}): pass --scratch, or "
            "point _CONDOR_SCRATCH_DIR / TMPDIR at a writable folder"
        )
        return
    if info["free_gib"] * GIB < LOW_SCRATCH_BYTES:
        r.warnings.append(f"scratch dir {path} has only {info['free_gib']} GiB free")


def check_environment(r: Report) -> None:
    """Threads vs. CPUs, the allocator setting, and the HTCondor variables in effect."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    names = (
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_ALLOC_CONF",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "CUDA_VISIBLE_DEVICES",
        "_CONDOR_SCRATCH_DIR",
        "TMPDIR",
        "XDG_CACHE_HOME",
        "TORCHINDUCTOR_CACHE_DIR",
        "MPLCONFIGDIR",
    )
    env = {name: os.environ.get(name) for name in names}
    r.info["environment"] = {"cpus": cpus, **env}
    omp = env["OMP_NUM_THREADS"]
    if omp and omp.isdigit() and int(omp) > cpus:
        r.warnings.append(f"OMP_NUM_THREADS={omp} exceeds the {cpus} CPUs this process may use")
    alloc = env["PYTORCH_ALLOC_CONF"] or env["PYTORCH_CUDA_ALLOC_CONF"] or ""
    if r.info["nvml"]["gpus"] and "expandable_segments:True" not in alloc:
        r.warnings.append(
            "PYTORCH_CUDA_ALLOC_CONF lacks expandable_segments:True (reserved memory can "
            "fragment up to an OOM on rare huge events)"
        )


def format_text(r: Report) -> str:
    """A short, human-readable report."""
    d = r.to_dict()
    lines = ["versions"]
    lines += [f"  {k:<14}{v or '-'}" for k, v in d["versions"].items()]
    t = d.get("torch", {})
    if "error" in t:
        lines.append(f"  {'torch':<14}{t['error']}")
    else:
        cudnn = f", cuDNN {t['cudnn']}" if t.get("cudnn") else ""
        lines.append(f"  {'torch':<14}{t['version']} (CUDA build {t['cuda_build'] or '-'}{cudnn})")
        lines.append(
            f"  {'cpu products':<14}{t['cpu_matmul']} outside autograd by default "
            f"(train.cpu_matmul: auto; processor {t['cpu_vendor'] or 'unnamed'})"
        )
    nv = d["nvml"]
    if nv["available"]:
        lines.append(f"gpus (NVML: driver {nv.get('driver')}, CUDA {nv.get('driver_cuda')})")
        lines += [
            f"  {g['index']}  {g['name']}  {g['memory_gib']} GiB  capability {g['capability']}"
            for g in nv["gpus"]
        ] or ["  none"]
    else:
        lines.append(f"gpus: none seen (NVML: {nv.get('reason', 'not available')})")
    c = d["cuda"]
    if c.get("checked") and "available" in c:
        lines.append(f"torch.cuda: {'available' if c['available'] else 'not available'}")
    tok = d["token"]
    if not tok.get("checked"):
        lines.append(f"token: not checked ({tok.get('reason')})")
    elif not tok.get("found"):
        lines.append("token: none found" + (f" ({tok['error']})" if tok.get("error") else ""))
    for t in tok.get("tokens", []):
        scopes = " ".join(t["scopes"]) or "(opaque token: scopes unknown)"
        lines.append(f"token: {t['source']}  expires {t['expires'] or '-'}  scopes {scopes}")
    s = d["scratch"]
    state = f"writable, {s.get('free_gib')} GiB free" if s["writable"] else "NOT writable"
    lines.append(f"scratch: {s['path']} ({state})")
    lines.append("environment")
    lines += [f"  {k:<24}{v if v is not None else '-'}" for k, v in d["environment"].items()]
    if "lock" in d:
        lk = d["lock"]
        matching = lk["pins"] - len(lk["mismatched"])
        lines.append(f"lock: {lk['path']} ({matching}/{lk['pins']} pins match)")
    lines += [f"warning: {w}" for w in r.warnings]
    lines += [f"PROBLEM: {p}" for p in r.problems]
    lines.append("ok" if r.ok else f"{len(r.problems)} blocking problem(s)")
    return "\n".join(lines)
