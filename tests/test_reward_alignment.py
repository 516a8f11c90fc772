"""One reward score lands on exactly one sample, the one it scored, through the whole loop: engines (two, so the
request is split into chunks and merged back), the reward set (a pool of two workers, which may finish out of
order), the stale-sample filter and dynamic sampling (both select rows), the advantages and the learner.

The reward is a function of the completion's own text, so a score that moved to another sample
(a shifted index after a filter, a chunk merged in the wrong order, a pool answer put back at the wrong row) gives
the learner advantages that differ from those recomputed from what each sample says.
"""

from __future__ import annotations

import zlib

import torch
from conftest import ROOT, TINY_ARITH_MIXED

CKPT = str(TINY_ARITH_MIXED)

REWARD = """
import zlib


def fingerprint(prompts, completions, answers, **kwargs):
    # a score in (0, 1) that the completion's text determines
    return [(zlib.crc32(c.encode()) % 997 + 1) / 999 for c in completions]
"""


class Recording:
    """An in-process learner that keeps what each update got."""

    def __init__(self, inner):
        self.inner, self.updates = inner, []

    def update(self, samples, advantages):
        self.updates.append(
            ([(list(s.prompt_ids), list(s.response_ids), s.group_id) for s in samples], list(advantages))
        )
        return self.inner.update(samples, advantages)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class Lagging:
    """Two engines' rollout whose 2nd training request comes back with a third of its samples tagged 5 versions
    old: the loop drops them (split_stale), so the scores of the rest must be selected with them."""

    def __init__(self, inner):
        self.inner, self.requests = inner, 0

    def generate(self, prompts, params, min_version):
        out = self.inner.generate(prompts, params, min_version)
        if params.temperature > 0:
            self.requests += 1
            if self.requests == 2:
                for s in out[::3]:
                    s.policy_version -= 5
        return out

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_each_score_reaches_the_learner_with_its_own_sample(tmp_path):
    from actors.local import LocalLearner, LocalRewards, LocalRollout
    from rl import algos
    from rl.config import load_config
    from rl.data.tokenizer import load_tokenizer
    from rl.loop import train
    from rl.train.run_dir import RunDir

    (tmp_path / "fp.py").write_text(REWARD)
    cfg = load_config(
        str(ROOT / "configs" / "tiny.yaml"),
        [
            f"model.path={CKPT}",
            "rollout.engine=torch",
            "rollout.num_engines=2",
            "learner.num_workers=1",
            "train.prompts_per_step=5",
            "rollout.n_samples_per_prompt=3",
            "train.eval_every=0",
            "train.steps=3",
            "train.checkpoint_every=0",
            "train.mismatch_parts_frac=0",
            "algo.dynamic_sampling=true",
            f"reward.fns=[{{fn: {tmp_path / 'fp.py'}:fingerprint}}]",
            "reward.num_workers=2",
            "reward.accuracy=none",
            "logging.wandb_mode=disabled",
            "logging.progress=false",
            f"train.run_dir={tmp_path / 'run'}",
        ],
    )
    tokenizer = load_tokenizer(cfg.model.path)
    rewards = LocalRewards(cfg)
    learner = Recording(LocalLearner(cfg, "torch"))
    try:
        history = train(
            cfg, tokenizer, Lagging(LocalRollout(cfg)), learner, rewards, RunDir(cfg.train.run_dir), log=lambda *_: None
        )
    finally:
        rewards.close()
    assert history[1]["samples_stale_dropped"] == 5  # the filter did select rows
    assert len(learner.updates) >= 2
    for rows, advantages in learner.updates:
        # the score each sample's own text gets, then the advantages the loop must have computed from them
        mine = torch.tensor([fingerprint(tokenizer.decode(r, skip_special_tokens=True)) for _, r, _ in rows])
        groups = torch.tensor([g for _, _, g in rows])
        want = algos.compute_advantages(mine, groups, cfg.algo.adv_estimator, cfg.algo.adv_eps)
        assert torch.allclose(torch.tensor(advantages, dtype=torch.float32), want, atol=1e-6), (advantages, want)


def fingerprint(completion: str) -> float:
    return (zlib.crc32(completion.encode()) % 997 + 1) / 999
