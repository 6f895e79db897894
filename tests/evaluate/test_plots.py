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
            rax.get_ylabel() == "ratio" and rax.get_xlabel() == plots.LABELS[name.split("_", 1)[1]]
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
