"""benchmarks/bundle_shape.py: a corner's muons split into the bundles' scale and their
shape are the numbers they claim, and the script runs on a checkpoint and a held-out file."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def bundle_shape(load_script):
    return load_script("benchmarks/bundle_shape.py")


def _sample(conditions, energies, counts):
    from muongen.evaluate.features import EventSample

    energies = np.asarray(energies, dtype=np.float64)
    muons = np.column_stack([energies, np.full(len(energies), 10.0), np.zeros(len(energies))])
    return EventSample.from_arrays(np.asarray(conditions, dtype=np.float64), muons, counts)


def test_scale_is_each_bundles_mean_and_shape_the_rest(bundle_shape):
    # bundles of 2 muons (10, 1000 GeV: mean log10 E 2) and 3 (100 GeV each: 2), one empty
    cond = [[1e7, 0.0, 1.0, 1500.0], [1e7, 0.0, 1.0, 1500.0], [1e7, 0.0, 1.0, 1500.0]]
    sample = _sample(cond, [10.0, 1000.0, 100.0, 100.0, 100.0], np.array([2, 0, 3]))
    parts = bundle_shape.parts(sample, "log10_energy")
    assert parts["scale"] == pytest.approx([2.0, 2.0])
    assert parts["shape"] == pytest.approx([-1.0, 1.0, 0.0, 0.0, 0.0])
    assert parts["pooled"] == pytest.approx([1.0, 3.0, 2.0, 2.0, 2.0])


def test_the_corner_takes_the_primary_energy_and_the_own_count(bundle_shape):
    cond = [[1e6, 0, 1, 1500], [2e7, 0, 1, 1500], [2e7, 0, 1, 1500], [1e8, 0, 1, 1500]]
    sample = _sample(cond, np.full(10 + 3 + 10 + 10, 100.0), np.array([10, 3, 10, 10]))
    picked = bundle_shape.corner(sample, (1e7, 1e8), (10, 99))
    assert picked.tolist() == [False, False, True, False]


def test_noise_of_identical_halves_is_zero(bundle_shape):
    # every shower alike: any two halves have the same quantiles
    cond = np.array([[1e7 + i, 0.0, 1.0, 1500.0] for i in range(8)])
    sample = _sample(cond, np.tile([10.0, 100.0], 8), np.full(8, 2))
    spread = bundle_shape.noise(
        sample, lambda s: np.ones(s.n_events, bool), "log10_energy", np.random.default_rng(1)
    )
    assert set(spread) == {"pooled", "scale", "shape"}
    assert all(np.allclose(v, 0.0) for v in spread.values())


def test_the_script_prints_the_three_parts_for_each_draw(
    bundle_shape, tiny_checkpoint, held_out, capsys
):
    argv = ["--checkpoint", str(tiny_checkpoint), "--data", str(held_out)]
    assert (
        bundle_shape.main([*argv, "--energy", "1,1e12", "--muons", "1,1000", "--seeds", "0,1"]) == 0
    )
    text = capsys.readouterr().out
    for part in ("pooled (every muon)", "scale (each bundle's mean)", "shape (each muon minus"):
        assert part in text
    assert text.count(f"{tiny_checkpoint} s0 - sim") == 3
    assert text.count(f"{tiny_checkpoint} s1 - sim") == 3
    with pytest.raises(SystemExit):  # a corner with no held-out event is named, not printed
        bundle_shape.main([*argv, "--energy", "1e20,1e21"])
    assert "no held-out event" in capsys.readouterr().err


def test_the_quantiles_are_chosen_on_the_command_line(
    bundle_shape, tiny_checkpoint, held_out, capsys
):
    argv = ["--checkpoint", str(tiny_checkpoint), "--data", str(held_out)]
    argv += ["--energy", "1,1e12", "--muons", "1,1000"]
    assert bundle_shape.main([*argv, "--quantiles", "0.001,0.5,0.999"]) == 0
    header = capsys.readouterr().out.split("pooled (every muon): quantile\n")[1].splitlines()[0]
    assert header.split() == ["0.001", "0.5", "0.999"]
    with pytest.raises(SystemExit):
        bundle_shape.main([*argv, "--quantiles", "0.5,1"])
    assert "each must lie between 0 and 1" in capsys.readouterr().err
