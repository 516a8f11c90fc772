"""One correctness signal per task, separate from the training reward; every reward term logged on its own; every
dataset column reaching the rewards as a keyword list (TRL's convention).

Before: accuracy, eval_accuracy and the run's summary were "total reward > 0" (a 0.1 format bonus made every
anchored answer "right"; a penalty-only reward made nothing right), and a reward that needs a column
(`difficulty`) failed with a TypeError on every batch. Reward hosts run in-process; the loop test drives
`rl.loop.train` with a scripted rollout and a no-op learner, so only rewards and accuracy are real.
"""

import re
import textwrap

import pytest

from actors.reward_workers import ACCURACY_ENTRY, RewardHost
from rewards.loader import RewardLoadError
from rl.config import config_from_dict
from rl.data.jsonl import DataError
from rl.data.loaders import reward_columns

PROMPT = "Q: 37+5*3=? Put the answer in \\boxed{}.\nA:"
# right, wrong, the question copied into the box (a hack: 52 under math-verify's semantics), no anchor
COMPLETIONS = [" 5*3=15, 37+15=52. \\boxed{52}", " \\boxed{51}", " \\boxed{37+5*3}", " it is 52"]
REWARDS_PY = """
def penalty(prompts, completions, answers, **_):
    return [-1.0 if len(c) > 12 else 0.0 for c in completions]

def by_difficulty(prompts, completions, answers, difficulty):
    return [0.25 * d for d in difficulty]

def needs_units(prompts, completions, answers, *, units):
    return [1.0 if u == "cm" else 0.0 for u in units]
"""


def host(tmp_path, fns, accuracy="auto", task="arith"):
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent(REWARDS_PY))
    fns = [f if isinstance(f, dict) else {"fn": f} for f in fns]
    cfg = config_from_dict({"reward": {"fns": fns, "accuracy": accuracy, "num_workers": 1}})
    return RewardHost(cfg.reward, str(tmp_path), task)


def score(h, completions=COMPLETIONS, **columns):
    n = len(completions)
    try:
        return h.score([PROMPT] * n, completions, ["52"] * n, ["stop"] * n, columns or None)
    finally:
        h.close()


def test_accuracy_is_the_math_check_not_reward_above_zero(tmp_path):
    out = score(host(tmp_path, ["math", {"fn": "format", "weight": 0.1}]))
    assert out.rewards == pytest.approx([1.1, 0.1, 0.1, 0.0])
    assert out.correct == [True, False, False, False]  # "reward > 0" said 3 of 4
    assert out.metrics["rewards/math/mean"] == 0.25 and out.metrics["rewards/format_reward/mean"] == 0.75
    assert out.metrics["rewards/math/not_literal"] == 1.0  # the hack, counted


def test_a_penalty_only_reward_keeps_its_accuracy(tmp_path):
    out = score(host(tmp_path, ["my_rewards.py:penalty"]))
    assert out.rewards == [-1.0, 0.0, -1.0, 0.0]  # the check at weight 0 adds nothing to the reward
    assert out.correct == [True, False, False, False]  # "reward > 0" said 0 of 4
    assert out.metrics[f"rewards/{ACCURACY_ENTRY}/mean"] == 0.25 and out.metrics["rewards/penalty/mean"] == -0.5


def test_accuracy_named_in_config(tmp_path):
    fns = ["math", {"fn": "format", "weight": 0.1}]
    assert score(host(tmp_path, fns, accuracy="format")).correct == [True, True, True, False]
    assert score(host(tmp_path, fns, accuracy="none")).correct is None
    out = score(host(tmp_path, ["format"], accuracy="my_rewards.py:penalty"))  # a spec, run at weight 0
    assert out.rewards == [1.0, 1.0, 1.0, 0.0] and out.correct == [False] * 4
    named = score(host(tmp_path, [{"fn": "format", "name": "accuracy"}]))  # the check never takes a user's name
    assert named.correct == [True, False, False, False] and "rewards/accuracy_2/mean" in named.metrics
    with pytest.raises(RewardLoadError, match="reward.accuracy: 'maths'"):
        host(tmp_path, fns, accuracy="maths")


def test_the_arithmetic_task_scores_strictly_by_default(tmp_path):
    assert score(host(tmp_path, ["math"], task="arith")).rewards == [1.0, 0.0, 0.0, 0.0]
    # elsewhere the math reward keeps math-verify's semantics: the expression evaluates to the gold
    assert score(host(tmp_path, ["math"], task="jsonl")).rewards == [1.0, 0.0, 1.0, 0.0]
    lenient = {"fn": "math", "options": {"strict": False}}
    assert score(host(tmp_path, [lenient], task="arith")).rewards == [1.0, 0.0, 1.0, 0.0]


def test_dataset_columns_reach_rewards_as_keyword_lists(tmp_path):
    out = score(
        host(tmp_path, ["my_rewards.py:by_difficulty", "my_rewards.py:needs_units"]),
        difficulty=[1, 2, 3, 4],
        units=["cm", "m", "cm", None],
        source=["a"] * 4,
    )
    assert out.rewards == pytest.approx([1.25, 0.5, 1.75, 1.0])
    assert out.metrics["rewards/by_difficulty/errors"] == 0 and out.metrics["rewards/needs_units/errors"] == 0
    # a reward whose column is missing: a counted, named error, the batch still scored
    out = score(host(tmp_path, ["my_rewards.py:by_difficulty", "format"]))
    assert out.metrics["rewards/by_difficulty/errors"] == 4 and out.rewards == [1.0, 1.0, 1.0, 0.0]


def test_reward_columns():
    rows = [{"prompt": "p", "answer": "1", "difficulty": 2, "id": "a"}, {"prompt": "q", "answer": "2", "units": "cm"}]
    assert reward_columns(rows) == {"difficulty": [2, None], "id": ["a", None], "units": [None, "cm"]}
    with pytest.raises(DataError, match="completions"):
        reward_columns([{"prompt": "p", "answer": "1", "completions": "x"}])


# --- the loop: accuracy / eval_accuracy from the check, terms logged, columns passed --------------------------------


class ScriptedRollout:
    """Greedy: right on even problems, the question copied into the box on odd ones. Sampled: the four
    COMPLETIONS shapes in turn, for each prompt's own answer."""

    def __init__(self, tok):
        self.tok = tok

    def generate(self, prompts, params, min_version):
        from rl.samples.batch import Sample

        out = []
        for i, ids in enumerate(prompts):
            question = re.search(r"Q: ([0-9+*-]+)=", self.tok.decode(ids, skip_special_tokens=True)).group(1)
            answer = eval(question)  # digits and + - * only (checked by the regex)
            shapes = [f" \\boxed{{{answer}}}", f" \\boxed{{{answer + 1}}}", f" \\boxed{{{question}}}", f" {answer}"]
            for k in range(params.n):
                text = (shapes[0] if i % 2 == 0 else shapes[2]) if params.temperature == 0 else shapes[k % 4]
                resp = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
                out.append(Sample(ids, resp, [0.0] * len(resp), "stop", min_version, group_id=i, sample_index=k))
        return out

    def load_weights(self, path, version):
        return [version]

    def sync_weights(self, learner, version, weights_path):
        return [version]

    def check_health(self):
        return []


class NoLearner:
    def update(self, samples, advantages):
        return {"loss": 0.0}

    def mismatch_parts(self, samples, version):
        return {}

    def export_weights(self, path):
        return None  # a stand-in writes no weights (and so exports no policy/)


def test_loop_accuracy_and_eval_accuracy_use_the_check(tmp_path):
    from rl.data.tokenizer import build_tokenizer
    from rl.loop import train
    from rl.train.run_dir import RunDir

    (tmp_path / "my_rewards.py").write_text(textwrap.dedent(REWARDS_PY))
    cfg = config_from_dict(
        {
            "data": {"task": "arith", "difficulty": [1], "num_train": 64},
            "rollout": {"engine": "torch", "n_samples_per_prompt": 4},
            "reward": {
                "fns": [
                    {"fn": "math"},
                    {"fn": "format", "weight": 0.1},
                    {"fn": "my_rewards.py:by_difficulty", "weight": 0.0},
                ],
                "num_workers": 1,
            },
            "train": {"steps": 1, "prompts_per_step": 4, "eval_every": 1, "eval_n": 8, "checkpoint_every": 0},
            "logging": {"wandb_mode": "disabled", "progress": False},
        }
    )
    rewards = RewardHost(cfg.reward, str(tmp_path), cfg.data.task)
    run = RunDir(str(tmp_path / "run"))
    try:
        history = train(
            cfg, build_tokenizer(), ScriptedRollout(build_tokenizer()), NoLearner(), rewards, run, log=lambda *_: None
        )
    finally:
        rewards.close()
    step = history[-1]
    assert step["accuracy"] == 0.25  # "reward > 0" said 0.75
    assert step["reward_mean"] == pytest.approx((1.1 + 0.1 + 0.1 + 0.0) / 4)
    assert step["eval_accuracy"] == 0.5  # "reward > 0" said 1.0: the copied question gets 0.1
    assert step["reward/rewards/math/mean"] == 0.25 and step["reward/rewards/format_reward/mean"] == 0.75
    assert step["reward/rewards/by_difficulty/errors"] == 0 and step["reward/rewards/by_difficulty/mean"] == 0.25
    assert run.read_metrics()[0]["eval_accuracy"] == 0.5  # the baseline eval at step 0 too
    # both reads of every held-out eval, per problem, for pairing start and end (scripts/smollm_rl.py's summary)
    evals = run.read_evals()
    assert [e["step"] for e in evals] == [0, 1] and evals[0]["answers"] == evals[1]["answers"]
    soft = evals[-1]["modes"]["soft"]
    assert soft["strict"] == [1, 0] * 4 and len(soft["responses"]) == 8  # even problems right, anchored
    assert soft["lenient"][::2] == [1] * 4 and step["eval_lenient_accuracy"] == sum(soft["lenient"]) / 8
    assert step["eval_lenient_accuracy_soft"] == step["eval_lenient_accuracy"]
