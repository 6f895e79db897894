"""HEP-style evaluation plots: one figure per observable, ratio panels, units, legends."""

from __future__ import annotations

import numpy as np

from muongen.evaluate import plots
from muongen.evaluate.features import EVENT_OBSERVABLES, MUON_OBSERVABLES


def test_one_figure_per_observable_with_a_ratio_panel_and_legend(toy):
    real = toy(800, seed=0)
    model = toy(800, seed=1, conditions=real.conditions, shift=0.3)
    figs = plots.feature_figures(real, {"model": model})
    names = [f"muon_{n}" for n in MUON_OBSERVABLES] + [f"event_{n}" for n in EVENT_OBSERVABLES]
    assert list(figs) == names
    for name, fig in figs.items():
        ax, rax = fig.axes
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert legend == [plots.REAL_LABEL, "model"], name
        assert (
            rax.get_ylabel() == plots.RATIO_LABEL
            and rax.get_xlabel() == plots.LABELS[name.split("_", 1)[1]]
        )
        assert ax.get_yscale() == "log"
    assert figs["muon_radius"].axes[0].get_xscale() == "log"  # spans decades
    assert "[m]" in plots.LABELS["radius"] and "GeV" in plots.LABELS["log10_energy"]
    # the model's muon energies are shifted up by 0.3 dex: its ratio to the simulation
    # rises from below 1 on the left to above 1 on the right
    x, r = figs["muon_log10_energy"].axes[1].lines[0].get_xydata().T
    assert np.median(r[x < np.median(x)]) < 1 < np.median(r[x > np.median(x)])


def test_weighted_plots_have_units_and_legends():
    rng = np.random.default_rng(0)
    counts = rng.poisson(3, 500)
    weights = rng.uniform(0.5, 1.5, 500) * 1e-6
    fig = plots.weighted_multiplicity(counts, weights, 1500.0, "H3a")
    ax, _ = fig.axes
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert (
        len(ax.get_legend().get_texts()) == 2
        and "m$^{-2}$" in ax.get_legend().get_texts()[0].get_text()
    )
    edges = np.geomspace(1e4, 1e6, 5)
    fig = plots.weighted_energy_spectrum(
        10 ** rng.uniform(4, 6, 500), weights, edges, np.ones(4), "H3a"
    )
    assert "m$^{-2}$ s$^{-1}$" in fig.axes[0].get_ylabel() and "GeV" in fig.axes[1].get_xlabel()


def _render(fig) -> None:
    fig.canvas.draw()  # tick labels and the layout are resolved at draw time


def _labels(axis) -> list[str]:
    return [t.get_text() for t in axis.get_ticklabels(minor=False) if t.get_text()]


def test_ratio_axis_names_what_is_divided(toy):
    real = toy(600, seed=0)
    fig = plots.feature_figure("radius", real, {"model": toy(600, seed=1)})
    assert fig.axes[1].get_ylabel() == "model / simulation"
    fig = plots.multiplicity_vs_energy(real, {"model": toy(600, seed=1)})
    assert fig.axes[1].get_ylabel() == "model / simulation"


def test_log_ticks_read_as_plain_numbers():
    assert [plots.tick_text(v) for v in (0.01, 0.5, 1, 10, 1000)] == [
        "0.01",
        "0.5",
        "1",
        "10",
        "1000",
    ]
    assert plots.tick_text(1e5) == "$10^{5}$" and plots.tick_text(2e-4) == r"$2\times10^{-4}$"
    fig = plots.new_figure(8, 4)
    wide, middle, short = fig.subplots(1, 3)
    wide.loglog([0.1, 300], [0.1, 300])
    middle.semilogx([0.2, 30], [0, 1])  # two decades: 2 and 5 between the powers of ten
    middle.set_xlim(0.2, 30)
    short.semilogy([0, 1], [0.8, 4.0])  # less than a decade: minor ticks carry the labels
    _render(fig)

    def minor(axis):
        return [t.get_text() for t in axis.get_ticklabels(minor=True) if t.get_text()]

    assert {"0.1", "1", "10", "100"} <= set(_labels(wide.xaxis)) and not minor(wide.xaxis)
    assert {"0.2", "0.5", "2", "5", "20"} <= set(minor(middle.xaxis))
    assert not {"0.3", "3", "7"} & set(minor(middle.xaxis))
    assert {"2", "3"} <= set(minor(short.yaxis)) and not any(
        "times" in t for t in minor(short.yaxis)
    )


def test_a_generated_curve_that_ends_early_says_so(toy):
    real = toy(1500, seed=0)
    model = toy(1500, seed=1, conditions=real.conditions)
    edges = np.linspace(0, 10, 11)
    n_ref = np.full(10, 10)
    n = np.array([0, 3, 8, 9, 9, 9, 9, 0, 0, 0])
    assert plots.curve_end_notes(n, n_ref, edges, " m") == [
        (7.0, "none above 7 m (30.0% of simulated)"),
        (1.0, "none below 1 m (10.0% of simulated)"),
    ]
    assert plots.curve_end_notes(n_ref, n_ref, edges) == []  # nothing missing: no note
    # the model makes no muons beyond 5 m from the axis: its legend says where it ends
    cut = model.muon["radius"] < 5.0
    model.muon["radius"] = np.where(cut, model.muon["radius"], np.nan)
    fig = plots.feature_figure("radius", real, {"model": model})
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any(t.startswith("model: none above") and " m (" in t for t in legend), legend


def test_mass_groups_without_high_energy_primaries_are_named(toy):
    real = toy(1500, seed=0)
    conditions = real.conditions.copy()
    heavy = conditions[:, 2] == 56.0
    conditions[heavy, 0] = np.minimum(conditions[heavy, 0], 10**6)  # no iron above 1e6 GeV
    real = toy(1500, seed=0, conditions=conditions)
    model = toy(1500, seed=1, conditions=conditions)
    fig = plots.multiplicity_vs_energy(real, {"model": model})
    ax = fig.axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert [t for t in legend if "none above" in t] == ["A = 56: none above $10^{6.2}$ GeV"]
    assert "no generated events" in ax.get_legend().get_title().get_text()
    # model lines carry markers, so a bin between empty bins still shows
    assert all(line.get_marker() == "s" for line in ax.lines if line.get_linestyle() == "-")


def test_every_panel_with_lines_has_a_legend(toy):
    result = {
        "ratio_target": 3.0,
        "binned": {
            var: {
                "bins": [
                    {"lo": lo, "hi": lo + 1, "metrics": {"multiplicity": {"model_ratio": 2.0}}}
                    for lo in (0, 1, 2)
                ]
            }
            for var in ("log10_energy", "cos_zenith")
        },
    }
    fig = plots.binned_ratios(result)
    assert len(fig.legends) == 1  # one legend for both panels, above them
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "multiplicity" in texts and "floor" in texts
    real = toy(600, seed=0)
    fig = plots.by_depth(real, {"model": toy(600, seed=1)})
    assert all(ax.get_legend() is not None for ax in fig.axes)


def test_provenance_footer():
    meta = {
        "checkpoint": "/runs/demo/checkpoints/step-0000300.json",
        "step": 300,
        "data": ["/data/held/a.parquet", "/data/held/b.parquet", "/data/c", "/data/d"],
        "created": "2026-12-03T13:22:38+00:00",
        "muongen_version": "0.1.0",
    }
    text = plots.provenance(meta)
    assert text == (
        "checkpoint …/demo/checkpoints/step-0000300.json · step 300 · "
        "data …/held/a.parquet, …/held/b.parquet +2 more · 2026-12-03 13:22 UTC · muongen 0.1.0"
    )
    assert plots.provenance(None) == ""
    fig = plots.new_figure(6.5, 6)
    _, rax = plots.ratio_axes(fig)
    rax.set_xlabel("x")
    plots.add_footer(fig, text)
    _render(fig)
    (footer,) = fig.texts
    assert footer.get_text().replace("\n", " ") == text
    # the panels moved up: the footer does not run into the x label
    renderer = fig.canvas.get_renderer()
    label_box = rax.xaxis.label.get_window_extent(renderer)
    assert footer.get_window_extent(renderer).y1 <= label_box.y0 + 1
