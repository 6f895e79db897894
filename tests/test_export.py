"""`muongen export`: TorchScript and ONNX files that give what muongen's own sampler gives."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tiny import SMALL_MODEL as SMALL
from tiny import set_multiplicity

from muongen.cli import main
from muongen.config import load_config
from muongen.errors import MuongenError
from muongen.evaluate.sample import generate
from muongen.export import PhysicalGenerator, example_inputs, sampler_noise
from muongen.model import build_models


def _calibration_states(generator) -> tuple[dict, dict]:
    """An energy and a radius calibration (train.calibrate_rows) of ``generator`` onto
    "data" whose log energies are its own stretched by 1.3 and moved up by 0.2 dex, and
    whose log radii are its own moved out by 0.15 dex: every class it draws enough muons of
    is mapped, and the ceiling E0 / A holds some muons back."""
    from muongen import schema
    from muongen.model import calibration

    rng = np.random.default_rng(3)
    n = 6000
    cond = np.column_stack(
        [
            10 ** rng.uniform(4, 8, n),
            rng.uniform(0, 1.2, n),
            rng.choice([1.0, 4.0, 56.0], n),
            rng.uniform(1000, 2800, n),
        ]
    )
    drawn = generate(generator, torch.as_tensor(cond, dtype=torch.float32), seed=1)
    log_e0 = np.log10(cond[:, 0] / schema.ENERGY_SCALE_GEV)
    log_e = np.log10(drawn.muons[:, 0].double().numpy() / schema.ENERGY_SCALE_GEV)
    counts = drawn.counts.numpy()
    data = (log_e0, 1.3 * (log_e - log_e.mean()) + log_e.mean() + 0.2, counts)
    energy = calibration.fit(data, (log_e0, log_e, counts))
    xy = drawn.muons[:, 1:3].double().numpy() / schema.POSITION_SCALE_M
    log_r = np.log10(np.hypot(xy[:, 0], xy[:, 1]))
    cos_z = np.cos(cond[:, 1])
    radius = calibration.fit_radius(
        (cos_z, log_r + 0.15, counts, log_e0), (cos_z, log_r, counts, log_e0)
    )
    return energy, radius


def _checkpoint(tmp_path_factory, overrides: list[str], calibrated: bool = False):
    """A checkpoint of a small untrained generator whose multiplicity head says about
    5 muons per event (untrained weights would give none), written by the trainer's own
    checkpoint writer so that export loads it the way it loads a real one; ``calibrated``:
    with an energy and a radius calibration (train.calibrate_rows)."""
    from muongen import checkpoint

    cfg = load_config(None, SMALL + overrides)
    torch.manual_seed(0)
    generator, _ = build_models(cfg.model)
    with torch.no_grad():
        set_multiplicity(generator, 0.8)
        slant = [4.0] if generator.cond_norm.slant else []  # the slant depth, km
        generator.cond_norm.mean.copy_(torch.tensor([0.5, 0.7, 0.6, 1.9, *slant]))
        generator.cond_norm.std.copy_(torch.tensor([0.9, 0.2, 0.7, 0.5, *[3.0] * len(slant)]))
        if generator.polar_norm is not None:  # log r around e^-4 x 500 m = 9 m
            generator.polar_norm.mean.copy_(torch.tensor([0.2, -4.0]))
            generator.polar_norm.std.copy_(torch.tensor([0.6, 1.1]))
        if generator.energy_norm is not None:  # log10(E / (E0 / A)) around -2.5
            generator.energy_norm.mean.copy_(torch.tensor([-2.5]))
            generator.energy_norm.std.copy_(torch.tensor([0.8]))
        if generator.energy_scale is not None:  # widths that differ between events
            torch.nn.init.normal_(generator.energy_scale.weight, std=0.3)
            generator.energy_scale.bias.copy_(torch.tensor([0.2, 0.3]))
    payload = {"config": cfg.to_dict(), "generator": generator.state_dict()}
    if calibrated:
        payload["energy_calibration"], payload["radius_calibration"] = _calibration_states(
            generator
        )
        assert int(payload["energy_calibration"]["fitted"].sum()) >= 4
        assert int(payload["radius_calibration"]["fitted"].sum()) >= 4
    out = tmp_path_factory.mktemp("ckpt")
    saved = checkpoint.save(payload, out, "small", step=3)
    return saved.manifest


@pytest.fixture(
    scope="module",
    params=[
        "xy",
        "radial-fold",
        "xy-hurdle",
        "polar",
        "polar-hurdle2-slant-pernucleon-exp2-fold-cal",
        "xy-hurdle-escale",
        "xy-hurdle2-shared",
        "xy-hurdle-fold-cal",
    ],
)
def small_checkpoint(request, tmp_path_factory):
    """Small checkpoints in both muon representations (xy: rotated bundles; radial: drawn
    azimuths) with the lognormal multiplicity head, one with the hurdle head, and with the
    xy representation's polar head (log r and an azimuth per muon), once with the hurdle
    head's exact probabilities of 1 and 2 muons, the slant depth among the conditions and
    the energies measured from E0 / A (model.energy_reference) with two exponential
    per-muon noise inputs (model.local_exp_noise), once with the bundle's energy scale
    head (model.energy_scale_head), and
    the hurdle head with exact counts on one shared trunk (model.mult_trunk); three with
    the energies folded into the data's range (model.energy_fold), two of those (polar and
    xy) with an energy and a radius calibration (train.calibrate_rows): every noise input
    and every path of the heads is used."""
    param, cal = request.param.removesuffix("-cal"), request.param.endswith("-cal")
    param, fold = param.removesuffix("-fold"), param.endswith("-fold")
    param, scale = param.removesuffix("-escale"), param.endswith("-escale")
    param, exp = param.removesuffix("-exp2"), param.endswith("-exp2")
    param, pern = param.removesuffix("-pernucleon"), param.endswith("-pernucleon")
    param, shared = param.removesuffix("-shared"), param.endswith("-shared")
    param, slant = param.removesuffix("-slant"), param.endswith("-slant")
    representation, _, head = param.partition("-")
    exact = head.removeprefix("hurdle") if head.startswith("hurdle") else ""
    head = head.removesuffix(exact)
    overrides = [f"model.multiplicity={head or 'lognormal'}", f"model.mult_exact={exact or 0}"]
    overrides += [f"model.slant_depth={str(slant).lower()}"]
    overrides += [f"model.mult_trunk={'shared' if shared else 'separate'}"]
    overrides += [f"model.energy_reference={'per_nucleon' if pern else 'none'}"]
    overrides += [f"model.local_exp_noise={2 if exp else 0}"]
    overrides += [f"model.energy_scale_head={str(scale).lower()}"]
    overrides += [f"model.energy_fold={str(fold).lower()}"]
    if representation == "polar":
        overrides += ["model.lateral_head=polar"]
    else:
        overrides += [f"model.representation={representation}"]
    return _checkpoint(tmp_path_factory, overrides, calibrated=cal)


def _loaded(checkpoint):
    from muongen.inference import load_for_inference

    generator, _ = load_for_inference(checkpoint, "cpu")
    return generator, PhysicalGenerator(generator).eval()


@pytest.mark.parametrize("log_mult", [0.8, -0.3])  # ~5 muons per event; fewer muons than events
@torch.no_grad()
def test_physical_generator_replays_muongens_sampler(small_checkpoint, log_mult):
    generator, module = _loaded(small_checkpoint)
    set_multiplicity(generator, log_mult)  # (shared with the export's module)
    cond = example_inputs(module, 40)[0]
    stub = torch.zeros(1, module.z_local + 1)
    event, muon = sampler_noise(module, 40, 7, lambda ev: module(cond, ev, stub)[0])
    counts, muons = module(cond, event, muon)
    ref = generate(generator, cond, seed=7)
    n = int(counts.sum())
    assert n > 40 if log_mult > 0.5 else 0 < n < 40, n  # both of the generator's paths
    assert torch.equal(counts, ref.counts)
    torch.testing.assert_close(muons, ref.muons, rtol=1e-5, atol=1e-4)


@torch.no_grad()
def test_too_little_muon_noise_is_reused_and_counts_do_not_change(small_checkpoint):
    _, module = _loaded(small_checkpoint)
    cond, event, muon = example_inputs(module, 30, 500)
    counts, muons = module(cond, event, muon)
    n = int(counts.sum())
    few_counts, few_muons = module(cond, event, muon[:5])
    assert torch.equal(few_counts, counts) and few_muons.shape == (n, 3)
    assert not torch.allclose(few_muons, muons)  # rows 5.. used other noise
    torch.testing.assert_close(few_muons[:5], muons[:5])


def _export(checkpoint, fmt, out):
    assert main(["export", str(checkpoint), "--format", fmt, "--out", str(out)]) == 0
    assert out.stat().st_size > 1000


@torch.no_grad()
def test_torchscript_file_matches_for_any_batch_and_multiplicity(small_checkpoint, tmp_path):
    _, module = _loaded(small_checkpoint)
    out = tmp_path / "gen.pt"
    _export(small_checkpoint, "torchscript", out)
    extra = {"muongen.json": ""}
    loaded = torch.jit.load(str(out), _extra_files=extra)
    meta = json.loads(extra["muongen.json"])
    assert meta["z_global"] == "4" and meta["z_local"] == "3"
    for n_events, seed in ((1, 1), (37, 2), (300, 3)):  # not the traced example's size
        inputs = example_inputs(module, n_events, 4000, seed=seed)
        want = module(*inputs)
        got = loaded(*inputs)
        assert torch.equal(got[0], want[0])
        # 1e-4: a calibration's table, steep in its tails, can lift float32 rounding 10x
        torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_onnx_file_matches_in_onnxruntime(small_checkpoint, tmp_path):
    ort = pytest.importorskip("onnxruntime", reason="the export extra: pip install -e .[export]")
    import onnx

    generator, module = _loaded(small_checkpoint)
    out = tmp_path / "gen.onnx"
    _export(small_checkpoint, "onnx", out)
    props = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert props["representation"] == module.representation
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["conditions", "event_noise", "muon_noise"]
    cond = example_inputs(module, 120, 1, seed=5)[0]
    stub = torch.zeros(1, module.z_local + 1)
    event, muon = sampler_noise(module, 120, 11, lambda ev: module(cond, ev, stub)[0])
    counts, muons = session.run(
        None, {"conditions": cond.numpy(), "event_noise": event.numpy(), "muon_noise": muon.numpy()}
    )
    ref = generate(generator, cond, seed=11)  # muongen's own sampler, same seed
    np.testing.assert_array_equal(counts, ref.counts.numpy())
    np.testing.assert_allclose(muons, ref.muons.numpy(), rtol=1e-3, atol=1e-3)


@torch.no_grad()
def test_export_carries_the_ema_weights_when_the_checkpoint_has_them(tmp_path):
    from muongen import checkpoint
    from muongen.model.ema import STATE_VERSION

    cfg = load_config(None, SMALL)
    torch.manual_seed(0)
    trained, _ = build_models(cfg.model)
    averaged, _ = build_models(cfg.model)  # other weights: the stand-in average
    for g in (trained, averaged):
        set_multiplicity(g, 0.8)
    ema = {"version": STATE_VERSION, "updates": 5, "weights": averaged.state_dict()}
    payload = {"config": cfg.to_dict(), "generator": trained.state_dict(), "generator_ema": ema}
    saved = checkpoint.save(payload, tmp_path, "ema", step=5)
    out = tmp_path / "gen.pt"
    _export(saved.manifest, "torchscript", out)
    loaded = torch.jit.load(str(out))
    inputs = example_inputs(PhysicalGenerator(averaged), 50, 2000)
    want = PhysicalGenerator(averaged.eval())(*inputs)
    got = loaded(*inputs)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-4)
    other = PhysicalGenerator(trained.eval())(*inputs)
    assert not torch.equal(other[0], want[0]) or not torch.allclose(other[1], want[1])


def test_export_refuses_what_is_not_a_checkpoint(tmp_path):
    bad = tmp_path / "nothing.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(MuongenError):
        from muongen.export import export

        export(str(bad), "torchscript", tmp_path / "x.pt")
