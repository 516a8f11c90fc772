"""The held-out evaluation during training: greedy accuracy per decode mode on the task's test split, through
the same rollout and reward workers the steps use, with the evaluator `fbrl eval` uses (`rl.train.evaluator`)."""

from __future__ import annotations

from rl.data.loaders import encode_prompt, reward_columns
from rl.train.evaluator import decode_and_score
from rl.train.requests import sampling_params
from rl.train.run_dir import RunDir
from rl.train.workers import RewardWorkers, RolloutWorkers


def heldout_accuracy(
    cfg,
    rows,
    tokenizer,
    rollout: RolloutWorkers,
    rewards: RewardWorkers,
    version: int,
    encode=None,
    run: RunDir | None = None,
    step: int | None = None,
    log=None,
    episodes=None,
) -> tuple[dict, dict]:
    """Greedy held-out accuracy per decode mode under two reads: ({mode: the fraction of problems the task's
    correctness check (`reward.accuracy`) calls right — never "reward > 0"}, {mode: the lenient read, the last
    number in the response (`rl.train.evaluator.last_number_score`)}). Both empty when accuracy is off. With `run`, the
    per-problem outcomes and responses go to RUN_DIR/eval/step_<step>.json, so two evaluations pair up.
    `episodes` (a job with a tool environment, rl/train/multiturn.py): each problem is a greedy episode, its tool
    calls recorded beside it."""
    strict, lenient, record = {}, {}, {}
    prompts = [encode(r) if encode else encode_prompt(tokenizer, r) for r in rows]

    def correct(chunk_rows, texts, samples):  # the task's correctness check, as the reward workers apply it
        return rewards.score(
            [r["prompt"] for r in chunk_rows],
            texts,
            [r["answer"] for r in chunk_rows],
            [s.finish_reason for s in samples],
            reward_columns(chunk_rows),
        ).correct

    # in chunks of two engine batches, each reported: a long held-out eval is minutes, never silent ones
    chunk = 2 * cfg.rollout.vllm.max_num_seqs * cfg.rollout.num_engines
    for mode in cfg.train.eval_decode_modes:
        params = sampling_params(cfg, tokenizer.eos_token_id, True, mode)
        calls = []

        def generate(ids, first, params=params):
            if episodes is None:
                return rollout.generate(ids, params, version)
            samples = episodes(ids, rows[first : first + len(ids)], params, version)
            calls.extend(s.episode["tool_calls"] for s in samples)
            return samples

        outcomes = decode_and_score(
            generate,
            prompts,
            rows,
            tokenizer,
            correct,
            chunk=chunk,
            log=log,
            label=f"eval {mode}",
        )
        if outcomes is None:
            return {}, {}
        greedy = [group[0] for group in outcomes]
        record[mode] = {
            "strict": [int(o.correct) for o in greedy],
            "lenient": [int(o.lenient) for o in greedy],
            "truncated": [int(o.truncated) for o in greedy],
            "responses": [o.text for o in greedy],
            **({"tool_calls": calls} if episodes is not None else {}),
        }
        strict[mode] = sum(record[mode]["strict"]) / len(greedy)
        lenient[mode] = sum(record[mode]["lenient"]) / len(greedy)
    if run is not None:
        run.write_eval(
            step,
            {
                "step": step,
                "policy_version": version,
                "answers": [r["answer"] for r in rows],
                "questions": [r.get("question", r["prompt"]) for r in rows],
                "modes": record,
            },
        )
    return strict, lenient
