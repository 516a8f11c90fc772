"""The run's figures: one PNG per panel under RUN_DIR/plots/ and `summary.png` with every panel, drawn during the
run (`LivePlots`, called after every step) and at the end. What each panel shows is rl/report/panels.py.

Steps are integers on every x axis; steps whose optimizer step was skipped are shaded. Rendering uses
matplotlib's object API (no pyplot state), so it is safe to call from any thread of the driver.
"""

from __future__ import annotations

import math
import threading
import time
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

    ax.set_title(panel.title, fontsize=10)
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


def _figure(panels: list[Panel], rows: list[dict], ncols: int, title: str | None, dpi: int):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(4.6 * ncols, 3.1 * nrows + (0.3 if title else 0)), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False).flatten()
    skipped = [int(r["step"]) for r in rows if r.get("skipped")]
    max_step = max([int(r.get("step", 0)) for r in rows] + [1])
    for ax, panel in zip(axes, panels):
        _tidy(panel)
        _draw(ax, panel, skipped, max_step)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig, axes[: len(panels)]


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
    fig, axes = _figure(panels, rows, 3, title, dpi)
    fig.canvas.draw()  # one drawing; the panels' files are crops of it
    pixels = np.asarray(fig.canvas.buffer_rgba())[..., :3]
    written = [_save(pixels, out / SUMMARY)]
    renderer, height = fig.canvas.get_renderer(), pixels.shape[0]
    pad = 6
    for panel, ax in zip(panels, axes):
        boxes = [a.get_tightbbox(renderer) for a in (ax, getattr(ax, "_fbrl_right", None)) if a is not None]
        x0, y0 = min(b.x0 for b in boxes), min(b.y0 for b in boxes)
        x1, y1 = max(b.x1 for b in boxes), max(b.y1 for b in boxes)
        crop = pixels[max(0, int(height - y1) - pad) : int(height - y0) + pad, max(0, int(x0) - pad) : int(x1) + pad]
        written.append(_save(crop, out / f"{panel.name}.png"))
    return written


def _save(pixels, path: Path) -> Path:
    from PIL import Image

    tmp = path.with_name(f".{path.stem}.tmp.png")
    Image.fromarray(pixels).save(tmp, optimize=True)
    tmp.replace(path)
    return path


class LivePlots:
    """Keeps RUN_DIR/plots current while a run goes. `update(metrics)` after each step asks for a redraw after an
    eval step, or when `every_s` seconds have passed and at most a tenth of the time since went to drawing (a slow
    machine draws less often); the drawing runs in a background thread, so the loop never waits for it (the
    driver mostly waits on its workers). `close()` draws the final state and returns the files.

    A drawing that fails (a metric the panels did not expect) is reported through `log` (once while running, again
    by `close()`) and never stops the run."""

    def __init__(self, run_dir, title: str | None = None, every_s: float = 30.0, log=print):
        self.run_dir, self.title, self.every_s, self.log = run_dir, title, every_s, log
        self.last_t = time.perf_counter()
        self.cost_s = 0.0
        self.written: list[Path] = []
        self.error: Exception | None = None
        self._wanted = threading.Event()
        self._stop = False
        self._lock = threading.Lock()  # one drawing at a time (the thread's, or close()'s)
        self._thread: threading.Thread | None = None

    def update(self, metrics: dict | None = None) -> None:
        due = time.perf_counter() - self.last_t >= max(self.every_s, 10 * self.cost_s)
        if due or (metrics or {}).get("eval_accuracy") is not None:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="fbrl-plots", daemon=True)
                self._thread.start()
            self._wanted.set()

    def _loop(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            if self._stop:
                return
            self._draw()

    def _draw(self) -> None:
        with self._lock:
            t0 = time.perf_counter()
            try:
                self.written = render(self.run_dir.read_metrics(), self.run_dir.path / "plots", self.title)
            except Exception as e:  # never stop training for a figure
                if self.error is None:
                    self.log(f"plots: drawing failed ({type(e).__name__}: {e}); training goes on")
                self.error = e
            self.cost_s = time.perf_counter() - t0
            self.last_t = time.perf_counter()

    def close(self) -> list[Path]:
        if self._thread is not None:
            self._stop = True
            self._wanted.set()
            self._thread.join()
        self.error = None
        self._draw()
        return [] if self.error is not None else self.written
