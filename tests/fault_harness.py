"""What tests/test_faults.py drives real jobs with and measures them by: the demo config shortened, the
prompts an uninterrupted job draws (by digest), the processes a job left, and the words its fault table is made of."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT

CONFIG = ROOT / "configs" / "tiny.yaml"
SMALL = [
    "train.prompts_per_step=8",
    "rollout.n_samples_per_prompt=4",
    "train.eval_every=0",
    "logging.progress=false",
    "logging.wandb_mode=disabled",
    "learner.micro_batch_size=16",
    "learner.num_workers=2",
    "learner.zero_stage=2",  # a group of ranks: what a lost rank takes down
    "rollout.engine=vllm",
]  # the engine a real model's job runs (the tiny default decodes with torch)
ENV = dict(WANDB_MODE="offline", VLLM_ENABLE_V1_MULTIPROCESSING="0", TOKENIZERS_PARALLELISM="false")


# ---- helpers ----------------------------------------------------------------------------------------------------
def digest(prompts: list[str]) -> str:
    """The loop's `prompts_digest` of one step."""
    return hashlib.sha256("\x00".join(prompts).encode()).hexdigest()[:16]


def expected_digests(cfg, steps: int) -> list[str]:
    """The prompts an uninterrupted job draws at steps 1..steps: the sampler's own sequence over the rows the
    loop keeps (over-long prompts dropped)."""
    from rl.data.loaders import PromptSampler, load_task_split
    from rl.data.prompts import PromptFitter, prompt_token_limit
    from rl.data.tokenizer import load_tokenizer

    fitter = PromptFitter(load_tokenizer(cfg.model.path), prompt_token_limit(cfg), cfg.data.overlong_prompts)
    rows, _ = fitter.fit(load_task_split(cfg.data, "train"), "train")
    sampler = PromptSampler(rows, seed=cfg.train.seed)
    return [digest([r["prompt"] for r in sampler.next(cfg.train.prompts_per_step)]) for _ in range(steps)]


def metrics_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        return open(f"/proc/{pid}/stat").read().split()[2] != "Z"
    except OSError:
        return False


def marked_processes(mark: str) -> list[tuple[int, str]]:
    """Processes that carry FBRL_TEST_MARK=mark in their environment: the driver and everything it started (Ray's
    own processes, the actors, the reward pool's workers) inherit it."""
    out = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            if f"FBRL_TEST_MARK={mark}".encode() in environ and alive(pid):
                out.append((pid, open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()[:80]))
        except OSError:
            pass
    return out


def wait_for(predicate, timeout: float, what: str, poll: float = 0.2):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def write_jsonl_task(path: Path, n: int, long_prompts: int = 1) -> list[str]:
    """n arithmetic rows plus `long_prompts` prompts longer than the engine's context; returns the long ones."""
    from rl.data import arith
    from rl.data.jsonl import write_jsonl

    rows = [
        {"prompt": r["prompt"], "answer": r["answer"]} for r in arith.generate("train", n, seed=0, difficulties=(1, 2))
    ]
    long = [f"Q: {'1+' * 200}1=? Put the answer in \\boxed{{}}.\nA:" for _ in range(long_prompts)]
    write_jsonl(rows[: n // 2] + [{"prompt": p, "answer": "201"} for p in long] + rows[n // 2 :], path)
    return long


def check_checkpoints(run_dir: Path, latest: int, steps: list[int]) -> None:
    root = run_dir / "checkpoints"
    assert (root / "latest").read_text().strip() == f"step_{latest:06d}"
    for s in steps:
        state = json.loads((root / f"step_{s:06d}" / "trainer_state.json").read_text())
        assert state["step"] == s and (root / f"step_{s:06d}" / "learner" / "model" / "model.safetensors").is_file()
    assert not list(root.glob(".tmp-*")), "a half-written checkpoint was left behind"


# ---- what a test measured, in the words of docs/RELIABILITY.md's table ---------------------------------------------
def steps_lost(steps: list[int], in_flight: int | None = None) -> str:
    """Completed steps that ran again, from the sequence of steps completed (a step run twice appears twice), and
    the step that was in flight when the fault hit, if it had to start over."""
    again = sorted(s for s in set(steps) if steps.count(s) > 1)
    lost = [f"{len(again)} completed (step {', '.join(map(str, again))}, run again)"] if again else []
    if in_flight is not None:
        lost.append(f"step {in_flight} in flight (started over)")
    return " + ".join(lost) or "0"


def quoted(message: str, limit: int = 240) -> str:
    """A message the job printed, as the table quotes it: its first line, cut at a word before `limit` chars."""
    line = message.strip().splitlines()[0].strip()
    if len(line) > limit:
        line = line[:limit].rsplit(" ", 1)[0] + " …"
    return f"“{line}”"


def data_lost(rows: list[dict], want: list[str]) -> str:
    """Prompts skipped or trained twice, from metrics.jsonl's rows against the digests an uninterrupted run draws
    at steps 1..len(want)."""
    steps = [r["step"] for r in rows]
    twice = sorted(s for s in set(steps) if steps.count(s) > 1)
    missing = sorted(set(range(1, len(want) + 1)) - set(steps))
    differ = sorted({r["step"] for r in rows if r["step"] <= len(want) and r["prompts_digest"] != want[r["step"] - 1]})
    if not (twice or missing or differ):
        return f"none: steps 1-{len(want)} in metrics.jsonl once each, prompt digests equal an uninterrupted run's"
    return "; ".join(
        f"{what}: steps {xs}"
        for what, xs in (("logged twice", twice), ("never logged", missing), ("other prompts", differ))
        if xs
    )


def same_weights(rollout, learner) -> str:
    """The engine's weights against the learner's (vLLM's CPU-repacked weights summed in float64: equal up to the
    sum's rounding)."""
    same = rollout.weight_checksums() == pytest.approx(learner.weight_checksums(), rel=1e-12)
    return "equal to" if same else "different from"


def line_with(text: str, needle: str, tmp_path: Path) -> str:
    """The first output line containing `needle`, with the test's scratch directory shortened to `…`."""
    line = next(x for x in text.splitlines() if needle in x)
    return line.replace(str(tmp_path), "…").strip()


def descendants(pid: int) -> set[int]:
    """Live processes below `pid` (by parent links in /proc)."""
    children: dict[int, list[int]] = {}
    for p in (int(x) for x in os.listdir("/proc") if x.isdigit()):
        try:
            children.setdefault(int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1]), []).append(p)
        except (OSError, IndexError, ValueError):
            pass
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


# ---- the driver itself, as `fbrl train` in a subprocess ------------------------------------------------------------
def start_train(args: list[str], tmp_path: Path, mark: str, name: str, **env) -> subprocess.Popen:
    full_env = dict(os.environ, **ENV, FBRL_TEST_MARK=mark, PYTHONPATH=str(ROOT), **env)
    out = open(tmp_path / f"{name}.out", "w")
    return subprocess.Popen(
        [sys.executable, "-m", "actors.cli", "train", *args],
        cwd=ROOT,
        env=full_env,
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
    )


def output(tmp_path: Path, name: str) -> str:
    return (tmp_path / f"{name}.out").read_text()


def steps_logged(run_dir: Path) -> int:
    p = run_dir / "metrics.jsonl"
    return max((r["step"] for r in metrics_of(run_dir)), default=0) if p.exists() else 0


OUR_ACTORS = ("ray::RolloutActor", "ray::EngineHost", "ray::RankActor", "ray::RewardHost", "multiprocessing")


def no_processes_left(mark: str, timeout: float = 15, only: tuple[str, ...] | None = None) -> float:
    """Wait until no process of the job (or none whose command line starts with one of `only`) is alive; returns
    the seconds that took. Fails, killing them, after `timeout`."""
    t0 = time.monotonic()

    def left():
        return [(p, c) for p, c in marked_processes(mark) if only is None or any(o in c for o in only)]

    try:
        wait_for(lambda: not left(), timeout, "every process of the job to exit")
    except AssertionError:
        procs = left()
        for pid, _ in procs:
            os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"processes left after the job: {procs}") from None
    return time.monotonic() - t0


# ---- a job driven from the test's own process, and what a test records ------------------------------------------
class Job:
    """One training job on the real stack, driven from this process (so faults can be timed to a call)."""

    made: list[Job] = []  # the jobs of the running test, in order (`fault_record` reads the first one's facts)

    def __init__(self, run_dir: Path, *overrides: str):
        from actors.placement import build_workers
        from rl.config import load_config
        from rl.data.tokenizer import load_tokenizer
        from rl.train.faults import FaultLog

        for k, v in ENV.items():
            os.environ.setdefault(k, v)
        self.run_dir = run_dir
        self.cfg = load_config(CONFIG, [*SMALL, f"train.run_dir={run_dir}", *overrides])
        self.lines: list[str] = []
        self.line_times: list[float] = []  # time.monotonic() of each line
        self.fault_at: float | None = None  # when the injected kill was sent
        self.stopped_at: float | None = None  # when the loop raised its stop
        self.exit_code: int | None = None  # what `fbrl train` would exit with: 0 returned, 3 stopped
        self.faults = FaultLog(self.log)
        self.rollout, self.learner, self.rewards = build_workers(self.cfg, True, self.faults)
        self.tokenizer = load_tokenizer(self.cfg.model.path)
        self.seen: list[dict] = []  # every completed step's metrics, in order (steps run again appear twice)
        self.kills: list[tuple[str, int, int]] = []  # (method, step, pid)
        self.after_step: list = []  # callbacks run in the loop's thread once a step is logged: f(metrics)
        Job.made.append(self)

    def log(self, line: str) -> None:
        self.lines.append(line)
        self.line_times.append(time.monotonic())
        print(line, flush=True)

    def sigkill(self, pid: int) -> None:
        self.fault_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)

    def detected_s(self) -> float | None:
        """Seconds from the injected kill to the job's first word about it (a `fault:` line, or the stop)."""
        if self.fault_at is None:
            return None
        told = [t for t, line in zip(self.line_times, self.lines) if line.startswith("fault:")]
        told += [self.stopped_at] if self.stopped_at is not None else []
        return min((t - self.fault_at for t in told if t >= self.fault_at), default=None)

    def kill_during(self, owner, method: str, step: int, pid_of, delay_s: float = 0.05) -> None:
        """SIGKILL the process `pid_of()` names `delay_s` after `owner.method` is first called in step `step`
        (the call is then in flight: the kill lands mid-generate / mid-update / mid-score)."""
        original = getattr(owner, method)

        def wrapped(*args, **kwargs):
            if not self.kills and len(self.seen) == step - 1:
                pid = pid_of()
                self.kills.append((method, step, pid))
                threading.Timer(delay_s, self.sigkill, (pid,)).start()
            return original(*args, **kwargs)

        setattr(owner, method, wrapped)

    def train(self, **overrides):
        from rl.loop import train
        from rl.train.faults import RunStopped
        from rl.train.run_dir import RunDir

        cfg = self.cfg
        if overrides:
            from dataclasses import replace

            cfg = replace(cfg, train=replace(cfg.train, **overrides))
        try:
            summary = train(
                cfg,
                self.tokenizer,
                self.rollout,
                self.learner,
                self.rewards,
                RunDir(str(self.run_dir)),
                log=self.log,
                progress=self._progress,
                faults=self.faults,
            )
        except RunStopped:
            self.exit_code, self.stopped_at = 3, time.monotonic()
            raise
        self.exit_code = 0
        return summary

    def _progress(self, metrics: dict) -> None:
        self.seen.append(metrics)
        for f in self.after_step:
            f(metrics)

    def kill_after(self, step: int, pid_of, what: str = "rollout actor") -> None:
        """SIGKILL the process `pid_of()` names once step `step` is logged (first time only), and wait until it is
        gone before the loop goes on: at max_staleness >= 1 the next batch is then already made and queued."""

        def kill(metrics):
            if metrics["step"] == step and not self.kills:
                pid = pid_of()
                self.kills.append((f"after step {step}", step, pid))
                self.sigkill(pid)
                wait_for(lambda: not alive(pid), 30, f"the {what} (pid {pid}) to exit")

        self.after_step.append(kill)

    def fault_lines(self) -> list[str]:
        return [x for x in self.lines if x.startswith("fault:")]


@pytest.fixture
def job(tmp_path):
    import ray

    Job.made.clear()

    def make(*overrides, name="run"):
        return Job(tmp_path / name, *overrides)

    try:
        yield make
    finally:
        ray.shutdown()


# ---- what each test measured, for docs/RELIABILITY.md's table (tools/reliability_table.py) ------------------------
def run_facts(run_dir: Path) -> dict:
    """What a row states about the faulted run from its own directory: `train.max_staleness`, the weight transport
    (`auto` is the file on one machine), and whether metrics.jsonl holds every step once."""
    import yaml

    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    transport = cfg["rollout"]["weight_sync"]
    steps = [r["step"] for r in metrics_of(run_dir)]
    twice = sorted(s for s in set(steps) if steps.count(s) > 1)
    missing = sorted(set(range(1, max(steps, default=0) + 1)) - set(steps))
    once = f"yes (steps 1-{max(steps)})" if steps and not (twice or missing) else "no"
    once += f"; twice: {twice}" if twice else ""
    once += f"; missing: {missing}" if missing else ""
    return {
        "staleness": cfg["train"]["max_staleness"],
        "transport": "file (auto, one machine)" if transport == "auto" else transport,
        "rows_once": once,
    }


@pytest.fixture
def fault_record(request):
    """`record(fault=..., outcome=..., steps_lost=..., data_lost=..., [run_dir=, exit_code=, detected_s=,
    matrix=])`, called at the end of a test (after its assertions: only a passed test records). A test driving a
    `Job` gets `run_dir`, `exit_code` and `detected_s` from its first job unless it gives them; `matrix` names the
    cell kind of the transport x staleness table (tools/reliability_table.py). With FBRL_FAULT_TABLE=PATH, appends
    one JSON line to PATH with the test's name, CI or slow, and its wall seconds (setup to teardown: Ray's shutdown
    and both runs included)."""
    t0, fields = time.monotonic(), {}
    Job.made.clear()
    yield fields.update
    path = os.environ.get("FBRL_FAULT_TABLE")
    if path and fields:
        first = Job.made[0] if Job.made else None
        run_dir = fields.pop("run_dir", None) or (first and first.run_dir)
        if first is not None:
            fields.setdefault("exit_code", first.exit_code)
            detected = first.detected_s()
            fields.setdefault("detected_s", round(detected, 1) if detected is not None else None)
        kind = "slow" if request.node.get_closest_marker("slow") else "CI"
        record = {"test": request.node.name, "kind": kind, "wall_s": round(time.monotonic() - t0, 1)}
        with open(path, "a") as f:
            f.write(json.dumps({**record, **run_facts(Path(run_dir)), **fields}) + "\n")
