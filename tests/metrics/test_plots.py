import struct

import pytest

from grpoplus.metrics.plots import PANELS, draw_run, draw_runs, panel_keys, write_compare
from grpoplus.metrics.series import Trace
from grpoplus.metrics.style import MAX_STYLES, line_widths, metric_labels, metric_styles, shorten

pytest.importorskip("matplotlib")

PANEL = {p.name: p for p in PANELS}


def _png_size(path):
    """(width, height) from the PNG header: the IHDR chunk starts at byte 16."""
    return struct.unpack(">II", path.read_bytes()[16:24])


def _lines(fig):
    """(colour, line style, marker) of every data line drawn on the figure's first axes."""
    from matplotlib.colors import to_hex

    ax = fig.axes[0]
    return [(to_hex(ln.get_color()), ln.get_linestyle(), ln.get_marker()) for ln in ax.get_lines()
            if len(ln.get_xdata())]


def test_metric_styles_never_repeat_up_to_the_limit():
    styles = metric_styles(MAX_STYLES)
    assert len(set(styles)) == MAX_STYLES == 52
    assert styles[0].linestyle == "-" and styles[0].marker is None  # the first metric: plain
    with pytest.raises(ValueError, match="at most 52"):
        metric_styles(53)


def test_later_lines_are_thinner():
    widths = line_widths(5)
    assert widths == sorted(widths, reverse=True) and len(set(widths)) == 5


def test_shorten_keeps_both_ends():
    text = "dapo_eps_high_0.3_lr_1e-6_warmup_20_seed_1234567"
    cut = shorten(text + "_extra_long_tail", 20)
    assert len(cut) == 20 and cut.startswith("dapo_eps_h") and cut.endswith("long_tail")
    assert shorten("short", 20) == "short"


def test_compare_gives_every_line_its_own_look(traces):
    runs = [Trace(traces.healthy(seed=s)) for s in range(5)]
    fig = draw_runs(runs, [f"run{i}" for i in range(5)], PANEL["reward"], None)
    lines = _lines(fig)
    # 5 runs x (reward/mean, reward/accuracy, eval/accuracy, eval/pass@4)
    assert len(lines) == 20 and len(set(lines)) == 20
    # colour = run: each run's 4 lines share one colour; style = metric: 4 distinct styles
    assert len({c for c, _, _ in lines}) == 5 and len({(s, m) for _, s, m in lines}) == 4


def test_coinciding_metrics_stay_visible(traces):
    records = traces.healthy()
    assert all(r["reward/accuracy"] == r["reward/mean"] for r in records)
    fig = draw_run(Trace(records), PANEL["reward"], None)
    mean, accuracy = fig.axes[0].get_lines()[:2]
    # the second line is drawn over the first: thinner, dashed, with markers
    assert accuracy.get_linewidth() < mean.get_linewidth()
    assert accuracy.get_marker() not in (None, "None") and accuracy.get_linestyle() == "--"


def test_legend_sits_below_the_axes(traces):
    fig = draw_runs([Trace(traces.healthy(seed=s)) for s in range(3)], ["a", "b", "c"],
                    PANEL["length"], None)
    fig.canvas.draw()
    ax = fig.axes[0]
    axes_box = ax.get_window_extent()
    legends = [a for a in ax.get_children() if type(a).__name__ == "Legend"]
    assert len(legends) == 2  # runs, metrics
    for legend in legends:
        box = legend.get_window_extent()
        assert box.y1 < axes_box.y0 and box.x1 <= fig.get_figwidth() * fig.dpi + 1


def test_figures_stay_narrow_with_many_long_labelled_runs(traces, tmp_path):
    records = traces.healthy()
    for r in records:  # ten reward components: a crowded metric legend
        r.update({f"reward/component_with_a_long_name_{i}/mean": 0.1 * i for i in range(10)})
    labels = [f"run_{i}: " + "algo.eps_high=0.28 rollout.temperature=0.7 " * 4 for i in range(8)]
    written = write_compare([records] * 8, labels, tmp_path, descriptions=labels)
    assert len(written) >= 10
    for png in written:
        width, height = _png_size(png)
        assert width <= 1200 and height <= 1200, (png.name, width, height)
    assert "rollout.temperature=0.7" in (tmp_path / "index.html").read_text()  # full text on the page


def test_entropy_percentiles_have_their_own_log_panel(traces):
    records = traces.healthy()
    for r in records:  # the low tail collapses from 1e-2 to 1e-5 while the mean stays ~1
        r["policy/entropy_p10"] = 1e-2 * 10 ** (-3 * r["step"] / 59)
    trace = Trace(records)
    assert panel_keys(PANEL["entropy"], trace) == ["policy/entropy_mean"]
    fig = draw_run(trace, PANEL["entropy_tail"], None)
    assert fig.axes[0].get_yscale() == "log"


def _moe_trace(traces, layers=12):
    records = traces.healthy(n=30)
    for r in records:
        r["moe/routing_mismatch"] = 0.05
        r["moe/load_max_frac"] = 0.2
        r.update({f"moe/routing_mismatch/layer{i}": 0.01 * i for i in range(layers)})
    return Trace(records)


def test_moe_layers_are_a_heat_map_in_layer_order(traces):
    trace = _moe_trace(traces)
    keys = panel_keys(PANEL["moe_layers"], trace)
    assert keys[:3] == ["moe/routing_mismatch/layer0", "moe/routing_mismatch/layer1",
                        "moe/routing_mismatch/layer2"] and keys[-1].endswith("layer11")
    assert panel_keys(PANEL["moe"], trace) == ["moe/routing_mismatch", "moe/load_max_frac"]
    fig = draw_run(trace, PANEL["moe_layers"], None)
    (mesh,) = [c for c in fig.axes[0].collections if type(c).__name__ == "QuadMesh"]
    grid = mesh.get_array().reshape(12, 30)  # [layers, steps]
    assert grid[11, 0] == pytest.approx(0.11) and grid[0, 0] == 0.0
    compare = draw_runs([trace, trace], ["a", "b"], PANEL["moe_layers"], None)
    meshes = [ax for ax in compare.axes if ax.get_label() != "<colorbar>" and ax.collections]
    assert len(meshes) == 2  # one heat map per run, one shared colour bar


def test_async_panels_appear_only_when_logged(traces, tmp_path):
    records = traces.healthy(n=20)
    assert draw_run(Trace(records), PANEL["async_staleness"], None) is None
    for r in records:
        r.update({"async/staleness_mean": 0.8, "async/staleness_max": 2.0,
                  "async/sampler_busy_frac": 0.9, "async/learner_busy_frac": 0.6})
    trace = Trace(records)
    assert panel_keys(PANEL["async_busy"], trace) == ["async/learner_busy_frac",
                                                      "async/sampler_busy_frac"]
    assert len(_lines(draw_run(trace, PANEL["async_staleness"], None))) == 2


def test_metric_labels_move_shared_path_parts_into_the_title():
    assert metric_labels(["reward/task/mean", "reward/format/mean"]) == (
        "reward/…/mean", ["task", "format"])
    assert metric_labels(["time/step_s", "time/rollout_s"]) == ("time/…", ["step_s", "rollout_s"])
    assert metric_labels(["reward/mean", "eval/accuracy"]) == ("", ["reward/mean", "eval/accuracy"])
    assert metric_labels(["policy/entropy_mean"]) == ("", ["policy/entropy_mean"])
