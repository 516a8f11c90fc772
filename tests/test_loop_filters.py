"""The loop's safety filters, driven through `rl.loop.train` with scripted workers: what reaches the learner, and
when the policy version moves.

The rollout returns a scripted batch (response length, preempted flag per sample), the reward is scripted per
(prompt, sample) and the learner records what it is given. The default config never exercises these paths
(dynamic sampling and the overlong penalty are off, a real engine rarely preempts), so before these tests a
loop that trained on preempted samples, ignored `algo.dynamic_sampling`, flipped the overlong penalty's sign or
stepped on a batch with no signal passed the whole suite.
"""

from __future__ import annotations

import pytest
import torch

from rl.config import config_from_dict
from rl.data.tokenizer import build_tokenizer
from rl.samples.batch import Sample
from rl.train.workers import Scores

MAX_TOKENS = 8


class Script:
    """Per prompt i (0..P-1) and sample k: (reward, response length, preempted)."""

    def __init__(self, table):
        self.table = table  # table[i][k] = (reward, length, preempted)
        self.last: list[Sample] = []


class ScriptedRollout:
    def __init__(self, script: Script):
        self.script, self.loads = script, []

    def generate(self, prompts, params, min_version):
        out = []
        for i, ids in enumerate(prompts):
            for k in range(params.n):
                _, length, preempted = self.script.table[i][k]
                resp = [10 + (k % 5)] * length
                out.append(
                    Sample(
                        ids,
                        resp,
                        [-1.0] * length,
                        "length" if length >= MAX_TOKENS else "stop",
                        min_version,
                        group_id=i,
                        sample_index=k,
                        preempted=preempted,
                    )
                )
        self.script.last = out
        return out

    def load_weights(self, path, version):
        self.loads.append(version)
        return [version]

    def sync_weights(self, learner, version, weights_path):  # the file transport's steps (actors/weight_sync.py)
        return self.load_weights(learner.export_weights(weights_path), version)

    def check_health(self):  # in-process, as actors.local.LocalRollout: nothing to replace
        return []


class ScriptedRewards:
    def __init__(self, script: Script):
        self.script = script

    def score(self, prompts, completions, answers, finish_reasons, columns=None):
        kept = [s for s in self.script.last if not s.preempted]  # the loop scores the non-preempted ones, in order
        assert len(kept) == len(completions), "the loop scored a preempted sample"
        r = [float(self.script.table[s.group_id][s.sample_index][0]) for s in kept]
        return Scores(r, None, {})


class RecordingLearner:
    def __init__(self):
        self.calls = []

    def update(self, samples, advantages):
        self.calls.append((list(samples), list(advantages)))
        return {"mismatch/abs_logp_diff": 0.0}

    def mismatch_parts(
        self, samples, version
    ):  # the diagnostic of rl/estimators/mismatch_parts.py: nothing to take apart
        return {}

    def export_weights(self, path):
        return None  # a stand-in writes no weights (and so exports no policy/)


def run_loop(tmp_path, table, steps=1, **algo):
    from rl.loop import train
    from rl.train.run_dir import RunDir

    cfg = config_from_dict(
        {
            "data": {"task": "arith", "difficulty": [1], "num_train": 64},
            "rollout": {"engine": "torch", "n_samples_per_prompt": len(table[0]), "max_tokens": MAX_TOKENS},
            "algo": algo,
            "train": {"steps": steps, "prompts_per_step": len(table), "eval_every": 0, "checkpoint_every": 0},
            "logging": {"wandb_mode": "disabled", "progress": False},
        }
    )
    script = Script(table)
    rollout, learner = ScriptedRollout(script), RecordingLearner()
    history = train(
        cfg,
        build_tokenizer(),
        rollout,
        learner,
        ScriptedRewards(script),
        RunDir(str(tmp_path / "run")),
        log=lambda *_: None,
    )
    return history, rollout, learner


def test_all_equal_batch_takes_no_step_and_keeps_the_version(tmp_path):
    # every group's rewards equal (one all-1, one all-0): every advantage is 0, an optimizer step would be noise
    table = [[(1.0, 3, False)] * 4, [(0.0, 5, False)] * 4]
    history, rollout, learner = run_loop(tmp_path, table, steps=2)
    assert learner.calls == [], "the learner was called on a batch with no signal"
    assert rollout.loads == [1], "weights were re-synced (a version bump) without an update"
    assert [m["skipped"] for m in history] == [1, 1]
    assert [m["policy_version"] for m in history] == [1, 1]


def test_a_batch_with_signal_steps_and_bumps_the_version(tmp_path):
    table = [[(1.0, 3, False), (0.0, 3, False), (0.0, 3, False), (0.0, 3, False)]]
    history, rollout, learner = run_loop(tmp_path, table, steps=2)
    assert len(learner.calls) == 2 and rollout.loads == [1, 2, 3]
    assert [m["policy_version"] for m in history] == [2, 3] and [m["skipped"] for m in history] == [0, 0]


def test_preempted_samples_never_reach_the_learner(tmp_path):
    # prompt 0: sample 1 (the only other reward-1 one besides 0) preempted; prompt 1: two preempted
    table = [
        [(1.0, 3, False), (1.0, 4, True), (0.0, 3, False), (0.0, 3, False)],
        [(0.0, 2, True), (1.0, 2, False), (0.0, 2, False), (1.0, 6, True)],
    ]
    history, _, learner = run_loop(tmp_path, table)
    ((samples, adv),) = learner.calls
    assert not any(s.preempted for s in samples)
    assert sorted((s.group_id, s.sample_index) for s in samples) == [(0, 0), (0, 2), (0, 3), (1, 1), (1, 2)]
    assert history[0]["samples_preempted"] == 3
    # the advantages are those of the kept samples' groups (GRPO over 3 and 2 samples), not of the full groups
    by_id = {(s.group_id, s.sample_index): a for s, a in zip(samples, adv)}
    assert by_id[(0, 0)] == pytest.approx(2 / 3 / (1 / 3) ** 0.5, rel=1e-4)  # rewards 1, 0, 0: mean 1/3, std 1/√3
    assert by_id[(1, 1)] == pytest.approx(0.5 / 0.5**0.5, rel=1e-4)  # rewards 1, 0: mean 1/2, std 1/√2


@pytest.mark.parametrize("dynamic_sampling", [True, False])
def test_dynamic_sampling_decides_whether_equal_groups_are_trained(tmp_path, dynamic_sampling):
    table = [
        [(1.0, 3, False), (0.0, 3, False), (1.0, 3, False), (0.0, 3, False)],  # signal
        [(1.0, 3, False)] * 4,  # all right: no signal
        [(0.0, 3, False)] * 4,
    ]  # all wrong: no signal
    history, _, learner = run_loop(tmp_path, table, dynamic_sampling=dynamic_sampling)
    ((samples, adv),) = learner.calls
    groups = sorted({s.group_id for s in samples})
    if dynamic_sampling:
        assert groups == [0] and len(samples) == 4 and history[0]["groups_dropped"] == 2
    else:
        assert groups == [0, 1, 2] and len(samples) == 12 and history[0]["groups_dropped"] == 0
        assert all(a == 0.0 for s, a in zip(samples, adv) if s.group_id != 0)


def test_overlong_penalty_lowers_the_reward_of_long_responses(tmp_path):
    # equal task reward; lengths 3 (outside the buffer), 6 and 7 (inside: -(6-4)/4, -(7-4)/4), 8 (at max: -1)
    table = [[(1.0, 3, False), (1.0, 6, False), (1.0, 7, False), (1.0, 8, False)]]
    history, _, learner = run_loop(tmp_path, table, overlong_buffer=4, overlong_factor=1.0)
    ((samples, adv),) = learner.calls
    by_len = {s.response_len: a for s, a in zip(samples, adv)}
    assert by_len[3] > by_len[6] > by_len[7] > by_len[8], by_len  # shorter is better
    assert by_len[3] > 0 > by_len[8]
    penalties = [0.0, -0.5, -0.75, -1.0]
    assert history[0]["reward/rewards/overlong_penalty/mean"] == pytest.approx(sum(penalties) / 4)
    assert history[0]["reward_mean"] == pytest.approx(1.0 + sum(penalties) / 4)
    # the GRPO advantages of rewards 1 + penalty, by hand (unbiased std, eps 1e-6)
    r = torch.tensor([1.0 + p for p in penalties], dtype=torch.float64)
    expected = (r - r.mean()) / (r.std() + 1e-6)
    assert [by_len[n] for n in (3, 6, 7, 8)] == pytest.approx(expected.tolist(), rel=1e-5)
