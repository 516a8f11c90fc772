"""The run's figures: one PNG per panel under RUN_DIR/plots/ and `summary.png` with every panel, drawn during the
run and at the end (rl/report/live_plots.py). What each panel shows is rl/report/panels.py.

Steps are integers on every x axis; steps whose optimizer step was skipped are shaded. Rendering uses
matplotlib's object API (no pyplot state), so it is safe to call from any thread of the driver.
"""

from __future__ import annotations

import math
from pathlib import Path

from rl.report.panels import Panel, Series, build_panels

SUMMARY = "summary.png"
_PHASE_COLORS = {"rollout": "#4C72B0", "reward": "#DD8452", "learner": "#55A868", "sync": "#C44E52", "other": "#B0B0B0"}

# ---------------------------------------------------------------------------------------------- drawing


def _same(a: Series, b: Series) -> bool:
    return a.xs == b.xs and all(abs(x - y) <= 1e-12 for x, y in zip(a.ys, b.ys))


def _tidy(panel: Panel) -> None:
    """Say what the eye would miss: a series identical to an earlier one is merged into it ("reward = accuracy"),
    and one that is zero at every step says so in its label."""
    kept: list[Series] = []
    for s in panel.series:
        twin = next((k for k in kept if k.right == s.right and _same(k, s)), None)
        if twin is not None:
            twin.label = f"{twin.label} = {s.label}"
            continue
        kept.append(s)
    for s in kept:
        if not panel.stacked and not panel.log and all(y == 0 for y in s.ys):
            s.label += " (0 at every step)"
    panel.series = kept


def _rolling(ys: list[float], w: int) -> list[float]:
    return [sum(ys[max(0, i - w + 1) : i + 1]) / len(ys[max(0, i - w + 1) : i + 1]) for i in range(len(ys))]


def _draw(ax, panel: Panel, skipped: list[int], max_step: int) -> None:
    from matplotlib.ticker import MaxNLocator

    # the title at a given height: placed automatically, matplotlib measures every tick label of the axes on each
    # drawing to keep the title clear of them (there are none above an axes here)
    ax.set_title(panel.title, fontsize=10, y=1.0, pad=5)
    ax.set_xlabel("step", fontsize=9)
    ax.set_ylabel(panel.ylabel, fontsize=9)
    ax.tick_params(labelsize=8)
    for s in skipped:  # optimizer step skipped (no usable signal, non-finite loss)
        ax.axvspan(s - 0.5, s + 0.5, color="0.88", lw=0, zorder=0)
    handles = []
    if panel.stacked:
        bottom: dict[int, float] = {}
        for s in panel.series:
            handles.append(
                ax.bar(
                    s.xs,
                    s.ys,
                    bottom=[bottom.get(x, 0.0) for x in s.xs],
                    width=0.8,
                    label=s.label,
                    color=_PHASE_COLORS.get(s.label.split(" ")[0]),
                    linewidth=0,
                )
            )
            for x, y in zip(s.xs, s.ys):
                bottom[x] = bottom.get(x, 0.0) + y
        ax.set_ylim(0, 1.35 * max(bottom.values()))  # headroom for the legend
    lines = [s for s in panel.series if not panel.stacked]
    for i, s in enumerate(lines):
        target = ax
        if s.right:
            if not hasattr(ax, "_fbrl_right"):
                ax._fbrl_right = ax.twinx()
                ax._fbrl_right.tick_params(labelsize=8)
                ax._fbrl_right.set_ylabel(panel.right_label, fontsize=9)
            target = ax._fbrl_right
        color = f"C{i}"
        if panel.smooth and len(s.ys) >= 12:  # noisy per-step means: faint raw values, a rolling mean on top
            w = max(3, len(s.ys) // 8)
            target.plot(s.xs, s.ys, s.style, lw=0.8, alpha=0.35, color=color)
            handles += target.plot(
                s.xs, _rolling(s.ys, w), s.style, lw=1.8, color=color, label=f"{s.label} ({w}-step mean)"
            )
        else:
            handles += target.plot(s.xs, s.ys, s.style, marker=s.marker, ms=4, lw=1.4, color=color, label=s.label)
    if panel.log:
        ax.set_yscale("log")
    if panel.ylim:
        ax.set_ylim(*panel.ylim)
    for side, axis in (("left", ax), ("right", getattr(ax, "_fbrl_right", None))):
        values = [y for s in lines if s.right == (side == "right") for y in s.ys]
        if side in panel.shares and axis is not None and values and min(values) >= 0:
            top = max(values)  # from 0, and a flat 0 sits at the bottom instead of mid-panel
            axis.set_ylim(0, (1.7 if panel.legend_top else 1.15) * top if top > 0 else 1.0)
    ax.set_xlim(-0.5 if any(0 in s.xs for s in panel.series) else 0.5, max_step + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3, lw=0.5)
    if skipped:
        from matplotlib.patches import Patch

        handles.append(Patch(color="0.88", label="update skipped"))
    if handles:
        ax.legend(
            handles=handles,
            labels=[h.get_label() for h in handles],
            fontsize=7,
            framealpha=0.85,
            loc="upper center" if panel.stacked or panel.legend_top else "best",
            ncol=3 if panel.stacked else 2 if panel.legend_top else 1,
        )


# A fixed grid, in inches: each panel owns an equal cell, its axes inset by room for the title, the tick labels
# and the axis labels (a right axis, when the panel has one, gets its room too). matplotlib's constrained layout
# measured every text box on every drawing (two thirds of a render, seconds on two cores, taken from the
# workers while a run goes); with fixed cells each panel's file is a plain crop of its cell.
CELL_W, CELL_H, TITLE_H = 4.6, 3.1, 0.35
INSET_LEFT, INSET_RIGHT, INSET_RIGHT_AXIS, INSET_TOP, INSET_BOTTOM = 0.78, 0.15, 0.78, 0.32, 0.5


def _cells(n: int, ncols: int, title: str | None) -> list[tuple[float, float]]:
    """The top-left corner (inches from the figure's top-left) of each of `n` cells, row by row."""
    top = TITLE_H if title else 0.0
    return [((i % ncols) * CELL_W, top + (i // ncols) * CELL_H) for i in range(n)]


def _figure(panels: list[Panel], rows: list[dict], ncols: int, title: str | None, dpi: int):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    nrows = math.ceil(len(panels) / ncols)
    width, height = CELL_W * ncols, CELL_H * nrows + (TITLE_H if title else 0.0)
    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    skipped = [int(r["step"]) for r in rows if r.get("skipped")]
    max_step = max([int(r.get("step", 0)) for r in rows] + [1])
    axes = []
    for panel, (x, y) in zip(panels, _cells(len(panels), ncols, title)):
        right = INSET_RIGHT_AXIS if any(s.right for s in panel.series) else INSET_RIGHT
        w, h = CELL_W - INSET_LEFT - right, CELL_H - INSET_TOP - INSET_BOTTOM
        ax = fig.add_axes(((x + INSET_LEFT) / width, 1 - (y + CELL_H - INSET_BOTTOM) / height, w / width, h / height))
        _tidy(panel)
        _draw(ax, panel, skipped, max_step)
        axes.append(ax)
    if title:
        fig.suptitle(title, fontsize=11, y=1 - 0.5 * TITLE_H / height, va="center")
    return fig, axes


def render(rows: list[dict], out_dir: str | Path, title: str | None = None, dpi: int = 120) -> list[Path]:
    """Write `summary.png` (every panel, three columns) and one PNG per panel, cut from the same drawing, to
    `out_dir`; returns the paths, summary first. Nothing is written for rows without a training step. Each file
    is written under a temporary name and renamed, so a reader never sees half a PNG."""
    import numpy as np

    panels = build_panels(rows)
    if not panels:
        return []
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig, _ = _figure(panels, rows, 3, title, dpi)
    fig.canvas.draw()  # one drawing; the panels' files are crops of it
    pixels = np.asarray(fig.canvas.buffer_rgba())[..., :3]
    written = [_save(pixels, out / SUMMARY)]
    for panel, (x, y) in zip(panels, _cells(len(panels), 3, title)):
        crop = pixels[round(y * dpi) : round((y + CELL_H) * dpi), round(x * dpi) : round((x + CELL_W) * dpi)]
        written.append(_save(crop, out / f"{panel.name}.png"))
    return written


def _save(pixels, path: Path) -> Path:
    from PIL import Image

    tmp = path.with_name(f".{path.stem}.tmp.png")
    Image.fromarray(pixels).save(tmp, compress_level=3)  # 8x faster than optimize=True, 5 % larger
    tmp.replace(path)
    return path
