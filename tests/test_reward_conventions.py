"""Reward functions written for TRL, verl or OpenRLHF run unchanged (rewards/conventions.py): each is called with
the arguments its library gives, its results come back as fbrl scores and metrics, and `auto` tells them apart by
signature. The last test runs two steps of the tiny job with a TRL reward that checks what it was handed."""

from __future__ import annotations

import asyncio

import pytest
import torch
from conftest import ROOT

from rewards.base import RewardSet
from rewards.conventions import adapt, detect
from rewards.loader import RewardLoadError, build_reward_set

# A TRL reward as its docs write them: chat completions read as completion[0]["content"], the ground truth from a
# nested column, TRL's keywords taken through **kwargs.
TRL_FILE = """
def exact(completions, reward_model, **kwargs):
    return [1.0 if c[0]["content"].strip() == r["ground_truth"] else 0.0 for c, r in zip(completions, reward_model)]


def abstain(completions, **kwargs):
    return [None if "?" in c[0]["content"] else 0.5 for c in completions]
"""

# verl's default layout: compute_score per completion, a dict whose `score` is the reward.
VERL_FILE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    ok = solution_str.strip().endswith(str(ground_truth))
    return {"score": float(ok), "acc": float(ok), "len": len(solution_str), "source": data_source}
"""


def test_auto_reads_each_library_from_the_signature():
    def fbrl(prompts, completions, answers, **kw): ...
    def fbrl_varargs(*args, **kw): ...
    def trl_plain(completions, **kwargs): ...
    def trl_ids(prompts, completions, completion_ids, **kwargs): ...
    def verl(data_source, solution_str, ground_truth, extra_info=None): ...
    def openrlhf(queries, prompts, labels): ...
    def too_few(prompts, completions): ...  # no **kwargs: neither fbrl's nor TRL's; fbrl's check names it

    got = {f.__name__: detect(f) for f in (fbrl, fbrl_varargs, trl_plain, trl_ids, verl, openrlhf, too_few)}
    assert got == {
        "fbrl": "fbrl",
        "fbrl_varargs": "fbrl",
        "trl_plain": "trl",
        "trl_ids": "trl",
        "verl": "verl",
        "openrlhf": "openrlhf",
        "too_few": "fbrl",
    }
    with pytest.raises(ValueError, match="convention: expected one of auto, fbrl, trl, verl, openrlhf"):
        adapt(fbrl, "trlx")


def test_trl_gets_chats_columns_ids_and_its_keywords_and_none_scores_zero():
    seen = {}

    def reward(prompts, completions, completion_ids, trainer_state, log_metric, answer, reward_model, **kwargs):
        seen.update(prompts=prompts, completions=completions, ids=completion_ids, step=trainer_state.global_step)
        seen.update(answer=answer, kwargs=sorted(kwargs))
        log_metric("judge_calls", 2)
        return [None if r["ground_truth"] == "x" else 1.0 for r in reward_model]

    fn, resolved = adapt(reward, "auto")
    assert resolved == "trl"
    chats = [[{"role": "user", "content": "1+1?"}], [{"role": "user", "content": "2+2?"}]]
    rs = RewardSet([fn], timeout_s=None)
    out = rs(
        ["<rendered 1>", "<rendered 2>"],
        ["2", "5"],
        ["2", "4"],
        finish_reasons=["stop", "length"],
        messages=chats,
        reward_model=[{"ground_truth": "2"}, {"ground_truth": "x"}],
        difficulty=[1, 2],
        completion_ids=[[7], [9, 9]],
    )
    assert seen["prompts"] == chats  # a chat row's prompt is its messages, as TRL's conversational data
    assert seen["completions"] == [[{"role": "assistant", "content": "2"}], [{"role": "assistant", "content": "5"}]]
    assert seen["ids"] == [[7], [9, 9]] and seen["step"] == 0 and seen["answer"] == ["2", "4"]
    assert seen["kwargs"] == ["difficulty"]  # dataset columns, not fbrl's own finish_reasons
    assert out.rewards == [1.0, 0.0] and not out.errors
    assert out.metrics["rewards/reward/none"] == 1.0 and out.metrics["rewards/reward/judge_calls"] == 2.0
    rs(["p"], ["c"], ["a"], reward_model=[{"ground_truth": "c"}])
    assert seen["step"] == 1 and seen["prompts"] == ["p"] and seen["completions"] == ["c"]  # plain rows: strings


def test_verl_compute_score_per_completion_dict_logged_and_async(tmp_path):
    (tmp_path / "verl_reward.py").write_text(VERL_FILE)
    rs = build_reward_set([{"fn": "verl_reward.py:compute_score"}], base_dir=tmp_path)
    out = rs(["p", "q"], ["so 4", "so 5"], [4, 4], data_source=["gsm8k", "gsm8k"], extra_info=[{"i": 0}, None])
    assert out.rewards == [1.0, 0.0] and not out.errors
    assert out.metrics["rewards/compute_score/acc"] == 0.5 and out.metrics["rewards/compute_score/len"] == 4.0

    calls = []

    async def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        calls.append(extra_info)
        await asyncio.sleep(0)
        return float(solution_str == ground_truth)

    fn, resolved = adapt(compute_score)
    assert resolved == "verl"
    out = RewardSet([fn], timeout_s=5)(
        ["p", "q"], ["a", "b"], ["a", "a"], extra_info=[None, {"k": 1}], difficulty=[3, 4]
    )
    assert out.rewards == [1.0, 0.0]
    assert calls == [{"extra_info": None, "difficulty": 3}, {"k": 1}]  # no extra_info column: the row's columns


def test_openrlhf_reward_func_dict_of_tensors():
    def reward_func(queries, prompts, labels):
        r = torch.tensor([float(q.endswith(lab)) for q, lab in zip(queries, labels)])
        return {"rewards": r, "scores": r, "extra_logs": {"hits": r}}

    fn, resolved = adapt(reward_func)
    assert resolved == "openrlhf"
    out = RewardSet([fn], timeout_s=None)(["1+1=", "2+2="], ["2", "5"], ["2", "4"])
    assert out.rewards == [1.0, 0.0] and out.metrics["rewards/reward_func/hits"] == 0.5


def test_conventions_from_config_entries_and_errors_name_the_reward(tmp_path):
    (tmp_path / "trl_rewards.py").write_text(TRL_FILE)
    rs = build_reward_set(
        [{"fn": "trl_rewards.py:exact"}, {"fn": "trl_rewards.py:abstain", "convention": "trl", "weight": 2.0}],
        base_dir=tmp_path,
    )
    chats = [[{"role": "user", "content": "p"}], [{"role": "user", "content": "q"}]]
    truth = [{"ground_truth": "4"}, {"ground_truth": "5"}]
    out = rs(["p", "q"], ["4", "what?"], ["4", "5"], messages=chats, reward_model=truth)
    assert out.rewards == [1.0 + 2 * 0.5, 0.0] and not out.errors
    with pytest.raises(RewardLoadError, match="trl_rewards.py:exact.*convention: expected one of"):
        build_reward_set([{"fn": "trl_rewards.py:exact", "convention": "trlx"}], base_dir=tmp_path)
    # a TRL function whose column is missing fails as any reward does: counted, named, scored 0 (the other scores)
    out = rs(["p"], ["4"], ["4"], messages=chats[:1])
    assert out.rewards == [2 * 0.5] and "exact" in out.errors[0] and "reward_model" in out.errors[0]


def test_tiny_job_trains_with_a_trl_reward(tmp_path):
    """Two steps of the tiny job through the real loop (torch engine, in-process learner) with a TRL reward that
    checks, on every call, that its completion_ids decode to its completions and that trainer_state counts calls."""
    from actors.local import LocalLearner, LocalRewards, LocalRollout
    from rl.config import load_config
    from rl.data.tokenizer import load_tokenizer
    from rl.loop import train
    from rl.train.run_dir import RunDir

    ckpt = ROOT / "checkpoints" / "tiny-arith-mixed"
    (tmp_path / "trl_job.py").write_text(
        "from transformers import AutoTokenizer\n"
        f"TOK = AutoTokenizer.from_pretrained({str(ckpt)!r})\n"
        "STEPS = []\n\n"
        "def correct(prompts, completions, completion_ids, trainer_state, answer, **kwargs):\n"
        "    assert [TOK.decode(i, skip_special_tokens=True) for i in completion_ids] == completions\n"
        "    STEPS.append(trainer_state.global_step)\n"
        "    assert STEPS == list(range(len(STEPS)))\n"
        "    return [float(str(a) in c) for c, a in zip(completions, answer)]\n"
    )
    cfg = load_config(
        str(ROOT / "configs" / "tiny.yaml"),
        [
            f"model.path={ckpt}",
            "rollout.engine=torch",
            "train.steps=2",
            "train.prompts_per_step=4",
            "train.eval_every=0",
            "train.checkpoint_every=0",
            f"reward.fns=[{{fn: {tmp_path / 'trl_job.py'}:correct}}]",
            "reward.accuracy=none",
            "logging.wandb_mode=disabled",
            "logging.progress=false",
            f"train.run_dir={tmp_path / 'run'}",
        ],
    )
    rewards = LocalRewards(cfg)
    try:
        history = train(
            cfg,
            load_tokenizer(cfg.model.path),
            LocalRollout(cfg),
            LocalLearner(cfg, "torch"),
            rewards,
            RunDir(cfg.train.run_dir),
            log=lambda *_: None,
        )
    finally:
        rewards.close()
    rows = [h for h in history if h.get("step", 0) > 0]
    assert len(rows) == 2
    for h in rows:
        assert h["reward/rewards/correct/errors"] == 0.0 and h["reward/rewards/correct/timeouts"] == 0.0, h
    assert any(h["reward/rewards/correct/mean"] > 0 for h in rows)  # the checkpoint half-solves the task


def test_a_completion_every_reward_declines_is_unscored():
    """TRL's `None` means "does not apply": a completion scored None by one function keeps the others' scores; one
    that every weighted function scores None is unscored (a weight-0 check does not count)."""

    def maybe_a(completions, **kwargs):
        return [None if c.startswith("skip") else 1.0 for c in completions]

    def maybe_b(completions, **kwargs):
        return [None if "b" not in c else 0.5 for c in completions]

    def check(prompts, completions, answers, **_):
        return [1.0] * len(completions)

    fa, _ = adapt(maybe_a, "trl")
    fb, _ = adapt(maybe_b, "trl")
    rs = RewardSet([fa, fb, (check, 0.0)], timeout_s=None)
    out = rs(["p"] * 4, ["skip", "skip b", "ok", "ok b"], ["a"] * 4)
    assert out.unscored == [True, False, False, False]
    assert out.rewards == [0.0, 0.5, 1.0, 1.5] and out.metrics["rewards/unscored"] == 1.0


def test_unscored_samples_leave_the_group_statistics_and_get_advantage_zero():
    import torch

    from rl import algos

    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    scored = torch.tensor([True, True, False, True, True, True])
    adv = algos.compute_advantages(rewards, groups, "grpo", 1e-6, scored)
    alone = algos.compute_advantages(rewards[:2], groups[:2], "grpo", 1e-6)  # group 0 without the unscored one
    assert adv[2] == 0 and torch.allclose(adv[:2], alone)
    assert torch.allclose(adv[3:], algos.compute_advantages(rewards[3:], groups[3:], "grpo", 1e-6))
    assert torch.equal(
        algos.compute_advantages(rewards, groups, "grpo", 1e-6, torch.zeros(6, dtype=torch.bool)), torch.zeros(6)
    )


def test_a_trl_reward_reads_chat_completions_and_a_nested_ground_truth(tmp_path):
    """The reward a TRL user has for verl-layout data: `completion[0]["content"]` of each conversational completion
    against the nested `reward_model["ground_truth"]` column, loaded from its file by `auto`."""
    (tmp_path / "trl_gsm8k.py").write_text(
        "def correct(completions, reward_model, **kwargs):\n"
        "    return [float(c[0]['content'].strip().endswith(rm['ground_truth'])) for c, rm in"
        " zip(completions, reward_model)]\n"
    )
    rs = build_reward_set([{"fn": "trl_gsm8k.py:correct"}], base_dir=tmp_path)
    chats = [[{"role": "user", "content": "2+3?"}], [{"role": "user", "content": "7-4?"}]]
    out = rs(
        ["<rendered>"] * 2,
        ["#### 5", "#### 4"],
        ["5", "3"],
        messages=chats,
        reward_model=[{"style": "rule", "ground_truth": "5"}, {"style": "rule", "ground_truth": "3"}],
    )
    assert out.rewards == [1.0, 0.0] and not out.errors


def test_a_new_convention_is_one_adapter(monkeypatch):
    """A convention is one `ADAPTERS` entry: a class that wraps a function written for it into fbrl's call."""
    from rewards import conventions

    class FirstCompletionOnly:  # a library that hands its reward one completion at a time
        def __init__(self, fn):
            self.fn = fn

        def __call__(self, prompts, completions, answers, **fields):
            return [float(self.fn(c)) for c in completions]

    monkeypatch.setitem(conventions.ADAPTERS, "test_single", FirstCompletionOnly)
    wrapped, resolved = adapt(len, "test_single")
    assert resolved == "test_single" and wrapped(["p", "q"], ["ab", "abc"], ["x", "y"]) == [2.0, 3.0]
    with pytest.raises(ValueError, match="convention: expected one of auto, fbrl, trl, verl, openrlhf, test_single"):
        adapt(len, "test_singel")
