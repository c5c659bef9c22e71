"""analysis.plots on the committed H200 record: every plot drawn, in the shared palette."""

import matplotlib
import pytest

matplotlib.use("Agg")

from analysis.compare import compare, per_config, read_measured  # noqa: E402
from analysis.notebook_data import data_path  # noqa: E402
from analysis.plots import plot_all  # noqa: E402
from flashsim.plot import COLORS, THEOREM2_LABEL  # noqa: E402


@pytest.mark.xdist_group("h200_record")  # shares the process memo of the same computation
def test_plot_all_on_the_h200_record(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    rows, _ = read_measured(data_path("h200"))
    configs = per_config(compare(rows, "h200"))
    drawn = {}
    save = matplotlib.figure.Figure.savefig

    def keep(fig, path, *a, **k):  # look at each figure's lines before it is closed
        drawn[str(path).rsplit("/", 1)[-1]] = [(ln.get_label(), ln.get_color()) for ax in fig.axes
                                               for ln in ax.get_lines()]
        return save(fig, path, *a, **k)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    made = plot_all(configs, tmp_path)
    plt.close("all")
    assert sorted(p.name for p in made) == ["measured_vs_simulated.png", "n_sweep.png", "theorem2_m_sweep.png"]
    assert all(p.stat().st_size > 1000 for p in made)
    n_lines = dict(drawn["n_sweep.png"])
    # both algorithms of the N sweep, each in its palette colour (flash2 was once left out)
    assert n_lines["flash2 d=64, 64x32 measured"] == COLORS["flash2"]
    assert n_lines["standard d=64 simulated"] == COLORS["standard"]
    assert THEOREM2_LABEL in dict(drawn["theorem2_m_sweep.png"])
