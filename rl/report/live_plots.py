"""RUN_DIR/plots kept current while a run goes, drawn by a process of its own at the lowest CPU priority.

A drawing is seconds of matplotlib. Drawn in the driver, it took a core from the workers: on two cores a step
with a drawing beside it ran two to three times longer. The drawing process, like an experiment tracker's,
runs beside the job at `nice 19`, so it draws with what the workers leave. It ends when the driver closes
its stdin, or when the driver dies (the pipe closes with it).

    plots = LivePlots(run_dir, title, log=print)
    plots.update(metrics)   # after each step: asks for a drawing when one is due
    plots.finish()          # the final drawing starts (the rest of the teardown runs beside it)
    written = plots.wait()  # ... and its files; close() is both

A drawing that fails (a metric the panels did not expect) is reported through `log`, once while running and
again at the end, and never stops the run. So is a drawing process that ended early.

`python -m rl.report.live_plots RUN_DIR [TITLE]` is the drawing process: a line `draw` on stdin draws
RUN_DIR/metrics.jsonl into RUN_DIR/plots and answers one JSON line (`written`, `error`, `cost_s`); `close`
draws the final state unless nothing was logged since the last drawing, then the process exits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

FINAL_DRAWING_S = 300.0  # the longest the end of a job waits for its final drawing


class LivePlots:
    def __init__(self, run_dir, title: str | None = None, every_s: float = 30.0, log=print):
        self.run_dir, self.title, self.every_s, self.log = run_dir, title, every_s, log
        self.last_t = time.perf_counter()
        self.cost_s = 0.0
        self.written: list[Path] = []
        self.error: str | None = None  # the last drawing's failure
        self._reported = False
        self._pending = False  # a drawing asked for and not answered yet
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def update(self, metrics: dict | None = None) -> None:
        """A drawing after an eval step, or when `every_s` seconds have passed and at most a tenth of the time
        since went to drawing (a slow machine draws less often); never a second one while one is pending."""
        due = time.perf_counter() - self.last_t >= max(self.every_s, 10 * self.cost_s)
        if (due or (metrics or {}).get("eval_accuracy") is not None) and not self._pending:
            self._pending = self._send("draw")

    def finish(self) -> None:
        """Ask for the final drawing; `wait()` returns its files."""
        if self._proc is not None:
            self._send("close")
            try:
                self._proc.stdin.close()
            except OSError:
                pass

    def wait(self) -> list[Path]:
        """The files of the final drawing ([] when it failed; the failure is reported)."""
        if self._proc is None:  # nothing was drawn while running (e.g. a run that ended before its first step)
            self._answer(draw(Path(self.run_dir.path), self.title or None))
        else:
            self._reader.join(FINAL_DRAWING_S)
            if self._reader.is_alive():  # a drawing never holds the job: it is stopped, the earlier files stand
                self._reported = True  # said below, as what it is (not as a process that died)
                self._proc.kill()
                self._reader.join()
                self.error = f"the final drawing took over {FINAL_DRAWING_S:.0f} s and was stopped"
        if self.error is not None:
            self.log(f"plots: drawing failed ({self.error})")
            return []
        return self.written

    def close(self) -> list[Path]:
        self.finish()
        return self.wait()

    def _send(self, command: str) -> bool:
        if self._proc is None:
            self._start()
        try:
            self._proc.stdin.write(command + "\n")
            self._proc.stdin.flush()
            return True
        except (OSError, ValueError):  # the process has ended: its reader records why
            return False

    def _start(self) -> None:
        argv = drawing_argv(Path(self.run_dir.path), self.title)
        # its own process group, so a Ctrl-C at the terminal goes to the driver only (which ends the drawing by
        # closing stdin); not its own session, which would give it a scheduling group (autogroup) of its own whose
        # share of the CPU does not yield to the workers whatever its nice value
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            process_group=0,
            env={**os.environ, "PYTHONPATH": _import_root(os.environ.get("PYTHONPATH"))},
        )
        self._reader = threading.Thread(target=self._read, name="fbrl-plots", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            try:
                self._answer(json.loads(line))
            except json.JSONDecodeError:
                continue
        code = self._proc.wait()
        if code != 0:
            self._answer({"error": f"the drawing process ended with exit code {code}"})
        self._pending = False

    def _answer(self, reply: dict) -> None:
        if reply.get("written") is not None:
            self.written = [Path(p) for p in reply["written"]]
        self.error = reply.get("error")
        self.cost_s = reply.get("cost_s", self.cost_s)
        self.last_t = time.perf_counter()
        self._pending = False
        if self.error is not None and not self._reported:
            self._reported = True
            self.log(f"plots: drawing failed ({self.error}); training goes on")


def drawing_argv(run_path: Path, title: str | None) -> list[str]:
    return [sys.executable, "-m", "rl.report.live_plots", str(run_path), title or ""]


def _import_root(pythonpath: str | None) -> str:
    """PYTHONPATH with the directory fbrl is imported from first, so the drawing process runs this same code."""
    root = str(Path(__file__).resolve().parents[2])
    return os.pathsep.join([root] + ([pythonpath] if pythonpath else []))


def rows_so_far(path: Path) -> list[dict]:
    """metrics.jsonl's rows; a line being appended right now (not JSON yet) is left for the next drawing."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def draw(run_path: Path, title: str | None) -> dict:
    """One drawing of RUN_DIR's metrics: the reply the drawing process sends."""
    from rl.report.plots import render

    t0 = time.perf_counter()
    try:
        written = render(rows_so_far(run_path / "metrics.jsonl"), run_path / "plots", title)
        reply = {"written": [str(p) for p in written], "error": None}
    except Exception as e:  # never stop training for a figure
        reply = {"written": None, "error": f"{type(e).__name__}: {e}"}
    return reply | {"cost_s": time.perf_counter() - t0}


def drawing_process(argv: list[str]) -> None:
    run_path, title = Path(argv[0]), (argv[1] if len(argv) > 1 else "") or None
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 19)  # what the workers leave; raising one's own nice is always allowed
    except (AttributeError, OSError):
        pass
    metrics, drawn_from = run_path / "metrics.jsonl", None
    for line in sys.stdin:
        command = line.strip()
        state = metrics.stat().st_mtime_ns if metrics.exists() else None
        if command == "close" and drawn_from is not None and state == drawn_from[0]:
            reply = drawn_from[1]  # the last drawing is of the final state already
        elif command in ("draw", "close"):
            reply = draw(run_path, title)
            drawn_from = (state, reply)
        else:
            continue
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    drawing_process(sys.argv[1:])
