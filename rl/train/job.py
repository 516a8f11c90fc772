"""What one RL job runs with, and the bookkeeping around its steps, so that rl/loop.py holds only the step.

`JobData` (rl/train/job_data.py: the task's rows fitted to the prompt limit, loaded once by the checks before
the job starts), `JobParts` (the config, the data, the workers, the run directory, how it reports),
`JobState` (what outlives a pass of the loop when the learner is rebuilt mid-job), and the calls the loop makes
around each step: `start_pass` (a new run, a resume or a rebuilt learner: where the pass starts, the first weight
sync and the step-0 eval), `heldout` (the held-out eval as a metrics row), `sync_weights`, `check_engines` (the
engines' health check between steps) and `log_step`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from rl.config import Config
from rl.data.loaders import PromptSampler
from rl.data.prompts import PromptFitter
from rl.report.metrics import eval_metrics
from rl.report.step_lines import console_line, eval_line
from rl.train.deadline import Deadline
from rl.train.faults import FaultLog, RunGuard
from rl.train.heldout import heldout_accuracy
from rl.train.job_data import JobData
from rl.train.rollout_queue import Serialized, multiturn_rollouts
from rl.train.run_dir import RunDir, restore_step, weights_file
from rl.train.workers import LearnerWorkers, RewardWorkers, RolloutWorkers


@dataclass
class JobParts:
    """What one job runs with: the config, the data, the workers, where it writes and how it reports."""

    cfg: Config
    tokenizer: object
    fitter: PromptFitter
    train_rows: list[dict]
    eval_rows: list[dict]
    rollout: RolloutWorkers
    learner: LearnerWorkers
    rewards: RewardWorkers
    run: RunDir
    log: Callable[[str], None]
    progress: Callable[[dict], None] | None
    faults: FaultLog
    # multi-turn episodes with `env`'s tool environment (rl/train/rollout_queue.py `multiturn_rollouts`); None:
    # single completions
    episodes: Callable | None = None

    @classmethod
    def load(
        cls, cfg: Config, tokenizer, rollout, learner, rewards, run, log, progress, faults, data: JobData | None = None
    ) -> JobParts:
        """`data` as the checks before the job loaded it (else loaded now), its over-long prompts reported. Rollout
        and reward calls from the loop and from the producer thread take turns (new weights reach the engines
        between requests: rl/train/rollout_queue.py); one lock per worker object for the whole job, so a
        generation still in flight from a pass that a rebuilt learner ended finishes before the next pass syncs."""
        data = data or JobData.load(cfg, tokenizer)
        data.report(faults, log)
        serial_rollout, serial_rewards = Serialized(rollout), Serialized(rewards)
        return cls(
            cfg,
            tokenizer,
            data.fitter,
            data.train_rows,
            data.eval_rows,
            serial_rollout,
            learner,
            serial_rewards,
            run,
            log,
            progress,
            faults,
            multiturn_rollouts(cfg, serial_rollout, serial_rewards, tokenizer) if cfg.env is not None else None,
        )


@dataclass
class JobState:
    """What outlives one pass of the loop when the learner is rebuilt mid-job."""

    restore: str | None  # "resume" / "rebuild": start from the run's last checkpoint
    guard: RunGuard
    stop_requested: Callable[[], str | None]  # a reason to stop, or None
    step: int = 0  # the last step completed
    version: int = 0  # the newest policy version pushed to the engines (versions only increase)
    background_rollouts: bool | None = None  # the rollout queue's producer thread (None: when max_staleness > 0)
    deadline: Deadline | None = None  # train.save_before

    def past_deadline(self, step: int, last_step: int, t_step: float, t_save: float, saved: bool, run_path):
        """After step `step` (begun at `t_step`, its checkpoint and export begun at `t_save`, `saved`: it was
        checkpointed; `time.perf_counter` times): the stop when one more step would likely end past
        `train.save_before`, else None."""
        if self.deadline is None:
            return None
        now = time.perf_counter()
        self.deadline.step_done(now - t_step, now - t_save if saved else None)
        return self.deadline.stop(step, run_path) if step < last_step else None


def start_pass(p: JobParts, job: JobState, sampler: PromptSampler, history: list[dict]) -> tuple[int, int]:
    """(step, version) this pass starts from: a new run's step 0, or the last checkpoint's step on resume and after
    a rebuilt learner (its lost steps run again with the same prompts). The learner's weights are pushed to the
    engines once (they start from the checkpoint file), and a new run is evaluated before step 1."""
    step, version = 0, job.version
    if job.restore:
        step, version = restore_step(p.run, p.cfg, p.learner, sampler, version)
        if job.restore == "rebuild":  # completed steps after the checkpoint are lost and run again
            p.faults.add("steps_lost", max(job.step - step, 0))
            history[:] = [m for m in history if m["step"] <= step]
            p.log(
                f"learner restored to step {step} (policy version {version + 1}); the next steps run again "
                f"with the same prompts"
            )
            job.step = step
        else:
            p.log(f"resumed {p.run.path} at step {step} (policy version {version})")
    else:
        p.run.write_config(p.cfg)
    version += 1
    job.version = sync_weights(p, version)
    if step == 0 and p.cfg.train.eval_every > 0:
        row, strict, lenient = heldout(p, version, 0)
        p.run.log_metrics({"step": 0, **row})
        p.log(eval_line(0, p.cfg.train.steps, strict, lenient, len(p.eval_rows)))
    return step, version


def heldout(p: JobParts, version: int, step: int) -> tuple[dict, dict, dict]:
    """The held-out eval at `step`: (its metrics row fields, strict and lenient accuracy per mode)."""
    strict, lenient = heldout_accuracy(
        p.cfg, p.eval_rows, p.tokenizer, p.rollout, p.rewards, version, p.fitter.encode, p.run, step, p.log, p.episodes
    )
    return eval_metrics(strict, lenient, p.cfg.train.eval_decode_modes[0]), strict, lenient


def sync_weights(p: JobParts, version: int) -> int:
    """The learner's weights onto every engine as `version`, by the workers' transport (`rollout.weight_sync`: the
    file `rl.train.run_dir.weights_file`, Ray's object store, vLLM's NCCL / IPC transfer; actors/weight_sync.py)."""
    versions = p.rollout.sync_weights(p.learner, version, weights_file(p.run))
    if any(v != version for v in versions):
        raise RuntimeError(f"weight sync: engines report versions {versions}, expected {version}")
    return version


def check_engines(p: JobParts) -> None:
    """A dead or wedged engine found while the engines idle between steps is replaced before the next request
    (`check_health`, `faults.engine_ping_timeout_s`), not at its next call's deadline."""
    p.rollout.check_health()


def log_step(p: JobParts, job: JobState, history: list[dict], metrics: dict) -> None:
    """A finished step's row: into metrics.jsonl, the job's history, the console and the progress callback."""
    p.run.log_metrics(metrics)
    history.append(metrics)
    job.step = metrics["step"]
    p.log(console_line(metrics, p.cfg.train.steps))
    if p.progress is not None:
        p.progress(metrics)
