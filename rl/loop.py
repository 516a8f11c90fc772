"""The RL loop: prompts → rollouts → rewards → advantages → update → weight sync → metrics / eval / checkpoint.

Written against the worker interfaces of `rl/workers.py`, so the same function drives in-process workers and Ray
actor groups (`actors/launch.py` builds either). One step is synchronous (shared/DESIGN.md §7): the engines
generate with policy version v, the learner updates once per rollout batch, and the new weights are tagged v+1
before the next rollout asks for them (`min_version`), so no sample is ever drawn from a stale policy.
"""
from __future__ import annotations

import hashlib
import os
import time

import torch

from rl import algos
from rl.batch import SamplingParams
from rl.config import Config
from rl.data.loaders import PromptSampler, encode_prompt, load_task_split, reward_columns
from rl.run import RunDir
from rl.workers import LearnerWorkers, RewardWorkers, RolloutWorkers


def sampling_params(cfg: Config, eos_id: int, greedy: bool = False, decode_mode: str | None = None, seed=None):
    r = cfg.rollout
    return SamplingParams(
        n=1 if greedy else r.n_samples_per_prompt, temperature=0.0 if greedy else r.temperature,
        top_p=1.0 if greedy else r.top_p, top_k=0 if greedy or r.top_k < 0 else r.top_k, max_tokens=r.max_tokens,
        stop_token_ids=(eos_id,), seed=seed, decode_mode=decode_mode or r.decode_mode,
        record_states=not greedy and cfg.likelihood.estimator == "replay",
        states_dtype="bfloat16" if r.record_states_dtype == "bf16" else "float32")


def evaluate(cfg, rows, tokenizer, rollout: RolloutWorkers, rewards: RewardWorkers, version: int) -> dict:
    """Greedy held-out accuracy per decode mode: the fraction of problems the task's correctness check
    (`reward.accuracy`) calls right — never "reward > 0". Empty when accuracy is off."""
    out = {}
    prompts = [encode_prompt(tokenizer, r) for r in rows]
    for mode in cfg.train.eval_decode_modes:
        samples = rollout.generate(prompts, sampling_params(cfg, tokenizer.eos_token_id, True, mode), version)
        texts = [tokenizer.decode(s.response_ids, skip_special_tokens=True) for s in samples]
        scored = rewards.score([r["prompt"] for r in rows], texts, [r["answer"] for r in rows],
                               [s.finish_reason for s in samples], reward_columns(rows))
        if scored.correct is None:
            return {}
        out[mode] = sum(scored.correct) / len(scored.correct)
    return out


def train(cfg: Config, tokenizer, rollout: RolloutWorkers, learner: LearnerWorkers, rewards: RewardWorkers,
          run: RunDir, log=print, progress=None) -> list[dict]:
    train_rows = load_task_split(cfg.data, "train", tokenizer=tokenizer)
    eval_rows = load_task_split(cfg.data, "test", n=cfg.train.eval_n, tokenizer=tokenizer)
    reward_columns(train_rows + eval_rows)  # a column that would shadow a reward argument fails now, not at step 1
    sampler = PromptSampler(train_rows, seed=cfg.train.seed)
    eos = tokenizer.eos_token_id
    step, version = 0, 0

    if cfg.train.resume:  # continue at the next step with the same data order, RNGs, weights and optimizer
        run.check_resume_config(cfg)
        state = run.load_checkpoint(learner)
        step, version = state["step"], state["version"]
        sampler.load_state_dict(state["sampler"])
        run.truncate_metrics_after(step)
        log(f"resumed {run.path} at step {step} (policy version {version})")
    else:
        run.write_config(cfg)
    version += 1  # engines start from the checkpoint file, so push the learner's weights once, tagged
    _sync(learner, rollout, run, version)

    if step == 0 and cfg.train.eval_every > 0:
        acc = evaluate(cfg, eval_rows, tokenizer, rollout, rewards, version)
        run.log_metrics({"step": 0, **{f"eval_accuracy_{m}": a for m, a in acc.items()},
                         "eval_accuracy": acc.get(cfg.train.eval_decode_modes[0])})
        log(f"step 0 | held-out greedy accuracy {_fmt(acc)}")

    history = []
    while step < cfg.train.steps:
        step += 1
        t_step = time.perf_counter()

        # 1. rollouts: G samples per prompt from policy `version`
        rows = sampler.next(cfg.train.prompts_per_step)
        prompts = [encode_prompt(tokenizer, r) for r in rows]
        t0 = time.perf_counter()
        seed = cfg.train.seed * 1_000_003 + step
        samples = rollout.generate(prompts, sampling_params(cfg, eos, seed=seed), min_version=version)
        time_rollout = time.perf_counter() - t0
        preempted = sum(s.preempted for s in samples)
        samples = [s for s in samples if not s.preempted]  # their recurrent state was lost: never train on them

        # 2. rewards
        t0 = time.perf_counter()
        completions = [tokenizer.decode(s.response_ids, skip_special_tokens=True) for s in samples]
        sample_rows = [rows[s.group_id] for s in samples]
        scored = rewards.score([r["prompt"] for r in sample_rows], completions, [r["answer"] for r in sample_rows],
                               [s.finish_reason for s in samples], reward_columns(sample_rows))
        time_reward = time.perf_counter() - t0
        reward = torch.tensor(scored.rewards, dtype=torch.float32)
        lengths = torch.tensor([s.response_len for s in samples], dtype=torch.float32)
        reward_metrics = dict(scored.metrics)
        if cfg.algo.overlong_buffer > 0:  # a reward term of its own, logged like the others
            penalty = algos.overlong_penalty(lengths, cfg.rollout.max_tokens, cfg.algo.overlong_buffer,
                                             cfg.algo.overlong_factor)
            reward = reward + penalty
            reward_metrics["rewards/overlong_penalty/mean"] = float(penalty.mean()) if len(samples) else 0.0

        # 3. advantages per prompt group; groups with no signal are dropped if asked
        groups = torch.tensor([s.group_id for s in samples])
        advantages = algos.compute_advantages(reward, groups, cfg.algo.adv_estimator, cfg.algo.adv_eps)
        has_signal, equal_groups = algos.dynamic_sampling_mask(reward, groups)
        keep = has_signal if cfg.algo.dynamic_sampling else torch.ones(len(samples), dtype=torch.bool)
        dropped = equal_groups if cfg.algo.dynamic_sampling else 0
        # Every group equal ⇒ every advantage is 0: an optimizer step would be a momentum-only update. Skip it.
        skip = len(samples) == 0 or algos.no_usable_signal(has_signal, (lengths > 0)[:, None])

        # 4. learner update, then the new weights go to every engine as version + 1
        t0 = time.perf_counter()
        learner_metrics = {}
        if not skip:
            kept = keep.nonzero().flatten().tolist()
            learner_metrics = learner.update([samples[i] for i in kept], advantages[kept].tolist())
        time_learner = time.perf_counter() - t0
        t0 = time.perf_counter()
        if not skip:
            version += 1
            _sync(learner, rollout, run, version)
        time_sync = time.perf_counter() - t0

        metrics = {
            "step": step, "policy_version": version, "skipped": int(skip),
            "prompts_digest": hashlib.sha256("\x00".join(r["prompt"] for r in rows).encode()).hexdigest()[:16],
            "reward_mean": float(reward.mean()) if len(samples) else 0.0,
            "accuracy": None if scored.correct is None else sum(scored.correct) / max(len(scored.correct), 1),
            "response_len_mean": float(lengths.mean()) if len(samples) else 0.0,
            "truncation_rate": sum(s.truncated for s in samples) / max(len(samples), 1),
            "groups_dropped": dropped, "samples_preempted": preempted,
            "logprob_mismatch_abs_mean": learner_metrics.get("mismatch/abs_logp_diff"),
            "time_rollout_s": time_rollout, "time_reward_s": time_reward, "time_learner_s": time_learner,
            "time_sync_s": time_sync,
            **{f"reward/{k}": v for k, v in reward_metrics.items()},
            **{f"learner/{k}": v for k, v in learner_metrics.items()},
        }
        if cfg.train.eval_every > 0 and (step % cfg.train.eval_every == 0 or step == cfg.train.steps):
            acc = evaluate(cfg, eval_rows, tokenizer, rollout, rewards, version)
            metrics["eval_accuracy"] = acc.get(cfg.train.eval_decode_modes[0])
            metrics.update({f"eval_accuracy_{m}": a for m, a in acc.items()})
        if cfg.train.checkpoint_every > 0 and (step % cfg.train.checkpoint_every == 0 or step == cfg.train.steps):
            run.save_checkpoint(step, learner, {"version": version, "sampler": sampler.state_dict()})
        if step == cfg.train.steps or (cfg.train.checkpoint_every > 0 and step % cfg.train.checkpoint_every == 0):
            # RUN_DIR/policy/: the current weights as a save_pretrained dir, exported here (only the file transport
            # writes the weights file at every sync)
            path = learner.export_weights(_weights_file(run))
            if path and os.path.isfile(path):  # (a learner stand-in in tests may export no file)
                run.export_policy(path, cfg.model.path, cfg.model.tokenizer)
        metrics["time_step_s"] = time.perf_counter() - t_step
        run.log_metrics(metrics)
        history.append(metrics)
        log(_console_line(metrics))
        if progress is not None:
            progress(metrics)
    return history


def _weights_file(run: RunDir) -> str:
    return str(run.path.absolute() / "weights" / "policy.safetensors")  # absolute: learner rank 0 writes it


def _sync(learner: LearnerWorkers, rollout: RolloutWorkers, run: RunDir, version: int) -> None:
    """The learner's weights onto every engine as `version`, by the workers' transport (`rollout.weight_sync`:
    the file `_weights_file`, Ray's object store, vLLM's NCCL / IPC transfer; actors/weight_sync.py)."""
    versions = rollout.sync_weights(learner, version, _weights_file(run))
    if any(v != version for v in versions):
        raise RuntimeError(f"weight sync: engines report versions {versions}, expected {version}")


def _fmt(acc: dict) -> str:
    return " ".join(f"{m}={a:.3f}" for m, a in acc.items())


def _console_line(m: dict) -> str:
    mismatch = m["logprob_mismatch_abs_mean"]
    acc = "-" if m["accuracy"] is None else f"{m['accuracy']:.3f}"
    parts = [f"step {m['step']}", f"reward {m['reward_mean']:.3f}", f"acc {acc}",
             f"len {m['response_len_mean']:.1f}",
             f"mismatch {mismatch:.2e}" if mismatch is not None else "mismatch -",
             f"rollout {m['time_rollout_s']:.1f}s learner {m['time_learner_s']:.1f}s sync {m['time_sync_s']:.2f}s"]
    if m.get("eval_accuracy") is not None:
        parts.append(f"eval {m['eval_accuracy']:.3f}")
    if m["skipped"]:
        parts.append("(no usable signal: optimizer step skipped)")
    return " | ".join(parts)
