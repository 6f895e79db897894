"""`sample` (file, grid, flux) and `evaluate` check their outputs before they compute, and
count the primaries outside the checkpoint's training domain (muongen.outputs,
muongen.domain). Each case failed on the code before: a traceback (rc 1), a silently
overwritten input, or no word about extrapolation."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from muongen import checkpoint
from muongen import domain as D
from muongen.cli import main
from muongen.config import load_config
from muongen.data.reader import read_events

from .conftest import TINY_MODEL, _tiny_generator

GRID = "energy=1e5:1e7:3,zenith=0:0.9:2,mass=1,4,depth=1500,count=2"  # inside the domain


@pytest.fixture(scope="module")
def domain_checkpoint(tmp_path_factory):
    """The tiny generator saved with a training domain: E 1e5-1e8 GeV, zenith 0-60 deg,
    A 1-56, depth 1000-2800 m (as the trainer records it)."""
    rng = np.random.default_rng(1)
    n = 5000
    cond = np.column_stack(
        [
            10 ** rng.uniform(5, 8, n),
            np.arccos(rng.uniform(0.5, 1.0, n)),
            rng.choice([1.0, 4.0, 14.0, 56.0], n),
            rng.uniform(1000, 2800, n),
        ]
    )
    cfg = load_config(None, TINY_MODEL)
    state = {
        "config": cfg.to_dict(),
        "generator": _tiny_generator(cfg).state_dict(),
        "domain": D.observe(cond),
    }
    out = tmp_path_factory.mktemp("domain-ckpt")
    return checkpoint.save(state, out, "dom", step=9).manifest


def sample(ckpt, *args):
    return main(["sample", "--checkpoint", str(ckpt), "--device", "cpu", *args])


def test_sample_refuses_to_overwrite_an_input(tmp_path, tiny_checkpoint, held_out, capsys):
    data = tmp_path / "held.parquet"
    shutil.copy(held_out, data)
    before = data.read_bytes()
    code = sample(tiny_checkpoint, "--primaries", str(data), "--out", str(data), "--events", "1")
    err = capsys.readouterr().err
    assert code == 2 and "is one of the inputs" in err and "Traceback" not in err
    assert data.read_bytes() == before  # the held-out file is untouched
    # not even with --overwrite, and not the checkpoint's own files either
    assert sample(tiny_checkpoint, "--primaries", str(data), "--out", str(data), "--overwrite") == 2
    pt = tiny_checkpoint.with_suffix(".pt")
    assert sample(tiny_checkpoint, "--grid", GRID, "--out", str(pt), "--overwrite") == 2
    assert "is one of the inputs" in capsys.readouterr().err


def test_sample_refuses_an_existing_file_unless_overwrite(tmp_path, tiny_checkpoint, capsys):
    out = tmp_path / "s.parquet"
    out.write_bytes(b"mine")
    assert sample(tiny_checkpoint, "--grid", GRID, "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert f"--out {out} exists; pass --overwrite" in err and out.read_bytes() == b"mine"
    assert sample(tiny_checkpoint, "--grid", GRID, "--out", str(out), "--overwrite") == 0
    assert read_events(str(out)).n_events == 3 * 2 * 2 * 2


@pytest.mark.parametrize(
    ("name", "extra", "says"),
    [
        ("x.h5", ["--format", "v1"], "the suffix .h5 names a hdf5 file"),
        ("x.parquet", ["--format", "hdf5"], "the suffix .parquet names a parquet file"),
        ("folder", [], "is a folder; give a file name"),
        ("file/x.parquet", [], "is a file, not a folder"),
    ],
)
def test_sample_output_errors_are_one_line(tmp_path, tiny_checkpoint, capsys, name, extra, says):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("a file")
    code = sample(tiny_checkpoint, "--grid", GRID, "--out", str(tmp_path / name), *extra)
    err = capsys.readouterr().err.strip()
    assert code == 2 and says in err
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x.h5").exists() and not (tmp_path / "x.parquet").exists()


def test_sample_into_an_unwritable_place_fails_before_generating(tiny_checkpoint, capsys):
    # /sys refuses new files even to root (tests may run as root, where chmod does not bite)
    code = sample(tiny_checkpoint, "--grid", GRID, "--out", "/sys/muongen-x.parquet")
    captured = capsys.readouterr()
    assert code == 2 and "cannot write --out /sys/muongen-x.parquet" in captured.err
    assert "generated" not in captured.out  # refused before any work


def test_sample_flux_checks_its_report_folder(tmp_path, tiny_checkpoint, capsys):
    report = tmp_path / "rep"
    report.write_text("a file where the report folder goes")
    args = ["--flux", "H3a", "--showers", "10", "--energy", "1e5:1e7", "--zenith", "0:60"]
    code = sample(
        tiny_checkpoint, *args, "--out", str(tmp_path / "f.parquet"), "--report", str(report)
    )
    assert code == 2 and f"--report {report} is a file" in capsys.readouterr().err
    assert not (tmp_path / "f.parquet").exists()


def test_sample_events_zero_names_the_problem(tiny_checkpoint, held_out, tmp_path, capsys):
    code = sample(
        tiny_checkpoint,
        "--primaries",
        str(held_out),
        "--out",
        str(tmp_path / "x.parquet"),
        "--events",
        "0",
    )
    assert code == 2 and "--events 0: give at least 1" in capsys.readouterr().err


def test_sample_counts_primaries_outside_the_domain(tmp_path, domain_checkpoint, capsys):
    inside = "energy=1e5:1e7:3,zenith=0:0.9:2,mass=1,4,depth=1500,count=2"
    assert sample(domain_checkpoint, "--grid", inside, "--out", str(tmp_path / "a.parquet")) == 0
    assert "training domain" not in capsys.readouterr().err  # inside: nothing to say
    # 1e4 and 1e9 GeV are outside (1e5-1e8 trained), as is zenith 1.4 rad (80 deg)
    grid = "energy=1e4,1e6,1e9,zenith=0.2,1.4,mass=4,depth=2000"
    assert sample(domain_checkpoint, "--grid", grid, "--out", str(tmp_path / "b.parquet")) == 0
    err = capsys.readouterr().err
    assert "warning: 5 of 6 primaries (83.3%) lie outside the checkpoint's training domain" in err
    assert "energy 4" in err and "zenith 3" in err
    code = sample(
        domain_checkpoint,
        "--grid",
        grid,
        "--out",
        str(tmp_path / "c.parquet"),
        "--domain",
        "strict",
    )
    captured = capsys.readouterr()
    assert code == 2 and "5 of 6 primaries" in captured.err and "--domain warn" in captured.err
    assert not (tmp_path / "c.parquet").exists() and "generated" not in captured.out


def test_a_checkpoint_without_a_domain_says_so_once_and_goes_on(tmp_path, tiny_checkpoint, capsys):
    assert (
        sample(
            tiny_checkpoint,
            "--grid",
            GRID,
            "--out",
            str(tmp_path / "a.parquet"),
            "--domain",
            "strict",
        )
        == 0
    )
    err = capsys.readouterr().err
    assert err.count("records no training domain") == 1


def test_flux_reports_the_weight_outside_the_domain(tmp_path, domain_checkpoint, capsys):
    """The README's old flux example's ranges (1e4-1e9 GeV, 0-85 deg) on a model trained on
    1e5-1e8 GeV and 0-60 deg: the line gives the rows and the fraction of the weight, and
    flux.json and the energy figure mark the region."""
    out = tmp_path / "flux.parquet"
    args = ["--flux", "H3a", "--showers", "300", "--energy", "1e4:1e9", "--zenith", "0:85"]
    assert sample(domain_checkpoint, *args, "--out", str(out)) == 0
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if "training domain" in x)
    assert line.startswith("warning: ") and "of the total weight" in line
    info = json.loads((tmp_path / "flux-report" / "flux.json").read_text())["training_domain"]
    assert info["known"] and 0 < info["outside"] < 300 and 0 < info["weight_fraction"] < 1
    assert f"{info['weight_fraction']:.1%} of the total weight" in line
    frac = [f for f in info["weight_fraction_outside_by_energy"] if f is not None]
    assert frac[0] == 1.0  # 1e4 GeV: never trained (an E^-2 draw rarely passes 1e8 GeV)
    assert min(frac) < 1.0


def test_evaluate_checks_its_folder_before_it_computes(tmp_path, tiny_checkpoint, held_out, capsys):
    argv = ["evaluate", "--checkpoint", str(tiny_checkpoint), "--data", str(held_out)]
    argv += ["--n-splits", "2", "--device", "cpu"]
    afile = tmp_path / "a-file"
    afile.write_text("x")
    assert main([*argv, "--out", str(afile)]) == 2
    err = capsys.readouterr().err
    assert f"--out {afile} is a file, but a folder is written there" in err
    assert "Traceback" not in err
    assert main([*argv, "--out", "/sys/muongen-eval"]) == 2
    assert "cannot write --out /sys/muongen-eval" in capsys.readouterr().err
    out = tmp_path / "e"
    out.mkdir()
    (out / "metrics.json").write_text("{}")  # an earlier evaluation
    assert main([*argv, "--out", str(out)]) == 2
    assert "already holds metrics.json; pass --overwrite" in capsys.readouterr().err
    assert (out / "metrics.json").read_text() == "{}"


def test_evaluate_counts_held_out_primaries_outside_the_domain(
    tmp_path, domain_checkpoint, held_out, capsys
):
    """The held-out toy events span zenith 0-1.2 rad (to 69 deg): beyond the 60 deg trained."""
    argv = ["evaluate", "--checkpoint", str(domain_checkpoint), "--data", str(held_out)]
    argv += ["--n-splits", "2", "--device", "cpu", "--out", str(tmp_path / "e")]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "held-out primaries" in err and "lie outside the checkpoint's training domain" in err
    metrics = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert metrics["training_domain"]["outside"] > 0
    assert main([*argv, "--overwrite", "--domain", "strict"]) == 2
    assert "use --domain warn" in capsys.readouterr().err
    assert os.path.exists(tmp_path / "e" / "metrics.json")
