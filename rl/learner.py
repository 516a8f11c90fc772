"""One learner rank's policy update, independent of how gradients are reduced.

`PolicyUpdater.update` turns a rank's share of a rollout batch into optimizer steps: log-probs from the
configured likelihood estimator, the GRPO-family loss from `rl.algos`, backward and step through a small
`Backend` — plain torch in one process (`TorchBackend`), DeepSpeed in `actors/learner.py`. The plan of
mini- and micro-batches is computed from the whole batch before sharding, so every rank makes the same number
of backward and step calls (a collective backend deadlocks otherwise) and token_mean is over the global batch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

from rl import algos
from rl.batch import LearnerBatch, Sample, collate
from rl.likelihood import get_estimator


# Loss metrics of a micro-batch are its share of the mini-batch loss: summed over micro-batches and ranks.
SUMMED_METRICS = ("loss", "pg_loss", "kl_loss")


class Backend(Protocol):
    world_size: int

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self) -> float:
        """Apply the accumulated gradients (summed over ranks); return the global grad norm."""


class TorchBackend:
    """One process: AdamW, gradient clipping; gradients accumulate over micro-batches by plain summation."""

    world_size = 1

    def __init__(self, model, lr: float, weight_decay: float = 0.0, betas=(0.9, 0.999), grad_clip: float = 1.0):
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=betas)
        self.grad_clip = grad_clip

    def backward(self, loss):
        loss.backward()

    def step(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip or float("inf"))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)


@dataclass
class UpdatePlan:
    """Rows of each optimizer step, and each rank's micro-batches within it (same count on every rank)."""
    minibatches: list[list[int]]
    micro_batches: int  # per rank per mini-batch

    def rank_micro_batches(self, minibatch: list[int], rank: int, world_size: int) -> list[list[int]]:
        mine = minibatch[rank::world_size]
        size = max(1, math.ceil(len(mine) / self.micro_batches)) if mine else 1
        return [mine[i * size:(i + 1) * size] for i in range(self.micro_batches)]


def plan_update(n_rows: int, mini_batches: int, world_size: int, micro_batch_size: int) -> UpdatePlan:
    mini_batches = max(1, min(mini_batches, n_rows))
    rows = list(range(n_rows))
    per = math.ceil(n_rows / mini_batches)
    minis = [rows[i * per:(i + 1) * per] for i in range(mini_batches) if rows[i * per:(i + 1) * per]]
    largest_share = max(math.ceil(len(m) / world_size) for m in minis)
    return UpdatePlan(minis, max(1, math.ceil(largest_share / micro_batch_size)))


def policy_loss_config(algo_cfg, max_tokens: int) -> algos.PolicyLossConfig:
    one_update = algo_cfg.ppo_epochs == 1 and algo_cfg.mini_batches == 1
    return algos.PolicyLossConfig(
        loss_type="reinforce" if one_update and algo_cfg.clip_ratio_c is None else "ppo",
        eps_low=algo_cfg.eps_low, eps_high=algo_cfg.eps_high, clip_ratio_c=algo_cfg.clip_ratio_c,
        agg_mode=algo_cfg.loss_agg, max_length=max_tokens, kl_coef=algo_cfg.kl_coef,
        kl_estimator=algo_cfg.kl_estimator, is_mode=algo_cfg.tis_mode if algo_cfg.tis_cap else None,
        is_cap=algo_cfg.tis_cap or 2.0)


class PolicyUpdater:
    """Holds the policy (and optional frozen reference) and runs one rank's share of an update."""

    def __init__(self, model, cfg, pad_id: int, ref_model=None):
        self.model, self.cfg, self.pad_id, self.ref_model = model, cfg, pad_id, ref_model
        self.estimator = get_estimator(cfg.likelihood.estimator)
        self.loss_cfg = policy_loss_config(cfg.algo, cfg.rollout.max_tokens)
        self.multiple_updates = cfg.algo.ppo_epochs * cfg.algo.mini_batches > 1

    def _logprobs(self, model, batch: LearnerBatch, with_entropy=False):
        r = self.cfg.rollout
        return self.estimator(model, batch, r.decode_mode, passes=self.cfg.likelihood.passes,
                              temperature=r.temperature or 1.0, with_entropy=with_entropy, top_k=max(r.top_k, 0),
                              top_p=r.top_p)

    def update(self, samples: list[Sample], advantages: list[float], backend: Backend,
               rank: int = 0) -> dict[str, float]:
        """`samples` / `advantages` are the whole batch (every rank gets the same list and takes its rows)."""
        replay = self.cfg.likelihood.estimator == "replay"
        batch = collate(samples, self.pad_id, with_states=replay)
        batch.extras["advantages"] = torch.tensor(advantages, dtype=torch.float32)
        plan = plan_update(len(batch), self.cfg.algo.mini_batches, backend.world_size,
                           self.cfg.learner.micro_batch_size)
        old_logp = None
        if self.multiple_updates:  # the behaviour policy is the learner before its first step
            with torch.no_grad():
                old_logp = self._logprobs(self.model, batch).logprobs
        ref_logp = None
        if self.loss_cfg.kl_coef > 0:
            with torch.no_grad():
                ref_logp = self._logprobs(self.ref_model, batch).logprobs
        sums: dict[str, float] = {}
        weights: dict[str, float] = {}
        grad_norms = []
        for _ in range(self.cfg.algo.ppo_epochs):
            for mini in plan.minibatches:
                tokens = int(batch.response_mask[mini].sum())
                seqs = int((batch.response_mask[mini].sum(-1) > 0).sum())
                for rows in plan.rank_micro_batches(mini, rank, backend.world_size):
                    loss, metrics = self._micro_loss(batch, rows, old_logp, ref_logp, tokens, seqs)
                    backend.backward(loss)
                    w = float(batch.response_mask[rows].sum()) if rows else 0.0
                    for k, v in metrics.items():
                        # A micro-batch's loss is its share of the global loss (already divided by the global
                        # count): those add up. Every other metric is a token-weighted mean.
                        add = v / len(plan.minibatches) / self.cfg.algo.ppo_epochs if k in SUMMED_METRICS else v * w
                        sums[k] = sums.get(k, 0.0) + add
                        weights[k] = weights.get(k, 0.0) + (1.0 if k in SUMMED_METRICS else w)
                grad_norms.append(backend.step())
        out = {k: sums[k] if k in SUMMED_METRICS else sums[k] / weights[k] for k in sums if weights[k] > 0}
        out["grad_norm"] = sum(grad_norms) / len(grad_norms)
        out["optimizer_steps"] = float(len(grad_norms))
        out["replay_approximate"] = float(replay and self.multiple_updates)
        return out

    def _micro_loss(self, batch: LearnerBatch, rows, old_logp, ref_logp, tokens, seqs):
        if not rows:  # this rank has no rows in this micro-batch: a zero loss keeps collectives in step
            return sum(p.sum() for p in self.model.parameters()) * 0.0, {}
        micro = batch.select(rows)
        out = self._logprobs(self.model, micro, with_entropy=True)
        dev = out.logprobs.device  # batches are built on the host; the model may sit on a GPU
        pick = lambda t: None if t is None else t[rows].to(dev)  # noqa: E731
        mask = micro.response_mask.to(dev)
        loss, metrics = algos.compute_policy_loss(
            out.logprobs, pick(old_logp), micro.extras["advantages"].to(dev), mask,
            self.loss_cfg, ref_logp=pick(ref_logp), engine_logp=micro.engine_logprobs.to(dev),
            entropy=out.entropy, global_token_count=tokens, global_seq_count=seqs)
        if self.cfg.algo.entropy_coef and out.entropy is not None:
            loss = loss - self.cfg.algo.entropy_coef * (out.entropy * mask).sum() / max(tokens, 1)
        return loss, metrics
