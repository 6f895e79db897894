"""Grid specs, generation in batches, and sampled files read back by the data reader."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from muongen import schema
from muongen.cli import main
from muongen.data.formats import detect_format
from muongen.data.reader import read_events
from muongen.errors import ConfigError
from muongen.evaluate.sample import generate, parse_grid, read_inputs, write_sample


def test_grid_spec_example():
    cond = parse_grid("energy=1e5:1e8:4,zenith=0:1.2:3,mass=1,4,56,depth=1500,2500,count=100")
    assert cond.shape == (4 * 3 * 3 * 2 * 100, 4)
    assert np.unique(cond[:, 0]) == pytest.approx([1e5, 1e6, 1e7, 1e8])  # log-spaced
    assert np.unique(cond[:, 1]) == pytest.approx([0.0, 0.6, 1.2])  # linear
    assert np.unique(cond[:, 2]).tolist() == [1.0, 4.0, 56.0]
    assert np.unique(cond[:, 3]).tolist() == [1500.0, 2500.0]
    # each grid point repeated `count` times, one after another
    assert np.all(cond[:100] == cond[0]) and not np.all(cond[100] == cond[0])


def test_grid_spec_single_values_and_default_count():
    cond = parse_grid(" energy=1e6 , zenith=0.3, mass=4, depth=2000")
    assert cond.tolist() == [[1e6, 0.3, 4.0, 2000.0]]


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("energy=1e5:1e8:4,zenith=0,mass=1", "missing depth"),
        ("energy=1e6,zenith=0,mass=1,depth=1000,colour=3", "unknown key"),
        ("energy=1e6,zenith=0,mass=1,depth=1000,count=0", "count must be >= 1"),
        ("energy=1e6:1e7,zenith=0,mass=1,depth=1000", "start:stop:n"),
        ("energy=0:1e7:3,zenith=0,mass=1,depth=1000", "> 0"),
        ("energy=1e6,zenith=0,mass=0.5,depth=1000", "mass"),
        ("energy=1e6,zenith=4,mass=1,depth=1000", "zenith"),
        ("1e6,zenith=0,mass=1,depth=1000", "before any key"),
        ("energy=1e6,,zenith=0,mass=1,depth=1000", "empty item"),
        ("energy=1e6,zenith=0,mass=1,depth=1000,energy=1e7", "twice"),
        ("energy=x,zenith=0,mass=1,depth=1000", "numbers"),
    ],
)
def test_grid_spec_errors_name_the_problem(spec, why):
    with pytest.raises(ConfigError, match=why):
        parse_grid(spec)


def test_generate_is_seeded_batched_and_leaves_global_state_alone(tiny_generator):
    cond = parse_grid("energy=1e5:1e8:3,zenith=0:1:2,mass=1,56,depth=1500,count=10")
    tiny_generator.train()
    state = torch.get_rng_state()
    a = generate(tiny_generator, cond, batch_events=7, seed=3)
    b = generate(tiny_generator, cond, batch_events=1000, seed=3)
    c = generate(tiny_generator, cond, batch_events=1000, seed=4)
    assert torch.equal(torch.get_rng_state(), state)  # training RNG untouched
    assert tiny_generator.training  # mode restored
    assert a.n_events == len(cond) and a.counts.tolist() == [3] * len(cond)
    assert torch.equal(a.conditions, torch.as_tensor(cond, dtype=torch.float32))
    assert a.muons.shape == (3 * len(cond), 3) and torch.all(a.muons[:, 0] > 0)
    assert torch.equal(b.muons, generate(tiny_generator, cond, batch_events=1000, seed=3).muons)
    assert not torch.equal(b.muons, c.muons)


@pytest.mark.parametrize(
    ("name", "fmt"),
    [("v1", schema.FORMAT_V1), ("v2", schema.FORMAT_V2), ("hdf5", schema.FORMAT_HDF5)],
)
def test_sample_round_trips_through_the_reader(tmp_path, tiny_generator, name, fmt):
    cond = parse_grid("energy=1e6:1e8:3,zenith=0:1:2,mass=1,depth=1500,2500,count=5")
    batch = generate(tiny_generator, cond, seed=0)
    out = tmp_path / f"s.{'h5' if name == 'hdf5' else 'parquet'}"
    write_sample(str(out), batch, name, seed=9)
    assert detect_format(str(out)) == fmt
    back = read_events(str(out))
    assert torch.equal(back.counts, batch.counts)
    assert torch.allclose(back.conditions, batch.conditions)
    assert torch.allclose(back.muons, batch.muons, rtol=1e-5, atol=1e-4)
    if fmt == schema.FORMAT_V1:
        import pyarrow.parquet as pq

        t = pq.read_table(out)
        assert t.column("primary_major_id").to_pylist() == [9] * len(cond)
        assert t.column("primary_minor_id").to_pylist() == list(range(len(cond)))


def test_write_sample_rejects_unknown_formats(tmp_path, tiny_generator):
    batch = generate(tiny_generator, parse_grid("energy=1e6,zenith=0,mass=1,depth=1500"))
    with pytest.raises(ConfigError, match="format"):
        write_sample(str(tmp_path / "x"), batch, "v3")


def test_sample_cli_from_grid_and_from_primaries(tmp_path, tiny_checkpoint, held_out, capsys):
    out = tmp_path / "grid.parquet"
    grid = "energy=1e5:1e8:4,zenith=0:1.2:3,mass=1,4,56,depth=1500,2500,count=2"
    assert (
        main(
            [
                "sample",
                "--checkpoint",
                str(tiny_checkpoint),
                "--grid",
                grid,
                "--out",
                str(out),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "events/s" in printed and "muons/s" in printed
    assert read_events(str(out)).n_events == 4 * 3 * 3 * 2 * 2

    out2 = tmp_path / "from-file.h5"
    args = ["sample", "--checkpoint", str(tiny_checkpoint), "--primaries", str(held_out)]
    assert main([*args, "--out", str(out2), "--events", "50", "--batch", "16"]) == 0
    assert detect_format(str(out2)) == schema.FORMAT_HDF5  # from the .h5 name
    back = read_events(str(out2))
    assert torch.allclose(back.conditions, read_inputs([str(held_out)], 50).conditions)


def test_sample_cli_errors_are_user_errors(tmp_path, tiny_checkpoint, capsys):
    code = main(
        [
            "sample",
            "--checkpoint",
            str(tiny_checkpoint),
            "--grid",
            "energy=1",
            "--out",
            str(tmp_path / "x"),
        ]
    )
    assert code != 0 and "grid spec" in capsys.readouterr().err


def test_sample_cli_warns_when_bundles_hit_the_generator_cap(tmp_path, capsys):
    """A bundle cut at model.max_generated_muons is reported, never silently truncated."""
    from muongen import checkpoint
    from muongen.config import load_config

    from .conftest import TINY_MODEL, _tiny_generator

    cfg = load_config(None, [*TINY_MODEL, "model.max_generated_muons=2"])  # tiny makes ~3
    saved = checkpoint.save(
        {"config": cfg.to_dict(), "generator": _tiny_generator(cfg).state_dict()},
        tmp_path,
        "capped",
        step=1,
    )
    grid = "energy=1e6,zenith=0.5,mass=4,depth=2000,count=10"
    args = ["sample", "--checkpoint", str(saved.manifest), "--grid", grid]
    assert main([*args, "--out", str(tmp_path / "g.parquet"), "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "10 of 10 bundles reached the generator's cap of 2 muons" in err
