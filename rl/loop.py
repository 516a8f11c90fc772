"""The RL loop: prompts → rollouts → rewards → advantages → mismatch parts → update → weight sync → metrics /
eval / checkpoint.

Written against the worker interfaces of `rl/workers.py`, so the same function drives in-process workers and Ray
actor groups (`actors/launch.py` builds either). By default a step is synchronous (shared/DESIGN.md §7): the
engines generate with policy version v, the learner updates once per rollout batch, and the new weights are
tagged v+1 before the next rollout asks for them (`min_version`). With `train.max_staleness: s > 0` the same loop
is fed by a producer thread that generates the next batches while the learner trains (rl/rollout_queue.py): batch
k comes from the weights of step k - 1 - s, and no sample more than s versions behind the learner is trained on.
The estimators then see stale samples as follows: `replay` feeds the states the sampling version recorded to the
current weights, `kpass` recomputes them under the current weights, `exact` recomputes everything; the
off-policy correction (algo.tis_*) divides by the engine's log-prob of the sampling version.

Faults (rl/faults.py, docs/RELIABILITY.md): dead rollout and reward actors are replaced inside the worker objects
and only show up here as `faults/...` counts. A learner that lost a rank comes back rebuilt (`LearnerRebuilt`):
`train` restores the last checkpoint and runs the lost steps again with the same prompts; the rollout queue of
the failed pass is closed with it and a new one regenerates the batches from the restored step. A step whose loss
or gradients were not finite is skipped; `RunGuard` stops the job (`RunStopped`) when that, or a failing reward,
persists. `stop_requested()` (a signal arrived) ends the job after the current step, which is checkpointed.
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass

import torch

from rl import algos
from rl.batch import SamplingParams
from rl.config import Config
from rl.data.loaders import PromptSampler, encode_prompt, load_task_split, reward_columns
from rl.data.prompts import PromptFitter, prompt_token_limit
from rl.decode_modes import rl_modes
from rl.evaluate import last_number_score
from rl.faults import FaultLog, LearnerRebuilt, RunGuard, RunStopped, is_nonfinite, partly_applied
from rl.mismatch_parts import diagnostic_rows, within_token_budget
from rl.rollout_queue import RolloutBatch, RolloutQueue, Serialized, split_stale, staleness_metrics
from rl.run import RunDir
from rl.states import params_states_dtype
from rl.workers import LearnerWorkers, RewardWorkers, RolloutWorkers


def sampling_params(cfg: Config, eos_id: int, greedy: bool = False, decode_mode: str | None = None, seed=None):
    r = cfg.rollout
    return SamplingParams(
        n=1 if greedy else r.n_samples_per_prompt, temperature=0.0 if greedy else r.temperature,
        top_p=1.0 if greedy else r.top_p, top_k=0 if greedy or r.top_k < 0 else r.top_k, max_tokens=r.max_tokens,
        stop_token_ids=(eos_id,), seed=seed, decode_mode=decode_mode or r.decode_mode,
        record_states=not greedy and cfg.likelihood.estimator == "replay",
        states_dtype=params_states_dtype(r.record_states_dtype, engines_on_gpu=r.num_gpus_per_engine > 0))


def evaluate(cfg, rows, tokenizer, rollout: RolloutWorkers, rewards: RewardWorkers, version: int,
             encode=None, run: RunDir | None = None, step: int | None = None, log=None) -> tuple[dict, dict]:
    """Greedy held-out accuracy per decode mode under two reads: ({mode: the fraction of problems the task's
    correctness check (`reward.accuracy`) calls right — never "reward > 0"}, {mode: the lenient read, the last
    number in the response (`rl.evaluate.last_number_score`)}). Both empty when accuracy is off. With `run`, the
    per-problem outcomes and responses go to RUN_DIR/eval/step_<step>.json, so two evaluations pair up."""
    strict, lenient, record = {}, {}, {}
    prompts = [encode(r) if encode else encode_prompt(tokenizer, r) for r in rows]
    answers = [r["answer"] for r in rows]
    # in chunks of two engine batches, each reported: a long held-out eval is minutes, never silent ones
    chunk = 2 * cfg.rollout.vllm.max_num_seqs * cfg.rollout.num_engines
    for mode in cfg.train.eval_decode_modes:
        samples, t0 = [], time.perf_counter()
        for i in range(0, len(prompts), chunk):
            samples += rollout.generate(prompts[i:i + chunk], sampling_params(cfg, tokenizer.eos_token_id, True, mode),
                                        version)
            if log and len(prompts) > chunk:
                log(f"  eval {mode}: {len(samples)}/{len(prompts)} problems ({time.perf_counter() - t0:.0f}s)")
        texts = [tokenizer.decode(s.response_ids, skip_special_tokens=True) for s in samples]
        scored = rewards.score([r["prompt"] for r in rows], texts, answers,
                               [s.finish_reason for s in samples], reward_columns(rows))
        if scored.correct is None:
            return {}, {}
        loose = [int(x > 0.5) for x in last_number_score([], texts, answers)]
        strict[mode] = sum(scored.correct) / len(scored.correct)
        lenient[mode] = sum(loose) / len(loose)
        record[mode] = {"strict": [int(bool(c)) for c in scored.correct], "lenient": loose,
                        "truncated": [int(s.truncated) for s in samples], "responses": texts}
    if run is not None:
        run.write_eval(step, {"step": step, "policy_version": version, "answers": answers,
                              "questions": [r.get("question", r["prompt"]) for r in rows], "modes": record})
    return strict, lenient


def eval_metrics(strict: dict, lenient: dict, first_mode: str) -> dict:
    """The metrics row fields of one held-out evaluation (`evaluate`)."""
    return {**{f"eval_accuracy_{m}": a for m, a in strict.items()},
            **{f"eval_lenient_accuracy_{m}": a for m, a in lenient.items()},
            "eval_accuracy": strict.get(first_mode), "eval_lenient_accuracy": lenient.get(first_mode)}


def train(cfg: Config, tokenizer, rollout: RolloutWorkers, learner: LearnerWorkers, rewards: RewardWorkers,
          run: RunDir, log=print, progress=None, faults: FaultLog | None = None, stop_requested=None,
          background_rollouts: bool | None = None) -> list[dict]:
    """Run the job to `cfg.train.steps` (continuing `cfg.train.resume`); returns the metrics of the steps run.

    `stop_requested()` returns a reason (e.g. "SIGTERM") once the job should end; it is asked between steps.
    `background_rollouts`: make batches in a producer thread (default: when `train.max_staleness` > 0; tests
    force it at 0 to check that the thread changes nothing)."""
    faults = faults if faults is not None else FaultLog(log)
    fitter = PromptFitter(tokenizer, prompt_token_limit(cfg), cfg.data.overlong_prompts)
    train_rows = _fitted(fitter, load_task_split(cfg.data, "train", tokenizer=tokenizer), "train data", faults,
                         log)
    eval_rows = _fitted(fitter, load_task_split(cfg.data, "test", n=cfg.train.eval_n, tokenizer=tokenizer),
                        "eval data", faults, log) if cfg.train.eval_every > 0 else []
    reward_columns(train_rows + eval_rows)  # a column that would shadow a reward argument fails now, not at step 1
    job = _Job(restore="resume" if cfg.train.resume else None, guard=RunGuard(cfg.faults, faults),
               stop_requested=stop_requested or (lambda: None), background_rollouts=background_rollouts)
    # rollout and reward calls from the loop and from the producer thread take turns (new weights reach the
    # engines between requests: rl/rollout_queue.py); one lock per worker object for the whole job, so a
    # generation still in flight from a pass that a rebuilt learner ended finishes before the next pass syncs
    rollout, rewards = Serialized(rollout), Serialized(rewards)
    history: list[dict] = []
    while True:
        try:
            _run_steps(cfg, tokenizer, fitter, train_rows, eval_rows, rollout, learner, rewards, run, log, progress,
                       faults, job, history)
            return history
        except LearnerRebuilt:  # the group holds its initial weights now: back to the last checkpoint
            job.restore = "rebuild"


@dataclass
class _Job:
    """What outlives one pass of `_run_steps` when the learner is rebuilt mid-job."""
    restore: str | None           # "resume" / "rebuild": start from the run's last checkpoint
    guard: RunGuard
    stop_requested: object        # () -> a reason to stop (str) or None
    step: int = 0                 # the last step completed
    version: int = 0              # the newest policy version pushed to the engines (versions only increase)
    background_rollouts: bool | None = None  # rl/rollout_queue.py's producer thread (None: when max_staleness > 0)


def _run_steps(cfg, tokenizer, fitter, train_rows, eval_rows, rollout, learner, rewards, run, log, progress,
               faults, job, history) -> None:
    sampler = PromptSampler(train_rows, seed=cfg.train.seed)
    eos = tokenizer.eos_token_id
    step, version = 0, job.version

    if job.restore:  # continue at the next step with the same data order, RNGs, weights and optimizer
        run.check_resume_config(cfg)
        if run.latest_checkpoint() is not None or cfg.train.resume:
            state = run.load_checkpoint(learner)
            step, version = state["step"], max(state["version"], version)
            sampler.load_state_dict(state["sampler"])
        run.truncate_metrics_after(step if step else -1)  # rows after the checkpoint are logged again
        if job.restore == "rebuild":  # completed steps after the checkpoint are lost and run again
            faults.add("steps_lost", max(job.step - step, 0))
            history[:] = [m for m in history if m["step"] <= step]
            log(f"learner restored to step {step} (policy version {version + 1}); the next steps run again "
                f"with the same prompts")
            job.step = step
        else:
            log(f"resumed {run.path} at step {step} (policy version {version})")
    else:
        run.write_config(cfg)
    version += 1  # engines start from the checkpoint file, so push the learner's weights once, tagged
    job.version = _sync(learner, rollout, run, version)

    if step == 0 and cfg.train.eval_every > 0:
        acc, lenient = evaluate(cfg, eval_rows, tokenizer, rollout, rewards, version, fitter.encode, run, 0, log)
        run.log_metrics({"step": 0, **eval_metrics(acc, lenient, cfg.train.eval_decode_modes[0])})
        log(f"{_step(0, cfg.train.steps)} | eval {_fmt(acc)}, lenient {_fmt(lenient)} (held-out greedy, "
            f"{len(eval_rows)} problems)")

    reported = set()  # (reward, kind of failure) already printed with its message (_report_failures)
    max_staleness = cfg.train.max_staleness
    # Steps 1-2 of every step (rollouts, rewards) come from this queue: made now (synchronous), or made ahead by a
    # producer thread from weights at most `max_staleness` versions older than the learner's. It lives for one
    # pass: a rebuilt learner (LearnerRebuilt) leaves the `with`, which stops the producer, and the next pass
    # makes a new queue from the restored step, so the batches after the checkpoint are generated again.
    batches = RolloutQueue(lambda k, v: generate_batch(cfg, fitter, sampler, rollout, eos, k, v),
                           lambda b: score_batch(tokenizer, rewards, b), rollout,
                           first_step=step + 1, last_step=cfg.train.steps, max_staleness=max_staleness,
                           checkpoint_every=cfg.train.checkpoint_every, published_step=step, version=version,
                           background=job.background_rollouts)
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
                raise _stopped_between(e, run, learner, step - 1, unsaved) from None
            fresh, stale_dropped = split_stale(batch.samples, version, max_staleness)
            batch = batch.select(fresh)
            samples = batch.samples
            ages = staleness_metrics(samples, version)
            _report_failures(batch.failures, reported, log)
            reward = torch.tensor(batch.rewards, dtype=torch.float32)
            lengths = torch.tensor([s.response_len for s in samples], dtype=torch.float32)
            reward_metrics = dict(batch.reward_metrics)
            if cfg.algo.overlong_buffer > 0:  # a reward term of its own, logged like the others
                penalty = algos.overlong_penalty(lengths, cfg.rollout.max_tokens, cfg.algo.overlong_buffer,
                                                 cfg.algo.overlong_factor)
                reward = reward + penalty
                reward_metrics["rewards/overlong_penalty/mean"] = float(penalty.mean()) if len(samples) else 0.0

            # 3. advantages per prompt group; groups with no signal are dropped if asked
            groups = torch.tensor([s.group_id for s in samples], dtype=torch.long)
            advantages = algos.compute_advantages(reward, groups, cfg.algo.adv_estimator, cfg.algo.adv_eps)
            has_signal, equal_groups = algos.dynamic_sampling_mask(reward, groups)
            keep = has_signal if cfg.algo.dynamic_sampling else torch.ones(len(samples), dtype=torch.bool)
            dropped = equal_groups if cfg.algo.dynamic_sampling else 0
            # Every group equal ⇒ every advantage is 0: an optimizer step would be a momentum-only update. Skip it.
            skip = len(samples) == 0 or algos.no_usable_signal(has_signal, (lengths > 0)[:, None])

            # 4. the mismatch taken apart on a diagnostic subset: engine / staleness / estimator (exact log-probs
            # under the sampling and the current weights; rl/mismatch_parts.py), before the update changes them
            t0 = time.perf_counter()
            parts = {}
            if cfg.train.mismatch_parts_frac > 0:
                diag = within_token_budget(
                    diagnostic_rows(len(samples), cfg.train.mismatch_parts_frac, cfg.train.seed, step),
                    [s.response_len for s in samples], cfg.train.mismatch_parts_max_tokens)
                parts = learner.mismatch_parts([samples[i] for i in diag], version)
            time_parts = time.perf_counter() - t0

            # 5. learner update, then the new weights go to every engine as version + 1, between requests (a
            # request in flight finishes on the version it started with)
            t0 = time.perf_counter()
            learner_metrics = {}
            if not skip:
                kept = keep.nonzero().flatten().tolist()
                learner_metrics = learner.update([samples[i] for i in kept], advantages[kept].tolist())
            time_learner = time.perf_counter() - t0
            # every optimizer step skipped: the weights did not change. Some applied (mini_batches / ppo_epochs > 1):
            # they moved, so this is a new version like any update (synced, tagged), never new weights under V
            partial = partly_applied(learner_metrics)
            if partial:
                faults.record("partly_nonfinite_steps", f"step {step}: loss or gradients not finite in "
                              f"{learner_metrics['nonfinite_steps']:.0f} of {learner_metrics['optimizer_steps']:.0f} "
                              f"optimizer steps; those skipped, the others applied: the weights are a new version")
            nonfinite = is_nonfinite(learner_metrics) and not partial
            skip = skip or nonfinite
            t0 = time.perf_counter()
            if not skip:
                version += 1
                batches.before_sync(step)  # the batches owed the old weights have started on them
                job.version = _sync(learner, rollout, run, version)
            batches.publish(step, version)  # batches up to step + 1 + max_staleness may be generated now
            time_sync = time.perf_counter() - t0

            metrics = {
                "step": step, "policy_version": version, "skipped": int(skip), "skipped_nonfinite": int(nonfinite),
                # the oldest version the engines stamped on this step's samples (tests check it against the counter)
                "rollout_policy_version": min((s.policy_version for s in samples), default=None),
                "prompts_digest": _digest(r["prompt"] for r in batch.rows),
                "reward_mean": float(reward.mean()) if len(samples) else 0.0,
                "accuracy": None if batch.correct is None else sum(batch.correct) / max(len(batch.correct), 1),
                "response_len_mean": float(lengths.mean()) if len(samples) else 0.0,
                "truncation_rate": sum(s.truncated for s in samples) / max(len(samples), 1),
                "groups_dropped": dropped, "samples": len(samples), "samples_preempted": batch.preempted,
                "samples_stale_dropped": stale_dropped, **ages,
                "logprob_mismatch_abs_mean": learner_metrics.get("mismatch/abs_logp_diff"),
                "time_rollout_s": batch.time_rollout_s, "time_reward_s": batch.time_reward_s,
                "time_wait_s": time_wait, "time_mismatch_parts_s": time_parts, "time_learner_s": time_learner,
                "time_sync_s": time_sync,
                **{f"reward/{k}": v for k, v in reward_metrics.items()},
                **{f"learner/{k}": v for k, v in learner_metrics.items()},
                **{f"mismatch_parts/{k}": v for k, v in parts.items()},
            }
            if cfg.train.eval_every > 0 and (step % cfg.train.eval_every == 0 or step == cfg.train.steps):
                acc, lenient = evaluate(cfg, eval_rows, tokenizer, rollout, rewards, version, fitter.encode, run,
                                        step, log)
                metrics.update(eval_metrics(acc, lenient, cfg.train.eval_decode_modes[0]))
            # the sampler position after this step's prompts (the producer may have drawn later batches)
            state = {"version": version, "sampler": batch.sampler_state}
            on_schedule = cfg.train.checkpoint_every > 0 and step % cfg.train.checkpoint_every == 0
            checkpointed = cfg.train.checkpoint_every > 0 and (on_schedule or step == cfg.train.steps)
            if checkpointed:
                run.save_checkpoint(step, learner, state)
            unsaved = None if checkpointed else state
            if step == cfg.train.steps or on_schedule:
                # RUN_DIR/policy/: the current weights as a save_pretrained dir, exported here (only the file
                # transport writes the weights file at every sync)
                path = learner.export_weights(_weights_file(run))
                if path and os.path.isfile(path):  # (a learner stand-in in tests may export no file)
                    run.export_policy(path, cfg.model.path, cfg.model.tokenizer,
                                      rl_modes(cfg.model.path, cfg.rollout.decode_mode))
                if cfg.learner.lora is not None:  # RUN_DIR/policy_adapter/: the adapters in peft's format
                    learner.export_adapter(str(run.path / "policy_adapter"))
            metrics["time_step_s"] = time.perf_counter() - t_step
            try:  # the stop rules see this step's faults; a stop still logs the step and checkpoints it
                job.guard.check(step, nonfinite if learner_metrics else None, reward_metrics, len(samples))
                stop = job.stop_requested()
            except RunStopped as e:
                stop = e
            metrics.update(faults.metrics())
            run.log_metrics(metrics)
            history.append(metrics)
            job.step = step
            log(_console_line(metrics, cfg.train.steps))
            if progress is not None:
                progress(metrics)
            if stop:
                if not checkpointed:
                    run.save_checkpoint(step, learner, state)
                raise stop if isinstance(stop, RunStopped) else RunStopped(
                    f"{stop}: stopped after step {step}, which is checkpointed; `fbrl train --resume {run.path}` "
                    f"continues")


def _stopped_between(stop: RunStopped, run: RunDir, learner: LearnerWorkers, last: int, unsaved) -> RunStopped:
    """A stop raised before step `last` + 1 had its batch: step `last` checkpointed (when it was not: `unsaved` is
    its state) and the stop said so."""
    if unsaved is not None:
        run.save_checkpoint(last, learner, unsaved)
    where = f"stopped after step {last}, which is checkpointed" if last else "stopped before step 1"
    return RunStopped(f"{stop.reason}; {where}", stop.resumable, stop.exit_code)


def generate_batch(cfg: Config, fitter: PromptFitter, sampler: PromptSampler, rollout: RolloutWorkers, eos: int,
                   step: int, version: int) -> RolloutBatch:
    """Step `step`'s prompts and G samples per prompt from policy `version` (or newer), preempted ones removed
    (their recurrent state was lost: never train on them)."""
    rows = sampler.next(cfg.train.prompts_per_step)
    sampler_state = sampler.state_dict()
    prompts = [fitter.encode(r) for r in rows]
    t0 = time.perf_counter()
    seed = cfg.train.seed * 1_000_003 + step
    samples = rollout.generate(prompts, sampling_params(cfg, eos, seed=seed), min_version=version)
    elapsed = time.perf_counter() - t0
    kept = [s for s in samples if not s.preempted]
    return RolloutBatch(step, rows, kept, version, sampler_state, preempted=len(samples) - len(kept),
                        time_rollout_s=elapsed)


def score_batch(tokenizer, rewards: RewardWorkers, batch: RolloutBatch) -> RolloutBatch:
    """The batch's rewards and correctness (the task's check, `reward.accuracy`), and the rewards' failures."""
    t0 = time.perf_counter()
    samples = batch.samples
    completions = [tokenizer.decode(s.response_ids, skip_special_tokens=True) for s in samples]
    sample_rows = [batch.rows[s.group_id] for s in samples]
    scored = rewards.score([r["prompt"] for r in sample_rows], completions, [r["answer"] for r in sample_rows],
                           [s.finish_reason for s in samples], reward_columns(sample_rows))
    batch.rewards, batch.correct, batch.reward_metrics = list(scored.rewards), scored.correct, dict(scored.metrics)
    batch.failures = list(scored.failures)
    batch.time_reward_s = time.perf_counter() - t0
    return batch


def _fitted(fitter: PromptFitter, rows: list[dict], what: str, faults: FaultLog, log) -> list[dict]:
    """`rows` under the prompt-length limit (data.overlong_prompts), with one log line when any were over it."""
    rows, over = fitter.fit(rows, what)
    if over:
        action = "dropped" if fitter.mode == "drop" else "truncated"
        faults.add(f"prompts_{action}", over)
        log(f"{what}: {over} prompts longer than {fitter.limit} tokens {action} "
            f"(data.overlong_prompts={fitter.mode}); {len(rows)} rows remain")
    return rows


def _digest(prompts) -> str:
    return hashlib.sha256("\x00".join(prompts).encode()).hexdigest()[:16]


def _weights_file(run: RunDir) -> str:
    return str(run.path.absolute() / "weights" / "policy.safetensors")  # absolute: learner rank 0 writes it


def _sync(learner: LearnerWorkers, rollout: RolloutWorkers, run: RunDir, version: int) -> int:
    """The learner's weights onto every engine as `version`, by the workers' transport (`rollout.weight_sync`:
    the file `_weights_file`, Ray's object store, vLLM's NCCL / IPC transfer; actors/weight_sync.py)."""
    versions = rollout.sync_weights(learner, version, _weights_file(run))
    if any(v != version for v in versions):
        raise RuntimeError(f"weight sync: engines report versions {versions}, expected {version}")
    return version


def _report_failures(failures: list[str], reported: set, log) -> None:
    """Print a reward's failure the first time it fails that way ("reward 'judge' raised ...", "... timed out");
    after that the step line counts them (`reward failures: judge 8`) and metrics.jsonl has every count."""
    for line in failures:
        name, _, rest = line.partition("' ")  # "reward 'judge", "raised RuntimeError: ..."
        kind = (name, rest.split(" ", 1)[0])
        if kind not in reported:
            reported.add(kind)
            log(f"{line} (printed once; the step lines count repeats)")


def _fmt(acc: dict) -> str:
    return " ".join(f"{m} {a:.3f}" for m, a in acc.items())


def _step(step: int, steps: int) -> str:
    return f"step {step:>{len(str(steps))}}/{steps}"


def _console_line(m: dict, steps: int) -> str:
    """One line per step: what was learned (reward, accuracy), what was sampled (length, truncated share), how
    far the learner's log-probs are from the engine's, the KL to the reference when it is on, where the time
    went, the eval when there was one, and what went wrong (failed rewards, a skipped update)."""
    acc = "-" if m["accuracy"] is None else f"{m['accuracy']:.3f}"
    mismatch = m["logprob_mismatch_abs_mean"]
    parts = [_step(m["step"], steps), f"reward {m['reward_mean']:.3f} acc {acc}",
             f"len {m['response_len_mean']:.1f} trunc {m['truncation_rate']:.2f}",
             "mismatch -" if mismatch is None else f"mismatch {mismatch:.1e}"]
    if m.get("learner/kl_loss") is not None:
        parts.append(f"kl {m['learner/kl_loss']:.2e}")
    phases = {p: m[f"time_{p}_s"] for p in ("rollout", "reward", "learner", "sync")}
    # eval and checkpoint: what the phases do not account for. With the rollout queue (rl/rollout_queue.py) the
    # step holds only the wait for its batch (all of steps 1-2 when made inline, none when made ahead) and the
    # mismatch parts besides the learner and sync.
    accounted = sum(phases.values()) if "time_wait_s" not in m else \
        m["time_wait_s"] + m.get("time_mismatch_parts_s", 0.0) + phases["learner"] + phases["sync"]
    other = m["time_step_s"] - accounted
    parts.append(f"{m['time_step_s']:.1f}s: " + " ".join(f"{p} {t:.2f}" if t < 0.1 else f"{p} {t:.1f}"
                                                        for p, t in phases.items())
                 + (f" eval/ckpt {other:.1f}" if other >= 0.1 else ""))
    evals = {k[len("eval_accuracy_"):]: v for k, v in m.items() if k.startswith("eval_accuracy_") and v is not None}
    if evals:
        lenient = {k[len("eval_lenient_accuracy_"):]: v for k, v in m.items()
                   if k.startswith("eval_lenient_accuracy_") and v is not None}
        parts.append(f"eval {_fmt(evals)}" + (f" (lenient {_fmt(lenient)})" if lenient else ""))
    failed: dict[str, float] = {}  # samples each reward scored 0 because it raised or timed out
    for k, v in m.items():
        if k.startswith("reward/rewards/") and k.endswith(("/errors", "/timeouts")) and v:
            failed[k.split("/")[2]] = failed.get(k.split("/")[2], 0) + v
    if failed:  # the first failure of each kind was printed with its message (`_report_failures`)
        parts.append("reward failures: " + ", ".join(f"{name} {int(n)}" for name, n in failed.items()))
    if m.get("staleness_max"):
        parts.append(f"stale {m['staleness_mean']:.1f} versions (waited {m['time_wait_s']:.1f}s)")
    if m.get("samples_stale_dropped"):
        parts.append(f"{m['samples_stale_dropped']} samples too stale: dropped")
    if m.get("skipped_nonfinite"):
        parts.append("skipped: loss or gradients not finite")
    elif m["skipped"]:
        parts.append("skipped: no usable signal")
    return " | ".join(parts)
