"""The held-out evaluation during training: greedy accuracy per decode mode on the task's test split, through
the same rollout and reward workers the steps use (`fbrl eval` evaluates a checkpoint offline: rl/evaluate.py)."""
from __future__ import annotations

import time

from rl.data.loaders import encode_prompt, reward_columns
from rl.evaluate import last_number_score
from rl.run import RunDir
from rl.sampling import sampling_params
from rl.workers import RewardWorkers, RolloutWorkers


def heldout_accuracy(cfg, rows, tokenizer, rollout: RolloutWorkers, rewards: RewardWorkers, version: int,
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
