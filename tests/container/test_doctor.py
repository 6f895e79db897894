"""`muongen doctor` on this CPU machine, with a stand-in NVML, tokens and locks."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import jwt
import pytest
import torch

from muongen import doctor
from muongen.cli import main

needs_cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")


@pytest.fixture(autouse=True)
def no_tokens(monkeypatch, tmp_path):
    # Keep this machine's tokens (BEARER_TOKEN, /tmp/bt_u<uid>, _CONDOR_CREDS, saved
    # device-flow tokens) out of the report, and the image's lock out of the checks.
    for name in ("BEARER_TOKEN", "BEARER_TOKEN_FILE", "_CONDOR_CREDS", "MUONGEN_LOCK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def doctor_json(capsys, *args: str) -> tuple[int, dict]:
    code = main(["doctor", "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def make_token(**claims) -> str:
    return jwt.encode({"iss": "https://issuer.example", **claims}, "k" * 32, algorithm="HS256")


@needs_cpu_only
def test_cpu_machine_reports_no_gpu_and_passes(capsys, tmp_path):
    code, rep = doctor_json(capsys, "--scratch", str(tmp_path))
    assert code == 0 and rep["ok"] and rep["problems"] == []
    assert rep["nvml"]["gpus"] == [] and rep["cuda"]["available"] is False
    assert rep["versions"]["muongen"] and rep["versions"]["pyarrow"] == metadata.version("pyarrow")
    assert rep["torch"]["version"] == torch.__version__
    assert rep["scratch"]["path"] == str(tmp_path) and rep["scratch"]["writable"] is True
    assert not any("NVML" in w for w in rep["warnings"])  # silent without NVML


@pytest.mark.parametrize("kind", ["missing", "a file"])
def test_unwritable_scratch_fails(capsys, tmp_path, kind):
    scratch = tmp_path / "nope"
    if kind == "a file":
        scratch.write_text("not a folder")
    code, rep = doctor_json(capsys, "--scratch", str(scratch))
    assert code == 1 and not rep["ok"]
    assert rep["scratch"]["writable"] is False
    assert any(f"scratch dir {scratch} is not writable" in p for p in rep["problems"])


def test_cli_exit_code_end_to_end(tmp_path):
    # the real command line, as the HEALTHCHECK and %test run it
    res = subprocess.run(
        [sys.executable, "-m", "muongen", "doctor", "--quick", "--scratch", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1
    assert "PROBLEM: scratch dir" in res.stdout and "1 blocking problem" in res.stdout


@needs_cpu_only
@pytest.mark.parametrize("quick", [False, True])
def test_require_gpu_without_one_fails(capsys, tmp_path, quick):
    args = ["--scratch", str(tmp_path), "--require-gpu"] + (["--quick"] if quick else [])
    code, rep = doctor_json(capsys, *args)
    assert code == 1
    assert any(p.startswith("--require-gpu") for p in rep["problems"])


class FakeNvml:
    """pynvml's calls used by doctor, for two GPUs behind a CUDA 12.8 driver."""

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return b"570.86.15"  # old pynvml releases return bytes

    def nvmlSystemGetCudaDriverVersion(self):
        return 12080

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return "NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=80 * 1024**3, used=(h + 1) * 1024**3)

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return (8, 0)


def test_gpus_as_nvml_sees_them(tmp_path):
    rep = doctor.diagnose(scratch=str(tmp_path), quick=True, nvml=FakeNvml())
    nv = rep.info["nvml"]
    assert nv["available"] and nv["driver"] == "570.86.15" and nv["driver_cuda"] == "12.8"
    assert [(g["name"], g["memory_gib"], g["capability"]) for g in nv["gpus"]] == [
        ("NVIDIA A100-SXM4-80GB", 80.0, "8.0")
    ] * 2
    text = doctor.format_text(rep)
    assert "driver 570.86.15, CUDA 12.8" in text and "1  NVIDIA A100-SXM4-80GB" in text


def test_driver_too_old_for_the_cuda_build():
    r = doctor.Report()
    doctor.check_nvml(r, FakeNvml())
    cuda13 = SimpleNamespace(version=SimpleNamespace(cuda="13.0"))
    doctor.check_cuda(r, cuda13, quick=True, require_gpu=True)
    assert any("torch was built for CUDA 13.0" in p for p in r.problems)
    r2 = doctor.Report()
    doctor.check_nvml(r2, FakeNvml())
    doctor.check_cuda(r2, cuda13, quick=True, require_gpu=False)
    assert not r2.problems and any("CUDA 13.0" in w for w in r2.warnings)
    r3 = doctor.Report()
    doctor.check_nvml(r3, FakeNvml())
    doctor.check_cuda(
        r3, SimpleNamespace(version=SimpleNamespace(cuda="12.9")), quick=True, require_gpu=True
    )
    assert not r3.problems  # minor-version compatibility within CUDA 12


def test_allocator_setting_is_checked_when_gpus_are_present(monkeypatch, tmp_path):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    rep = doctor.diagnose(scratch=str(tmp_path), quick=True, nvml=FakeNvml())
    assert any("expandable_segments" in w for w in rep.warnings)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    rep = doctor.diagnose(scratch=str(tmp_path), quick=True, nvml=FakeNvml())
    assert not any("expandable_segments" in w for w in rep.warnings)


def test_token_scopes_and_expiry_without_its_value(capsys, monkeypatch, tmp_path):
    value = make_token(
        scope="storage.read:/icecube storage.create:/icecube/muongen", exp=int(time.time()) + 3600
    )
    monkeypatch.setenv("BEARER_TOKEN", value)
    code = main(["doctor", "--json", "--quick", "--scratch", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert value not in out and value.split(".")[2] not in out
    (tok,) = json.loads(out)["token"]["tokens"]
    assert tok["source"] == "BEARER_TOKEN"
    assert tok["scopes"] == ["storage.read:/icecube", "storage.create:/icecube/muongen"]
    assert 3500 < tok["expires_in_s"] <= 3600
    main(["doctor", "--quick", "--scratch", str(tmp_path)])
    text = capsys.readouterr().out
    assert "token: BEARER_TOKEN" in text and value not in text


def test_expired_token_fails(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("BEARER_TOKEN", make_token(scope="storage.read:/", exp=int(time.time()) - 5))
    code, rep = doctor_json(capsys, "--quick", "--scratch", str(tmp_path))
    assert code == 1 and any("expired" in p for p in rep["problems"])


def test_no_token_is_fine(capsys, tmp_path):
    code, rep = doctor_json(capsys, "--quick", "--scratch", str(tmp_path))
    assert code == 0 and rep["token"]["found"] == 0


def test_installed_versions_are_checked_against_the_lock(capsys, tmp_path):
    lock = tmp_path / "requirements.lock"
    torch_public = torch.__version__.split("+")[0]  # "2.13.0" matches "2.13.0+cpu"
    good = f"# pins\ntorch=={torch_public}\npyyaml=={metadata.version('pyyaml')}\n"
    lock.write_text(good)
    code, rep = doctor_json(capsys, "--quick", "--scratch", str(tmp_path), "--lock", str(lock))
    assert code == 0 and rep["lock"] == {"path": str(lock), "pins": 2, "mismatched": []}
    lock.write_text(good + "numpy==0.0.1\nno-such-package-xyz==1.0\n")
    code, rep = doctor_json(capsys, "--quick", "--scratch", str(tmp_path), "--lock", str(lock))
    assert code == 1
    assert rep["lock"]["mismatched"] == [
        f"numpy {metadata.version('numpy')} (lock: ==0.0.1)",
        "no-such-package-xyz missing (lock: ==1.0)",
    ]


def test_lock_defaults_to_the_image_variable(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("MUONGEN_LOCK", str(tmp_path / "absent.lock"))
    code, rep = doctor_json(capsys, "--quick", "--scratch", str(tmp_path))
    assert code == 1 and any("absent.lock" in p for p in rep["problems"])


def test_text_report_names_every_section(capsys, tmp_path):
    assert main(["doctor", "--scratch", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    for part in ("versions", "torch", "gpus", "token", "scratch:", "environment", "ok"):
        assert part in text


def test_it_names_the_library_of_the_cpu_products(capsys, monkeypatch, tmp_path):
    from muongen.model import layers

    before = layers.onednn_in_use()
    for vendor in ("AuthenticAMD", "GenuineIntel"):
        monkeypatch.setattr(layers, "cpu_vendor", lambda v=vendor: v)
        code, rep = doctor_json(capsys, "--quick", "--scratch", str(tmp_path))
        ran = "onednn" if vendor == "AuthenticAMD" and layers._HAS_ONEDNN else "blas"
        assert code == 0 and rep["torch"]["cpu_matmul"] == ran
        assert rep["torch"]["cpu_vendor"] == vendor
    assert main(["doctor", "--quick", "--scratch", str(tmp_path)]) == 0
    assert "cpu products  blas outside autograd" in capsys.readouterr().out
    assert layers.onednn_in_use() is before  # reported, not changed


def test_repo_lock_file_parses(tmp_path):
    # The images' own lock is readable by doctor (its versions may differ from this venv's).
    r = doctor.Report()
    doctor.check_lock(r, str(Path(__file__).resolve().parents[2] / "container/requirements.lock"))
    assert r.info["lock"]["pins"] > 20
