"""Static checks of the two image definitions (no Docker engine or Apptainer is needed).

Both images must install the same muongen (the same source files, through the same
container/install.sh) with the same pins (container/requirements.lock), the pins must
satisfy pyproject.toml, and what ENTRYPOINT / HEALTHCHECK / %runscript / %test run must
exist in the repository once mapped through COPY / %files.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

import muongen
from muongen.cli import VERBS, build_parser

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

REPO = Path(__file__).resolve().parents[2]
SRC = "/opt/muongen"  # where both images put the checkout


# ---- parsing ---------------------------------------------------------------------------
def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in (REPO / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        buf += " " + line[:-1] if line.endswith("\\") else " " + line
        if not line.endswith("\\"):
            op, _, args = buf.strip().partition(" ")
            out.append((op.upper(), args.strip()))
            buf = ""
    return out


def docker_args() -> dict[str, str]:
    return dict(a.split("=", 1) for op, a in dockerfile() if op == "ARG" and "=" in a)


def docker_one(op: str) -> str:
    found = [a for o, a in dockerfile() if o == op]
    assert len(found) == 1, f"expected one {op}, found {found}"
    return found[0]


def apptainer() -> tuple[dict[str, str], dict[str, list[str]]]:
    """Header (Bootstrap, From) and sections (name -> non-comment lines)."""
    header: dict[str, str] = {}
    sections: dict[str, list[str]] = {}
    current = None
    for raw in (REPO / "Apptainer.def").read_text().splitlines():
        line = raw.strip()
        if line.startswith("%"):
            current = line[1:].split()[0]
            sections[current] = []
        elif current is None:
            if ":" in line and not line.startswith("#"):
                key, _, value = line.partition(":")
                header[key.strip()] = value.strip()
        elif line and not line.startswith("#"):
            sections[current].append(line)
    return header, sections


def apptainer_args() -> dict[str, str]:
    return dict(ln.split("=", 1) for ln in apptainer()[1]["arguments"])


def lock_pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "container" / "requirements.lock").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^\s=;]+)", line)
            assert m, f"lock line {line!r} is not an exact name==version pin"
            pins[canonicalize_name(m[1])] = m[2]
    return pins


def installed_by_script() -> dict[str, str]:
    """container/install.sh's `install SRC/<rel> <dest>` lines: image path -> repo path."""
    text = (REPO / "container" / "install.sh").read_text()
    return {dest: rel for rel, dest in re.findall(r'install -m \d+ "\$src/([^"]+)" (\S+)', text)}


def install_calls(text: str) -> list[list[str]]:
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", r"{{\1}}", text)  # Apptainer's {{ ARG }} as one word
    return [shlex.split(m) for m in re.findall(r"sh (/\S+/container/install\.sh [^\n&]+)", text)]


def docker_context_entries() -> set[str]:
    """Top-level names .dockerignore lets into the build context (an allow-list)."""
    lines = [ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()]
    assert "*" in lines, ".dockerignore should be an allow-list starting with *"
    return {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}


# ---- the same muongen and the same pins in both images -------------------------------------
def test_both_images_run_the_same_install_script_on_the_same_checkout():
    run = " ".join(a for op, a in dockerfile() if op == "RUN")
    post = "\n".join(apptainer()[1]["post"])
    d_calls = install_calls(run)
    (a_call,) = install_calls(post)
    for call in [*d_calls, a_call]:
        assert call[0] == f"{SRC}/container/install.sh"
        assert call[2] == SRC
    # variant: a build argument with the same default in both
    assert {c[1] for c in d_calls} == {"${VARIANT}"} and a_call[1] == "{{VARIANT}}"
    assert docker_args()["VARIANT"] == apptainer_args()["VARIANT"] == "cuda"
    # Docker: dependencies, then the package (two layers); Apptainer: both in one go
    assert [c[3:] for c in d_calls] == [["deps"], ["package"]]
    assert a_call[3:] in ([], ["all"])


def test_dependency_layer_comes_before_the_sources():
    # The big layer (torch and the pins) sees only the lock and the install script, so a
    # change to the code rebuilds only the small layer after `COPY . /opt/muongen/`.
    ops = dockerfile()
    copies = [i for i, (op, _) in enumerate(ops) if op == "COPY"]
    first, whole = copies[0], copies[-1]
    assert ops[first][1].split() == [
        "container/install.sh",
        "container/requirements.lock",
        f"{SRC}/container/",
    ]
    assert ops[whole][1].split() == [".", f"{SRC}/"]
    runs = {i: a for i, (op, a) in enumerate(ops) if op == "RUN"}
    deps = next(i for i, a in runs.items() if "install.sh" in a and " deps" in a)
    package = next(i for i, a in runs.items() if "install.sh" in a and " package" in a)
    assert first < deps < whole < package
    # build arguments that change with every build come after both installs
    for name in ("VCS_REF", "BUILD_DATE", "MUONGEN_VERSION"):
        (at,) = [i for i, (op, a) in enumerate(ops) if op == "ARG" and a.startswith(name)]
        assert at > package, f"ARG {name} before the install layers invalidates their cache"


def test_build_arguments_for_the_package_sources():
    args = docker_args()
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    for name in ("TORCH_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CERT"):
        assert args[name] == "", f"{name} should default to empty (unset)"


def test_both_images_copy_the_same_files_from_the_checkout():
    copies = [a.split() for op, a in dockerfile() if op == "COPY"]
    assert [".", f"{SRC}/"] in [[c[0], c[-1]] for c in copies]
    files = [ln.split() for ln in apptainer()[1]["files"]]
    assert all(dest == f"{SRC}/{src}" for src, dest in files), files
    sources = {src for src, _ in files}
    allowed = {e for e in docker_context_entries() if not e.endswith("*")}
    assert sources == allowed
    for src in sources:
        assert (REPO / src).exists(), f"{src} is copied into the images but missing"
    # what pip needs to build muongen
    assert {"pyproject.toml", "README.md", "muongen", "container"} <= sources


def test_install_script_uses_the_lock_and_installs_muongen_without_resolving():
    text = (REPO / "container" / "install.sh").read_text()
    assert "lock=$src/container/requirements.lock" in text
    assert 'pip install --no-cache-dir -r "$lock"' in text
    assert 'pip install --no-cache-dir --no-deps --no-build-isolation "$src"' in text
    assert '"torch==$torch_pin+cpu"' in text  # the CPU wheel of the pinned version
    assert "MUONGEN_LOCK=$lock muongen doctor" in text  # the build checks the result


def test_base_images_carry_the_pinned_torch():
    torch = lock_pins()["torch"]
    cuda_image = docker_args()["CUDA_IMAGE"]
    assert cuda_image == apptainer_args()["BASE_IMAGE"]
    assert apptainer()[0] == {"Bootstrap": "docker", "From": "{{ BASE_IMAGE }}"}
    m = re.fullmatch(r"pytorch/pytorch:(\d+\.\d+\.\d+)-cuda[\d.]+-cudnn\d+-runtime", cuda_image)
    assert m and m[1] == torch, f"{cuda_image} does not carry torch {torch}"
    assert re.fullmatch(r"python:3\.\d+-slim(-\w+)?", docker_args()["CPU_IMAGE"])


def test_image_version_labels_match_the_package():
    assert docker_args()["MUONGEN_VERSION"] == apptainer_args()["MUONGEN_VERSION"]
    assert docker_args()["MUONGEN_VERSION"] == muongen.__version__
    labels = docker_one("LABEL")
    for key in ("title", "version", "revision", "created", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels
    assert any("org.opencontainers.image.version" in ln for ln in apptainer()[1]["labels"])


# ---- the pins -----------------------------------------------------------------------
def pyproject_requirements() -> list[Requirement]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return [Requirement(r) for r in data["project"]["dependencies"]]


def test_pins_satisfy_pyproject_ranges():
    pins = lock_pins()
    for req in pyproject_requirements():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} (pyproject) is not pinned in container/requirements.lock"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"lock pins {name}=={pins[name]}, outside pyproject's {req}"
        )


def test_lock_is_closed_where_this_environment_can_tell():
    # For every pinned package installed here at the pinned version, its own runtime
    # requirements must be pinned too, at versions it accepts (a forgotten regeneration
    # after adding a dependency shows up here).
    pins = lock_pins()
    checked = 0
    for name, version in pins.items():
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        if Version(dist.version).public != version:
            continue
        checked += 1
        for raw in dist.requires or []:
            req = Requirement(raw)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            dep = canonicalize_name(req.name)
            assert dep in pins, f"{name} needs {req}, which the lock does not pin"
            assert req.specifier.contains(pins[dep], prereleases=True), (
                f"{name} needs {req}, the lock pins {dep}=={pins[dep]}"
            )
    if checked == 0:
        pytest.skip("no pinned version is installed here")


# ---- what the images run exists ---------------------------------------------------------
def muongen_argv_parses(argv: list[str]) -> None:
    """`muongen VERB ...` as the images call it: the console script exists, VERB is a verb
    and its options parse."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts.get(argv[0]) == "muongen.cli:main"
    assert argv[1] in VERBS
    args = build_parser({argv[1]: VERBS[argv[1]]}).parse_args(argv[1:])
    assert isinstance(args, argparse.Namespace)


def repo_path_of(image_path: str) -> Path:
    """A file in the image -> the repository file it comes from."""
    rel = installed_by_script().get(image_path)
    if rel is None and image_path.startswith(f"{SRC}/"):
        rel = image_path[len(SRC) + 1 :]
    assert rel is not None, f"{image_path} is neither installed by install.sh nor under {SRC}"
    top = rel.split("/")[0]
    assert top in docker_context_entries(), f"{rel} is left out of the docker build context"
    assert any(ln.split()[0] == top for ln in apptainer()[1]["files"]), f"{rel} not in %files"
    return REPO / rel


def test_entrypoint_and_runscript_point_at_the_repo_entrypoint():
    (entry,) = json.loads(docker_one("ENTRYPOINT"))
    source = repo_path_of(entry)
    assert source == REPO / "container" / "entrypoint.sh"
    assert source.is_file() and source.stat().st_mode & 0o111, "entrypoint must be executable"
    assert apptainer()[1]["runscript"] == [f'exec {entry} "$@"']
    assert json.loads(docker_one("CMD")) == ["--help"]


def test_healthcheck_and_test_section_run_a_real_self_check():
    health = docker_one("HEALTHCHECK")
    assert "--interval=" in health and "--timeout=" in health
    argv = json.loads(health.split("CMD", 1)[1])
    assert argv == ["muongen", "doctor", "--quick"]
    muongen_argv_parses(argv)


def test_apptainer_test_section_runs_the_paths_the_smoke_test_runs():
    # %test: `muongen doctor` through the entrypoint (what %runscript and docker run use),
    # then the grid node's wrapper, as container/smoke.sh runs them in the Docker image.
    (test_cmd,) = apptainer()[1]["test"]
    first, second = (shlex.split(part) for part in test_cmd.split("&&"))
    (entry,) = json.loads(docker_one("ENTRYPOINT"))
    assert first[0] == entry
    muongen_argv_parses(["muongen", *first[1:]])
    assert second[:2] == [f"{SRC}/jobs/node.sh", "--help"]
    node = repo_path_of(second[0])
    assert node.stat().st_mode & 0o111, "jobs/node.sh must be executable"
    smoke = (REPO / "container" / "smoke.sh").read_text()
    assert f"{SRC}/jobs/node.sh" in smoke
    assert re.search(r"\bdoctor\b", smoke)


def test_environment_and_user():
    env = docker_one("ENV")
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in env
    assert "HOME=/home/muongen" in env
    environment = "\n".join(apptainer()[1]["environment"])
    assert "expandable_segments:True" in environment
    assert f". {SRC}/container/env.sh" in environment
    assert (REPO / "container" / "env.sh").is_file()
    user = [a for op, a in dockerfile() if op == "USER"][-1]
    assert user.split(":")[0] not in ("root", "0")
