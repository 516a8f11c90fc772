"""Faults injected into real jobs, and what the job does about them (docs/RELIABILITY.md is built from these).

Real stack: local Ray, a vLLM CPU rollout engine, 2 DeepSpeed ZeRO-2 learner ranks, the math-verify reward actor;
the committed demo checkpoint and task (configs/tiny.yaml), shortened. A kill is a SIGKILL of the actor's process
(its pid from the actor). Each test asserts steps completed, steps lost, prompts repeated or skipped (by the digest
of each step's prompts against the sampler's own sequence) and that checkpoints are intact.

- In CI: a rollout actor killed mid-generate; a learner rank killed mid-update.
- Slow-marked (`make test-all`): a reward actor killed mid-score; the learner's restart bound; the driver killed
  and resumed; SIGTERM to the driver; the driver killed while writing a checkpoint; non-finite loss; a reward
  that fails on every row; a run that trains nothing.
- Bad input (no Ray, seconds): each is refused before anything starts, with a message naming it.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "tiny.yaml"
SMALL = ["train.prompts_per_step=8", "rollout.n_samples_per_prompt=4", "train.eval_every=0",
         "logging.progress=false", "logging.wandb_mode=disabled", "learner.micro_batch_size=16"]
ENV = dict(WANDB_MODE="offline", RAY_AUTH_MODE="disabled", VLLM_ENABLE_V1_MULTIPROCESSING="0",
           TOKENIZERS_PARALLELISM="false")


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
    from rl.data.loaders import write_jsonl
    rows = [{"prompt": r["prompt"], "answer": r["answer"]} for r in arith.generate("train", n, seed=0,
                                                                                     difficulties=(1, 2))]
    long = [f"Q: {'1+' * 200}1=? Put the answer in \\boxed{{}}.\nA:" for _ in range(long_prompts)]
    write_jsonl(rows[:n // 2] + [{"prompt": p, "answer": "201"} for p in long] + rows[n // 2:], path)
    return long


class Job:
    """One training job on the real stack, driven from this process (so faults can be timed to a call)."""

    def __init__(self, run_dir: Path, *overrides: str):
        from actors.placement import build_workers
        from rl.config import load_config
        from rl.data.tokenizer import load_tokenizer
        from rl.faults import FaultLog
        for k, v in ENV.items():
            os.environ.setdefault(k, v)
        self.run_dir = run_dir
        self.cfg = load_config(CONFIG, [*SMALL, f"train.run_dir={run_dir}", *overrides])
        self.lines: list[str] = []
        self.faults = FaultLog(self.log)
        self.rollout, self.learner, self.rewards = build_workers(self.cfg, True, self.faults)
        self.tokenizer = load_tokenizer(self.cfg.model.path)
        self.seen: list[dict] = []  # every completed step's metrics, in order (steps run again appear twice)
        self.kills: list[tuple[str, int, int]] = []  # (method, step, pid)

    def log(self, line: str) -> None:
        self.lines.append(line)
        print(line, flush=True)

    def kill_during(self, owner, method: str, step: int, pid_of, delay_s: float = 0.05) -> None:
        """SIGKILL the process `pid_of()` names `delay_s` after `owner.method` is first called in step `step`
        (the call is then in flight: the kill lands mid-generate / mid-update / mid-score)."""
        original = getattr(owner, method)

        def wrapped(*args, **kwargs):
            if not self.kills and len(self.seen) == step - 1:
                pid = pid_of()
                self.kills.append((method, step, pid))
                threading.Timer(delay_s, os.kill, (pid, signal.SIGKILL)).start()
            return original(*args, **kwargs)

        setattr(owner, method, wrapped)

    def train(self, **overrides):
        from rl.loop import train
        from rl.run import RunDir
        cfg = self.cfg
        if overrides:
            from dataclasses import replace
            cfg = replace(cfg, train=replace(cfg.train, **overrides))
        return train(cfg, self.tokenizer, self.rollout, self.learner, self.rewards, RunDir(str(self.run_dir)),
                     log=self.log, progress=self.seen.append, faults=self.faults)

    def fault_lines(self) -> list[str]:
        return [x for x in self.lines if x.startswith("fault:")]


@pytest.fixture
def job(tmp_path):
    import ray
    jobs = []

    def make(*overrides, name="run"):
        jobs.append(Job(tmp_path / name, *overrides))
        return jobs[-1]

    try:
        yield make
    finally:
        ray.shutdown()


def check_checkpoints(run_dir: Path, latest: int, steps: list[int]) -> None:
    root = run_dir / "checkpoints"
    assert (root / "latest").read_text().strip() == f"step_{latest:06d}"
    for s in steps:
        state = json.loads((root / f"step_{s:06d}" / "trainer_state.json").read_text())
        assert state["step"] == s and (root / f"step_{s:06d}" / "learner" / "model" / "model.safetensors").is_file()
    assert not list(root.glob(".tmp-*")), "a half-written checkpoint was left behind"


# ---- in CI: the two kills the issue names ------------------------------------------------------------------------
def test_rollout_actor_killed_mid_generate(job, tmp_path):
    """Step 2's generate loses its engine: a new actor takes the bundle, loads the current weights and version, and
    the request runs again. All steps complete, none is lost, no prompt is repeated or skipped, and the replay
    gap stays at float rounding after the replacement (the new engine holds the learner's weights; a stale one
    gives ~1e-2). The data set also holds a prompt longer than the engine's context: dropped at load, counted."""
    data = tmp_path / "train.jsonl"
    write_jsonl_task(data, 24)
    j = job("train.steps=4", "data.task=jsonl", f"data.train_path={data}", "train.checkpoint_every=4")
    j.kill_during(j.rollout, "generate", 2, lambda: j.rollout.pids()[0], delay_s=0.1)
    j.train()
    steps = [m["step"] for m in j.seen]
    assert steps == [1, 2, 3, 4]                                           # every step completed, none lost
    assert [m["prompts_digest"] for m in j.seen] == expected_digests(j.cfg, 4)   # none repeated or skipped
    assert all(m["samples"] == 32 for m in j.seen)                          # the re-issued chunk came back whole
    last = j.seen[-1]
    assert last["faults/rollout_restarts"] == 1 and "faults/learner_rebuilds" not in last
    assert last["faults/prompts_dropped"] == 1                              # the over-long prompt, at load
    (line,) = j.fault_lines()
    assert "rollout actor 0" in line and "during generate" in line, line
    killed = j.kills[0][2]
    assert not alive(killed) and j.rollout.pids()[0] != killed
    trained = [m for m in j.seen if not m["skipped"]]
    assert len(trained) >= 3
    assert max(m["logprob_mismatch_abs_mean"] for m in trained) < 1e-5  # same bound as test_e2e's replay run
    assert j.rollout.versions() == [last["policy_version"]]
    # vLLM's CPU-repacked weights, summed in float64: equal to the learner's up to the sum's rounding
    assert j.rollout.weight_checksums() == pytest.approx(j.learner.weight_checksums(), rel=1e-12)
    check_checkpoints(j.run_dir, 4, [4])


def test_learner_rank_killed_mid_update(job):
    """Rank 1 dies during step 4's update. The group is rebuilt inside the job, restored from the step-2
    checkpoint, and steps 3-5 run (again): step 3, completed once, is lost and repeated with the same prompts and
    - same weights, same seeds - the same rewards. metrics.jsonl ends with each step once; checkpoints intact."""
    j = job("train.steps=5", "train.checkpoint_every=2")
    old_pids = j.learner.pids()
    j.kill_during(j.learner, "update", 4, lambda: j.learner.pids()[1])
    j.train()
    assert [m["step"] for m in j.seen] == [1, 2, 3, 3, 4, 5]               # step 3 ran twice, then 4 and 5
    want = expected_digests(j.cfg, 5)
    assert [m["prompts_digest"] for m in j.seen] == [want[s - 1] for s in (1, 2, 3, 3, 4, 5)]
    first, again = j.seen[2], j.seen[3]
    assert first["reward_mean"] == again["reward_mean"] and first["accuracy"] == again["accuracy"]
    last = j.seen[-1]
    assert last["faults/learner_rebuilds"] == 1 and last["faults/steps_lost"] == 1
    (line,) = j.fault_lines()
    assert "learner rank 1" in line and "during update" in line, line
    wait_for(lambda: not any(alive(p) for p in old_pids), 15, "the old ranks to exit")
    assert not set(j.learner.pids()) & set(old_pids)
    rows = metrics_of(j.run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    versions = [r["policy_version"] for r in rows]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)   # versions only increase
    check_checkpoints(j.run_dir, 5, [2, 4, 5])
    assert j.rollout.weight_checksums() == pytest.approx(j.learner.weight_checksums(), rel=1e-12)


# ---- slow: the other faults ----------------------------------------------------------------------------------------
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


@pytest.mark.slow
def test_reward_actor_killed_mid_score(job):
    """The reward actor (and with it its math-verify process pool) dies while scoring step 2: a new one scores the
    batch again; every step completes, none lost; the dead actor's pool processes do not outlive it."""
    j = job("train.steps=3")
    pid = j.rewards.pid()
    j.rewards.score(["What is 1+1?"], ["\\boxed{2}"], ["2"], ["stop"])  # the pool starts with the first batch
    pool = descendants(pid)
    assert pool, "the reward actor has no pool processes"
    j.kill_during(j.rewards, "score", 2, j.rewards.pid, delay_s=0.02)
    j.train()
    assert [m["step"] for m in j.seen] == [1, 2, 3]
    assert [m["prompts_digest"] for m in j.seen] == expected_digests(j.cfg, 3)
    assert j.seen[-1]["faults/reward_restarts"] == 1
    (line,) = j.fault_lines()
    assert "reward actor died during score" in line, line
    wait_for(lambda: not any(alive(p) for p in pool | {pid}), 15, "the dead reward actor's pool to exit")
    assert j.rewards.pid() != pid
    # the rescored batch is a real score: step 2's rewards come from the math reward, not zeros
    assert j.seen[1]["reward/rewards/math/errors"] == 0 and j.seen[1]["samples"] == 32


@pytest.mark.slow
def test_learner_bound_stops_clearly_and_resume_continues(job):
    """Past `faults.max_learner_rebuilds` the job stops with a message that says how to continue, and `--resume`
    (here: train.resume) continues from the last checkpoint with the sampler's own prompts."""
    from rl.faults import RunStopped
    j = job("train.steps=4", "train.checkpoint_every=2", "faults.max_learner_rebuilds=0")
    j.kill_during(j.learner, "update", 3, lambda: j.learner.pids()[0])
    with pytest.raises(RunStopped, match=r"faults.max_learner_rebuilds=0 .*--resume"):
        j.train()
    assert [m["step"] for m in j.seen] == [1, 2]
    import ray
    ray.shutdown()
    again = job("train.steps=4", "train.checkpoint_every=2", f"train.resume={j.run_dir}", name="run")
    again.train()
    assert [m["step"] for m in again.seen] == [3, 4]
    want = expected_digests(j.cfg, 4)
    assert [m["prompts_digest"] for m in again.seen] == want[2:]
    assert [r["step"] for r in metrics_of(j.run_dir)] == [1, 2, 3, 4]
    check_checkpoints(j.run_dir, 4, [2, 4])


@pytest.mark.slow
def test_nonfinite_loss_is_skipped_then_stops(job, monkeypatch):
    """A NaN loss (injected on the learner ranks' updates 2, 4, 5, 6) skips that optimizer step: counted, the
    weights and policy version unchanged, the job goes on; three in a row stop it, naming the steps, with the last
    step checkpointed and the engine still holding finite weights equal to the learner's."""
    from rl.faults import RunStopped
    monkeypatch.setenv("FBRL_INJECT_NONFINITE_UPDATES", "2,4,5,6")
    j = job("train.steps=10", "faults.max_nonfinite_steps=3", "train.checkpoint_every=0")
    with pytest.raises(RunStopped, match=r"not finite in 3 steps in a row"):
        j.train()
    rows = metrics_of(j.run_dir)
    trained = [r for r in rows if not r["skipped"]]
    bad = [r for r in rows if r["skipped_nonfinite"]]
    assert len(bad) == 4 and len(trained) == len(rows) - 4 and bad[-1]["step"] == rows[-1]["step"]
    assert [r["step"] for r in trained if r["step"] > bad[1]["step"]] == []   # updates 4-6 in a row: the stop
    for r in bad:  # the skipped step did not move the policy
        before = [x for x in rows if x["step"] < r["step"]]
        assert r["policy_version"] == (before[-1]["policy_version"] if before else 1)
    assert rows[-1]["faults/nonfinite_steps"] == 4
    sums = j.learner.weight_checksums()
    assert all(v == v and abs(v) < float("inf") for v in sums.values())  # no NaN reached the weights
    assert j.rollout.weight_checksums() == pytest.approx(sums, rel=1e-12)
    check_checkpoints(j.run_dir, rows[-1]["step"], [rows[-1]["step"]])


# ---- slow: the driver itself, as `fbrl train` in a subprocess ----------------------------------------------------
def start_train(args: list[str], tmp_path: Path, mark: str, name: str, **env) -> subprocess.Popen:
    full_env = dict(os.environ, **ENV, FBRL_TEST_MARK=mark, PYTHONPATH=str(ROOT), **env)
    out = open(tmp_path / f"{name}.out", "w")
    return subprocess.Popen([sys.executable, "-m", "actors.cli", "train", *args], cwd=ROOT, env=full_env,
                            stdout=out, stderr=subprocess.STDOUT, text=True)


def output(tmp_path: Path, name: str) -> str:
    return (tmp_path / f"{name}.out").read_text()


def steps_logged(run_dir: Path) -> int:
    p = run_dir / "metrics.jsonl"
    return max((r["step"] for r in metrics_of(run_dir)), default=0) if p.exists() else 0


def no_processes_left(mark: str, timeout: float = 15) -> None:
    try:
        wait_for(lambda: not marked_processes(mark), timeout, "every process of the job to exit")
    except AssertionError:
        left = marked_processes(mark)
        for pid, _ in left:
            os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"processes left after the job: {left}") from None


@pytest.mark.slow
def test_driver_killed_then_resumed_with_identical_data_order(tmp_path):
    """SIGKILL of `fbrl train` once step 3 is logged (checkpoints every 2 steps): nothing of the job survives it,
    and `fbrl train --resume RUN_DIR` (no config argument: the run's own config.yaml) continues after the last
    checkpoint with the prompts an uninterrupted run draws."""
    from rl.config import load_config
    run_dir, mark = tmp_path / "run", uuid.uuid4().hex
    args = [*SMALL, "train.steps=5", "train.checkpoint_every=2", f"train.run_dir={run_dir}"]
    p = start_train(args, tmp_path, mark, "first")
    wait_for(lambda: p.poll() is not None or steps_logged(run_dir) >= 3, 900, "step 3")
    p.kill()
    p.wait()
    no_processes_left(mark)
    latest = int((run_dir / "checkpoints" / "latest").read_text().strip().removeprefix("step_"))
    assert latest in (2, 4) and steps_logged(run_dir) >= 3
    p = start_train(["--resume", str(run_dir)], tmp_path, mark, "resume")
    assert p.wait(900) == 0, output(tmp_path, "resume")[-3000:]
    no_processes_left(mark)
    rows = metrics_of(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    cfg = load_config(CONFIG, [*SMALL, "train.steps=5"])
    assert [r["prompts_digest"] for r in rows] == expected_digests(cfg, 5)
    assert f"at step {latest}" in output(tmp_path, "resume")
    check_checkpoints(run_dir, 5, [2, 4, 5])


@pytest.mark.slow
def test_sigterm_checkpoints_the_last_step_and_leaves_nothing(tmp_path):
    """SIGTERM to `fbrl train` (what `timeout` and schedulers send): the current step finishes and is
    checkpointed, one clear message, exit code 143, and no process of the job is left (Ray, the engine, the
    learner ranks, the reward pool). A wandb key in the environment is written nowhere. `--resume` continues."""
    run_dir, mark, secret = tmp_path / "run", uuid.uuid4().hex, "wandb-" + uuid.uuid4().hex
    args = [*SMALL, "train.steps=50", "train.checkpoint_every=0", f"train.run_dir={run_dir}",
            "logging.wandb_mode=offline"]
    p = start_train(args, tmp_path, mark, "first", WANDB_API_KEY=secret)
    wait_for(lambda: p.poll() is not None or steps_logged(run_dir) >= 2, 900, "step 2")
    p.send_signal(signal.SIGTERM)
    assert p.wait(120) == 128 + signal.SIGTERM, output(tmp_path, "first")[-3000:]
    no_processes_left(mark, timeout=5)
    out = output(tmp_path, "first")
    last = steps_logged(run_dir)
    assert "SIGTERM received: stopping after the current step" in out
    assert f"stopped after step {last}, which is checkpointed" in out and "Traceback" not in out
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step_{last:06d}"
    for f in [*run_dir.rglob("*"), tmp_path / "first.out"]:
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f"the wandb key was written to {f}"
    p = start_train(["--resume", str(run_dir), f"train.steps={last + 2}"], tmp_path, mark, "resume")
    assert p.wait(900) == 0, output(tmp_path, "resume")[-3000:]
    assert [r["step"] for r in metrics_of(run_dir)] == list(range(1, last + 3))
    no_processes_left(mark)


@pytest.mark.slow
def test_killed_while_writing_a_checkpoint_previous_one_loads(tmp_path):
    """SIGKILL of the driver while a checkpoint is being written (its temporary directory exists): `latest` still
    names the previous, complete checkpoint, and `--resume` loads it (sweeping the half-written one)."""
    run_dir, mark = tmp_path / "run", uuid.uuid4().hex
    args = [*SMALL, "train.steps=30", "train.checkpoint_every=1", f"train.run_dir={run_dir}"]
    p = start_train(args, tmp_path, mark, "first")
    root = run_dir / "checkpoints"

    def writing():  # a checkpoint in progress after a complete one exists
        if p.poll() is not None:
            return True
        try:
            return (root / "latest").exists() and any(n.startswith(".tmp-") for n in os.listdir(root))
        except OSError:
            return False

    wait_for(writing, 900, "a checkpoint being written", poll=0.001)
    p.kill()
    p.wait()
    assert p.returncode == -signal.SIGKILL, output(tmp_path, "first")[-3000:]
    no_processes_left(mark)
    half = [n for n in os.listdir(root) if n.startswith(".tmp-")]
    assert half, "the kill missed the checkpoint being written"
    latest = (root / "latest").read_text().strip()
    assert (root / latest / "trainer_state.json").is_file()
    step = json.loads((root / latest / "trainer_state.json").read_text())["step"]
    assert f".tmp-step_{step + 1:06d}" in half[0]
    p = start_train(["--resume", str(run_dir), f"train.steps={step + 1}"], tmp_path, mark, "resume")
    assert p.wait(900) == 0, output(tmp_path, "resume")[-3000:]
    assert f"at step {step}" in output(tmp_path, "resume")
    assert [r["step"] for r in metrics_of(run_dir)] == list(range(1, step + 2))
    check_checkpoints(run_dir, step + 1, [step, step + 1])


BROKEN_REWARD = '''
def broken(prompts, completions, answers, **fields):
    raise RuntimeError("the reward service is down")


def zero(prompts, completions, answers, **fields):
    return [0.0] * len(completions)
'''


@pytest.mark.slow
def test_reward_failing_on_every_row_stops_the_job(tmp_path):
    """A reward that raises on every batch is no longer a silent no-op run: after `faults.reward_error_steps`
    steps it stops, naming the reward, with a summary of the failed rows, exit code 3."""
    (tmp_path / "my_rewards.py").write_text(BROKEN_REWARD)
    run_dir, mark = tmp_path / "run", uuid.uuid4().hex
    args = [*SMALL, "train.steps=20", f"train.run_dir={run_dir}", "reward.timeout_s=2",
            f"reward.fns=[{{fn: {tmp_path / 'my_rewards.py'}:broken}}]"]
    p = start_train(args, tmp_path, mark, "first")
    assert p.wait(900) == 3, output(tmp_path, "first")[-3000:]
    out = output(tmp_path, "first")
    assert "reward 'broken' failed" in out and "steps 1-3" in out and "the reward service is down" in out
    assert "reward rows failed: 96 errors" in out and "3 run, 0 trained" in out
    assert steps_logged(run_dir) == 3
    no_processes_left(mark)


@pytest.mark.slow
def test_a_run_that_trains_nothing_exits_nonzero(tmp_path):
    """Every step without reward signal (a reward that is always 0): each step is skipped, the summary says so,
    and the exit code is 3, not 0."""
    (tmp_path / "my_rewards.py").write_text(BROKEN_REWARD)
    run_dir, mark = tmp_path / "run", uuid.uuid4().hex
    args = [*SMALL, "train.steps=2", f"train.run_dir={run_dir}",
            f"reward.fns=[{{fn: {tmp_path / 'my_rewards.py'}:zero}}]"]
    p = start_train(args, tmp_path, mark, "first")
    assert p.wait(900) == 3, output(tmp_path, "first")[-3000:]
    out = output(tmp_path, "first")
    assert "the run trained nothing: all 2 steps were skipped" in out and "2 run, 0 trained, 2 skipped" in out
    no_processes_left(mark)


# ---- bad input: refused before Ray or any engine starts -----------------------------------------------------------
def prepare(*argv: str, cwd: Path | None = None):
    """`fbrl train ARGV`'s checks (actors.launch.prepare), in this process."""
    import argparse

    from actors.launch import add_arguments, prepare as launch_prepare
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(list(argv))
    return launch_prepare(args)


@pytest.fixture
def inputs(tmp_path):
    """Files for the bad-input cases: a reward file, data sets, a tokenizer bigger than the model's vocabulary."""
    from rl.data.loaders import write_jsonl
    from rl.data.tokenizer import ALPHABET, build_tokenizer
    (tmp_path / "my_rewards.py").write_text(BROKEN_REWARD)
    write_jsonl([{"prompt": "Q: 1+1=?", "answer": "2"}, {"question": "Q: 2+2=?", "answer": "4"}],
                tmp_path / "nofield.jsonl")
    write_jsonl_task(tmp_path / "long.jsonl", 10)
    write_jsonl([{"prompt": "Q: 1+1=?", "answer": "2"}], tmp_path / "short.jsonl")
    build_tokenizer(alphabet=ALPHABET + "äöü").save_pretrained(str(tmp_path / "bigtok"))
    return tmp_path


BAD_INPUT = [  # (overrides, a piece of the message); {d} is the inputs directory
    (["train.steps=-1"], "train.steps: must be >= 1, got -1"),
    (["train.prompts_per_step=0"], "train.prompts_per_step: must be >= 1, got 0"),
    (["learner.num_workers=0"], "learner.num_workers: must be >= 1, got 0"),
    (["learner.lr=0"], "learner.lr: must be > 0"),
    (["model.path={d}/no-such-checkpoint"], "model.path: checkpoint not found"),
    (["model.path={d}"], "is not a checkpoint directory (no config.json"),
    (["reward.fns=[{{fn: {d}/missing.py:f}}]"], "reward file not found"),
    (["reward.fns=[{{fn: {d}/my_rewards.py:nope}}]"], "has no function 'nope'"),
    (["reward.fns=[{{fn: mathh}}]"], "unknown built-in reward 'mathh'"),
    (["data.task=jsonl", "data.train_path={d}/missing.jsonl"], "data.train_path: {d}/missing.jsonl: no such file"),
    (["data.task=jsonl", "data.train_path={d}/nofield.jsonl"], "nofield.jsonl:2: missing field 'prompt'"),
    (["model.tokenizer={d}/bigtok"], "vocabulary mismatch"),
    (["data.task=jsonl", "data.train_path={d}/long.jsonl", "data.overlong_prompts=error"],
     "row 5 (from 0) has a prompt of 438 tokens, more than the limit of 208"),
    (["data.task=jsonl", "data.train_path={d}/short.jsonl", "data.max_prompt_tokens=3"],
     "every one of the 1 prompts is longer than the limit of 3"),
    (["rollout.max_tokens=300"], "rollout.max_tokens=300 leaves no room for a prompt"),
]


@pytest.mark.parametrize("overrides, message", BAD_INPUT, ids=[m[:40] for _, m in BAD_INPUT])
def test_bad_input_is_refused_before_anything_starts(inputs, overrides, message):
    import ray
    d = str(inputs)
    with pytest.raises(ValueError) as e:
        prepare(*[o.format(d=d) for o in overrides], f"train.run_dir={inputs / 'run'}")
    assert message.format(d=d) in str(e.value), str(e.value)
    assert not ray.is_initialized() and not (inputs / "run").exists()  # nothing started, nothing created


def test_run_dir_rules(tmp_path):
    """A new run into a used run dir is refused (or replaced with --overwrite); --resume of a missing dir creates
    nothing; --resume takes the run's own config.yaml plus the overrides it allows, and refuses locked ones."""
    from rl.config import ConfigError
    from rl.run import RunDirError
    run = tmp_path / "run"
    cfg, _, run_dir, _ = prepare("train.checkpoint_every=7", "train.steps=3", f"train.run_dir={run}")
    run_dir.write_config(cfg)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(RunDirError, match="is not empty .*--resume"):
        prepare(f"train.run_dir={run}")
    with pytest.raises(RunDirError, match="no complete checkpoint"):
        prepare("--resume", str(run))
    (run / "checkpoints" / "step_000001").mkdir(parents=True)
    (run / "checkpoints" / "latest").write_text("step_000001")
    cfg, path, _, _ = prepare("--resume", str(run), "train.steps=9")
    assert path == str(run / "config.yaml")
    assert cfg.train.checkpoint_every == 7 and cfg.train.steps == 9 and cfg.train.resume == str(run)
    with pytest.raises(ConfigError, match="cannot resume.*likelihood.estimator"):
        prepare("--resume", str(run), "likelihood.estimator=kpass")
    with pytest.raises(RunDirError, match="no such run directory"):
        prepare("--resume", str(tmp_path / "missing"))
    assert not (tmp_path / "missing").exists()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match="does not look like an fbrl run directory"):
        prepare(f"train.run_dir={tmp_path / 'other'}", "--overwrite")
    assert (tmp_path / "other" / "notes.txt").exists()
    prepare(f"train.run_dir={run}", "--overwrite")
    assert sorted(os.listdir(run)) == ["checkpoints"]


def test_embedded_default_from_another_directory(tmp_path, monkeypatch):
    """`fbrl train` from any directory: the embedded default's checkpoint resolves from the package."""
    monkeypatch.chdir(tmp_path)
    cfg, path, _, tokenizer = prepare(f"train.run_dir={tmp_path / 'run'}")
    assert Path(cfg.model.path).is_absolute() and Path(cfg.model.path).is_dir()
    assert cfg.model.path == str(ROOT / "checkpoints" / "tiny-arith-mixed") and len(tokenizer) == 101
    # a relative path in an override keeps its usual meaning: the working directory
    with pytest.raises(ValueError, match=f"checkpoint not found: {tmp_path}/checkpoints/tiny-arith"):
        prepare("model.path=checkpoints/tiny-arith", f"train.run_dir={tmp_path / 'run2'}")


def test_secrets_are_not_saved_and_resume_asks_for_them(tmp_path):
    from rl.config import ConfigError, load_config
    from rl.run import RunDir
    secret = uuid.uuid4().hex
    cfg = load_config(CONFIG, [f"reward.fns=[{{fn: math}}, {{fn: x.py:f, options: {{api_key: {secret}}}}}]"])
    run = RunDir(str(tmp_path / "run"))
    run.write_config(cfg)
    text = (tmp_path / "run" / "config.yaml").read_text()
    assert secret not in text and "api_key: <redacted>" in text
    (tmp_path / "run" / "checkpoints" / "step_000001").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "latest").write_text("step_000001")
    with pytest.raises(ConfigError, match=r"reward.fns\[1\].options.api_key: secret values are never saved"):
        prepare("--resume", str(tmp_path / "run"))


def test_cli_bad_input_exit_code_and_time(tmp_path):
    """Through the real command: one line on stderr, no traceback, exit code 2, no Ray, in seconds."""
    env = dict(os.environ, **ENV, PYTHONPATH=str(ROOT))
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "actors.cli", "train", "train.steps=0", f"train.run_dir={tmp_path}/r"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - t0
    assert p.returncode == 2 and p.stderr.strip() == ("fbrl train: error: train.steps: must be >= 1, got 0 "
                                                      "(override 'train.steps=0')"), p.stderr
    assert "Traceback" not in p.stderr and "Ray" not in p.stdout + p.stderr and not (tmp_path / "r").exists()
    assert seconds < 60, seconds  # imports only (torch); start-up of Ray + engines is what is avoided


def test_untrusted_files_load_without_pickle_or_remote_code():
    """torch.load only with weights_only=True; no trust_remote_code=True anywhere in the package."""
    import re
    offenders = []
    for path in [*ROOT.glob("rl/**/*.py"), *ROOT.glob("actors/**/*.py"), *ROOT.glob("rollout/**/*.py"),
                 *ROOT.glob("rewards/**/*.py"), *ROOT.glob("scripts/*.py"), *ROOT.glob("bench/*.py")]:
        text = path.read_text()
        for m in re.finditer(r"torch\.load\(([^()]|\([^()]*\))*\)", text):
            if "weights_only=True" not in m.group(0):
                offenders.append(f"{path}: {m.group(0)[:80]}")
        if re.search(r"trust_remote_code\s*=\s*True", text):
            offenders.append(f"{path}: trust_remote_code=True")
    assert not offenders, offenders


# ---- the pieces, without Ray --------------------------------------------------------------------------------------
def test_prompt_fitter_drops_truncates_or_refuses():
    from rl.data.loaders import DataError
    from rl.data.prompts import PromptFitter
    from rl.data.tokenizer import build_tokenizer
    tok = build_tokenizer()
    rows = [{"prompt": "12345"}, {"prompt": "1234567890abc"}, {"prompt": "abc"}]  # 6, 14, 4 tokens with BOS
    kept, over = PromptFitter(tok, 8, "drop").fit(rows, "data")
    assert over == 1 and [r["prompt"] for r in kept] == ["12345", "abc"]
    left = PromptFitter(tok, 8, "truncate_left")
    assert left.fit(rows, "data") == (rows, 1)
    assert left.encode("1234567890abc") == [tok.bos_token_id] + tok.encode("7890abc", add_special_tokens=False) \
        and len(left.encode("1234567890abc")) == 8 and left.encode("12345") == tok.encode("12345")
    assert PromptFitter(tok, 8, "truncate_right").encode("1234567890abc") == tok.encode("1234567")
    with pytest.raises(DataError, match=r"data: row 1 \(from 0\) has a prompt of 14 tokens"):
        PromptFitter(tok, 8, "error").fit(rows, "data")


def test_run_guard_stops_on_persistent_faults_only():
    from rl.config import FaultsConfig
    from rl.faults import FaultLog, RunGuard, RunStopped
    lines = []
    guard = RunGuard(FaultsConfig(max_nonfinite_steps=2, reward_error_share=0.5, reward_error_steps=3),
                     FaultLog(lines.append))
    ok = {"rewards/math/errors": 0.0, "rewards/math/timeouts": 0.0}
    half = {"rewards/math/errors": 8.0, "rewards/math/timeouts": 8.0}    # exactly the share: not over it
    most = {"rewards/judge/errors": 20.0, "rewards/judge/timeouts": 5.0}
    guard.check(1, True, ok, 32)
    guard.check(2, False, half, 32)   # a finite step resets the non-finite run
    guard.check(3, True, most, 32)
    with pytest.raises(RunStopped, match=r"not finite in 2 steps in a row \(steps 3-4"):
        guard.check(4, True, most, 32)
    guard = RunGuard(FaultsConfig(reward_error_share=0.5, reward_error_steps=3), FaultLog(lines.append))
    guard.check(1, False, most, 32)
    guard.check(2, False, most, 32)
    guard.check(3, False, ok, 32)     # one good step resets it
    guard.check(4, False, most, 32)
    guard.check(5, False, most, 32)
    with pytest.raises(RunStopped, match=r"reward 'judge' failed .* on 78% of the rows at step 6.*steps 4-6"):
        guard.check(6, False, most, 32)
    assert sum(x.startswith("fault: step") for x in lines) == 3   # one line per non-finite step


def test_torch_backend_skips_a_nonfinite_step():
    import torch

    from rl.learner import TorchBackend
    model = torch.nn.Linear(3, 1)
    backend = TorchBackend(model, lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    backend.backward(model(torch.ones(1, 3)).sum() * float("nan"))
    norm = backend.step()
    assert norm != norm  # NaN, reported
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert not backend.optimizer.state and all(p.grad is None for p in model.parameters())
    backend.backward(model(torch.ones(1, 3)).sum())
    assert backend.step() == pytest.approx(2.0) and not torch.equal(before[0], model.weight)


def test_absurd_or_nonfinite_reward_counts_as_an_error():
    from rewards.base import RewardSet

    def scaled(prompts, completions, answers):
        return [1e9, float("inf"), 1.0]

    result = RewardSet([scaled], timeout_s=None)(["p"] * 3, ["c"] * 3, ["a"] * 3)
    assert result.rewards == [0.0, 0.0, 1.0] and result.metrics["rewards/scaled/errors"] == 2.0
    assert "absurd" in result.errors[0]
