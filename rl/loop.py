"""The RL loop: prompts → rollouts → rewards → advantages → mismatch parts → update → weight sync → metrics /
eval / checkpoint.

Written against the worker interfaces of `rl/train/workers.py`, so the same function drives in-process workers and Ray
actor groups (`actors/cli/launch.py` builds either). By default a step is synchronous (docs/DESIGN.md §7): the
engines generate with policy version v, the learner updates once per rollout batch, and the new weights are
tagged v+1 before the next rollout asks for them (`min_version`). With `train.max_staleness: s > 0` the same loop
is fed by a producer thread that generates the next batches while the learner trains (rl/train/rollout_queue.py): batch
k comes from the weights of step k - 1 - s, and no sample more than s versions behind the learner is trained on.
The estimators then see stale samples as follows: `replay` feeds the states the sampling version recorded to the
current weights, `kpass` recomputes them under the current weights, `exact` recomputes everything; the
off-policy correction (algo.tis_*) divides by the engine's log-prob of the sampling version.

Faults (rl/train/faults.py, docs/RELIABILITY.md): dead rollout and reward actors are replaced inside the worker objects
and only show up here as `faults/...` counts. A learner that lost a rank comes back rebuilt (`LearnerRebuilt`):
`train` restores the last checkpoint and runs the lost steps again with the same prompts; the rollout queue of
the failed pass is closed with it and a new one regenerates the batches from the restored step. A step whose loss
or gradients were not finite is skipped; `RunGuard` stops the job (`RunStopped`) when that, or a failing reward,
persists. `stop_requested()` (a signal arrived) ends the job after the current step, which is checkpointed; so does
a `train.save_before` deadline the next step would likely pass (exit code 0: rl/train/deadline.py).
"""

from __future__ import annotations

import time

import torch

from rl import algos
from rl.config import Config
from rl.data.loaders import PromptSampler
from rl.estimators.mismatch_parts import measure_parts
from rl.report.metrics import PhaseClock, sample_row, update_row
from rl.report.step_lines import report_failures
from rl.train.deadline import Deadline
from rl.train.faults import FaultLog, LearnerRebuilt, RunGuard, RunStopped, nonfinite_update, partly_applied
from rl.train.job import JobData, JobParts, JobState, check_engines, heldout, log_step, start_pass, sync_weights
from rl.train.rollout_queue import (
    RolloutQueue,
    generate_batch,
    score_batch,
    split_stale,
    staleness_metrics,
)
from rl.train.run_dir import RunDir, save_step, stop_after_step, stopped_before_step
from rl.train.workers import LearnerWorkers, RewardWorkers, RolloutWorkers


def train(
    cfg: Config,
    tokenizer,
    rollout: RolloutWorkers,
    learner: LearnerWorkers,
    rewards: RewardWorkers,
    run: RunDir,
    log=print,
    progress=None,
    faults: FaultLog | None = None,
    stop_requested=None,
    background_rollouts: bool | None = None,
    data: JobData | None = None,
    started_at: float | None = None,
) -> list[dict]:
    """Run the job to `cfg.train.steps` (continuing `cfg.train.resume`); returns the metrics of the steps run.

    `stop_requested()` returns a reason (e.g. "SIGTERM") once the job should end; it is asked between steps.
    `background_rollouts`: make batches in a producer thread (default: when `train.max_staleness` > 0; tests
    force it at 0 to check that the thread changes nothing). `data`: the task's rows as the checks before the job
    loaded them (else loaded here). `started_at`: when the job started (Unix time; default now), the origin of a
    `train.save_before` duration."""
    faults = faults if faults is not None else FaultLog(log)
    parts = JobParts.load(cfg, tokenizer, rollout, learner, rewards, run, log, progress, faults, data)
    job = JobState(
        restore="resume" if cfg.train.resume else None,
        guard=RunGuard(cfg.faults, faults),
        stop_requested=stop_requested or (lambda: None),
        background_rollouts=background_rollouts,
        deadline=Deadline.of(cfg.train.save_before, started_at if started_at is not None else time.time()),
    )
    history: list[dict] = []
    while True:
        try:
            _run_steps(parts, job, history)
            return history
        except LearnerRebuilt:  # the group holds its initial weights now: back to the last checkpoint
            job.restore = "rebuild"


def _run_steps(p: JobParts, job: JobState, history: list[dict]) -> None:
    cfg, learner, run = p.cfg, p.learner, p.run
    sampler = PromptSampler(p.train_rows, seed=cfg.train.seed)
    step, version = start_pass(p, job, sampler, history)
    reported = set()  # (reward, kind of failure) already printed with its message (report_failures)
    max_staleness = cfg.train.max_staleness
    # Steps 1-2 of every step (rollouts, rewards) come from this queue: made now (synchronous), or made ahead by a
    # producer thread from weights at most `max_staleness` versions older than the learner's. It lives for one
    # pass: a rebuilt learner (LearnerRebuilt) leaves the `with`, which stops the producer, and the next pass
    # makes a new queue from the restored step, so the batches after the checkpoint are generated again.
    env_weight = cfg.env.reward_weight if cfg.env is not None else 0.0
    batches = RolloutQueue(
        lambda k, v: generate_batch(cfg, p.fitter, sampler, p.rollout, p.tokenizer.eos_token_id, k, v, p.episodes),
        lambda b: score_batch(p.tokenizer, p.rewards, b, env_weight),
        p.rollout,
        first_step=step + 1,
        last_step=cfg.train.steps,
        max_staleness=max_staleness,
        checkpoint_every=cfg.train.checkpoint_every,
        published_step=step,
        version=version,
        background=job.background_rollouts,
        check=lambda: check_engines(p),  # the producer's, between its calls (the loop's own is after each sync)
    )
    unsaved = None  # the state of the last step completed in this pass, when it was not checkpointed
    with batches:
        while step < cfg.train.steps:
            step += 1
            t_step = time.perf_counter()

            # 1-2. rollouts (G samples per prompt) and rewards, made by policy `version` - max_staleness or newer;
            # a sample more than max_staleness versions behind the learner never reaches it
            try:
                batch, time_wait = batches.take(step)
            except RunStopped as e:  # raised while making this batch (the producer thread's included)
                raise stopped_before_step(e, run, learner, step - 1, unsaved) from None
            fresh, stale_dropped = split_stale(batch.samples, version, max_staleness)
            batch = batch.select(fresh)
            samples = batch.samples
            report_failures(batch.failures, reported, p.log)
            clock = PhaseClock(rollout=batch.time_rollout_s, reward=batch.time_reward_s, wait=time_wait)
            reward = torch.tensor(batch.rewards, dtype=torch.float32)
            lengths = torch.tensor([s.response_len for s in samples], dtype=torch.float32)
            reward_metrics = dict(batch.reward_metrics)
            if cfg.algo.overlong_buffer > 0:  # a reward term of its own, logged like the others
                penalty = algos.overlong_penalty(
                    lengths, cfg.rollout.max_tokens, cfg.algo.overlong_buffer, cfg.algo.overlong_factor
                )
                reward = reward + penalty
                reward_metrics["rewards/overlong_penalty/mean"] = float(penalty.mean()) if len(samples) else 0.0
            ages = staleness_metrics(samples, version)  # against the weights that train on them, before the update
            metrics = sample_row(step, batch, reward, lengths, stale_dropped, ages, reward_metrics)

            # 3. advantages per prompt group; groups with no signal are dropped if asked
            groups = torch.tensor([s.group_id for s in samples], dtype=torch.long)
            scored = ~torch.tensor(batch.unscored, dtype=torch.bool) if batch.unscored else None  # TRL's None
            advantages = algos.compute_advantages(reward, groups, cfg.algo.adv_estimator, cfg.algo.adv_eps, scored)
            has_signal, equal_groups = algos.dynamic_sampling_mask(reward, groups)
            keep = has_signal if cfg.algo.dynamic_sampling else torch.ones(len(samples), dtype=torch.bool)
            dropped = equal_groups if cfg.algo.dynamic_sampling else 0
            # Every group equal ⇒ every advantage is 0: an optimizer step would be a momentum-only update. Skip it.
            skip = len(samples) == 0 or algos.no_usable_signal(has_signal, (lengths > 0)[:, None])

            # 4. the mismatch taken apart on a diagnostic subset (engine / staleness / estimator), before the update
            with clock("mismatch_parts"):
                parts = measure_parts(cfg, learner, samples, version, step)

            # 5. learner update, then the new weights go to every engine as version + 1, between requests (a
            # request in flight finishes on the version it started with)
            with clock("learner"):
                kept = keep.nonzero().flatten().tolist()
                learner_metrics = {} if skip else learner.update([samples[i] for i in kept], advantages[kept].tolist())
            nonfinite = nonfinite_update(learner_metrics, step, p.faults)
            skip = skip or nonfinite
            stop = None  # a stop from here on still logs and checkpoints this step (the learner has updated)
            with clock("sync"):
                try:
                    if not skip:
                        version += 1
                        batches.before_sync(step)  # the batches owed the old weights have started on them
                        job.version = sync_weights(p, version)
                    batches.publish(step, version)  # batches up to step + 1 + max_staleness may be generated now
                    if not batches.background:  # the engines idle until the next take (a producer may hold them)
                        check_engines(p)
                except RunStopped as e:
                    stop = e

            # 6. metrics, the held-out eval when due, the checkpoint and RUN_DIR/policy/ when due
            metrics |= update_row(version, skip, nonfinite, dropped, learner_metrics, parts, clock.times)
            due = cfg.train.eval_every > 0 and (step % cfg.train.eval_every == 0 or step == cfg.train.steps)
            if due and stop is None:
                try:
                    metrics |= heldout(p, version, step)[0]
                except RunStopped as e:
                    stop = e
            metrics["time_step_s"] = time.perf_counter() - t_step
            try:  # the stop rules see this step's faults; a stop still logs the step and checkpoints it
                job.guard.check(
                    step,
                    nonfinite if learner_metrics else None,
                    reward_metrics,
                    len(samples),
                    partly=partly_applied(learner_metrics),
                )
            except RunStopped as e:
                stop = stop or e
            # the row before the checkpoint and the export, which can fail or be killed: a checkpoint never holds
            # a step that metrics.jsonl lacks (a resume truncates the rows after its checkpoint and logs them again)
            log_step(p, job, history, {**metrics, **p.faults.metrics()})
            # the sampler position after this step's prompts (the producer may have drawn later batches)
            state = {"version": version, "sampler": batch.sampler_state}
            t_save = time.perf_counter()
            checkpointed = save_step(run, cfg, learner, step, state)
            unsaved = None if checkpointed else state
            late = job.past_deadline(step, cfg.train.steps, t_step, t_save, checkpointed, run.path)
            stop = stop or job.stop_requested() or late
            if stop:
                stop_after_step(stop, run, learner, step, None if checkpointed else state)
