"""One learner rank's policy update, independent of how gradients are reduced.

`PolicyUpdater.update` turns a rank's share of a rollout batch into optimizer steps: log-probs from the
configured likelihood estimator, the GRPO-family loss from `rl.algos`, backward and step through a small
`Backend` — plain torch in one process (`TorchBackend`), DeepSpeed in `actors/learner_rank.py`.

Micro-batches by token budget (`plan_update`). The plan is computed from the whole batch's row lengths before
sharding, so every rank makes the same number of forward, backward and step calls (a collective backend
deadlocks otherwise; a rank short of rows runs empty micro-batches) and token_mean is over the global batch.
Within a mini-batch, rows go to ranks balanced by tokens, and each rank's rows, sorted by length, are cut into
micro-batches of at most `learner.micro_batch_size` rows, `learner.max_tokens_per_micro_batch` padded tokens
(rows x longest row: the decoder stack's activations) and `learner.max_response_tokens_per_micro_batch` response
tokens (the estimators compute logits at real response tokens only: the [tokens, vocab] log-softmax). Rows of
similar length share a micro-batch, so little padding is left. The same micro-batches serve the old (behaviour)
log-probs, the reference's and the policy's, and every micro-batch is collated from the samples when it runs:
no tensor spans the whole batch, so a step's peak memory does not grow with the rollout batch.

The reference model (kl_coef > 0) is scored with its own recurrence (`likelihood.ref_estimator`: `exact`, or
`kpass` with its error against exact reported on a few rows per step as `ref_kpass_abs_err`), never with the
policy's recorded states: an FBT's latent states are the model's own, and feeding the policy's to the reference
biases the KL (k3 0.0017 against a true 0.0036 at 1 % weight noise, 0.070 vs 0.349 at 5 %).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Protocol

import torch

from rl import algos
from rl.config import tis_cap_in_force
from rl.estimators.likelihood import get_estimator, needs_recorded_states
from rl.model.fusion import dropout_off
from rl.samples.batch import LearnerBatch, Sample, collate
from rl.train.update_plan import SUMMED_METRICS, UpdatePlan, plan_for

KPASS_CHECK_ROWS = 4  # rows per step on which a kpass reference is also run exactly, for its error


class Backend(Protocol):
    world_size: int

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self) -> float:
        """Apply the accumulated gradients (summed over ranks); return the global grad norm. A non-finite norm
        means the step was skipped (the gradients are dropped, the weights and optimizer state unchanged)."""


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
        if torch.isfinite(norm):  # else skip, as DeepSpeed does: one NaN would poison the weights and Adam's moments
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)


def policy_loss_config(algo_cfg, max_tokens: int) -> algos.PolicyLossConfig:
    loss_type = algo_cfg.policy_loss
    if loss_type == "auto":
        one_update = algo_cfg.ppo_epochs == 1 and algo_cfg.mini_batches == 1
        loss_type = "reinforce" if one_update and algo_cfg.clip_ratio_c is None else "ppo"
    return algos.PolicyLossConfig(
        loss_type=loss_type,
        eps_low=algo_cfg.eps_low,
        eps_high=algo_cfg.eps_high,
        clip_ratio_c=algo_cfg.clip_ratio_c,
        agg_mode=algo_cfg.loss_agg,
        max_length=max_tokens,
        kl_coef=algo_cfg.kl_coef,
        kl_estimator=algo_cfg.kl_estimator,
        is_mode=is_correction_mode(algo_cfg),
        is_level=algo_cfg.tis_level,
        is_cap=algo_cfg.tis_cap if isinstance(algo_cfg.tis_cap, (int, float)) else 2.0,
        is_bounds=tuple(algo_cfg.tis_bounds),
    )


def is_correction_mode(algo_cfg) -> str | None:
    """The off-policy correction in force: `truncate` needs `algo.tis_cap`; `mask` and `mis` use
    `algo.tis_bounds` and are on whenever chosen."""
    if algo_cfg.tis_mode == "truncate":  # (an unresolved `auto`, outside load_config: off)
        return "truncate" if isinstance(algo_cfg.tis_cap, (int, float)) else None
    return algo_cfg.tis_mode


class PolicyUpdater:
    """Holds the policy (and optional frozen reference) and runs one rank's share of an update.

    `ref_scope`: the context the reference log-probs are computed in (a LoRA policy is its own reference with the
    adapters off, rl/model/lora_policy.py)."""

    def __init__(self, model, cfg, pad_id: int, ref_model=None, ref_scope=contextlib.nullcontext):
        self.model, self.cfg, self.pad_id, self.ref_model = model, cfg, pad_id, ref_model
        self.ref_scope = ref_scope
        self.estimator = get_estimator(cfg.likelihood.estimator)
        self.ref_estimator = get_estimator(cfg.likelihood.ref_estimator)
        algo = dataclasses.replace(cfg.algo, tis_cap=tis_cap_in_force(cfg))  # `auto` in a Config built in code
        self.loss_cfg = policy_loss_config(algo, cfg.rollout.max_tokens)
        if self.loss_cfg.kl_coef > 0 and ref_model is None:
            raise ValueError("algo.kl_coef > 0 needs a reference model")
        self.multiple_updates = cfg.algo.ppo_epochs * cfg.algo.mini_batches > 1
        self.with_states = needs_recorded_states(cfg.likelihood.estimator)

    def _logprobs(self, model, batch: LearnerBatch, estimator=None, with_entropy=False, **overrides):
        r = self.cfg.rollout
        kw = dict(
            passes=self.cfg.likelihood.passes,
            temperature=r.temperature or 1.0,
            with_entropy=with_entropy,
            top_k=max(r.top_k, 0),
            top_p=r.top_p,
            share_prompts=self.cfg.learner.share_prompts,
        )
        return (estimator or self.estimator)(model, batch, r.decode_mode, **{**kw, **overrides})

    def _collate(self, samples: list[Sample], rows: list[int], advantages: torch.Tensor) -> LearnerBatch:
        """A micro-batch of `rows`; an empty one (a rank short of rows) is row 0 as a stand-in, with zero states:
        its loss is multiplied by 0, and row 0's states may be another rank's, never fetched here."""
        micro = collate(
            [samples[i] for i in rows or [0]],
            self.pad_id,
            with_states=self.with_states,
            state_rows=None if rows else [],
        )
        micro.extras["advantages"] = advantages[rows or [0]]
        return micro

    def update(
        self, samples: list[Sample], advantages: list[float], backend: Backend, rank: int = 0
    ) -> dict[str, float]:
        """`samples` / `advantages` are the whole batch (every rank gets the same list and takes its rows)."""
        plan = plan_for(samples, self.cfg, backend.world_size)
        adv = torch.tensor(advantages, dtype=torch.float32)
        R = max(max(s.response_len for s in samples), 1)
        extra_metrics: dict[str, float] = {}
        # behaviour (old) and reference log-probs of this rank's rows, [B, R] (other ranks' rows stay 0)
        old_logp = (
            self._rank_logprobs(samples, plan, rank, adv, R, self.model, self.estimator, True)
            if self.multiple_updates
            else None
        )
        ref_logp = None
        if self.loss_cfg.kl_coef > 0:
            with self.ref_scope():
                ref_logp = self._rank_logprobs(samples, plan, rank, adv, R, self.ref_model, self.ref_estimator, False)
                extra_metrics.update(self._ref_check(samples, plan, rank, adv, ref_logp))
        sums: dict[str, float] = {}
        weights: dict[str, float] = {}
        grad_norms = []
        for _ in range(self.cfg.algo.ppo_epochs):
            for m, mini in enumerate(plan.minibatches):
                tokens = sum(samples[i].response_len for i in mini)
                seqs = sum(samples[i].response_len > 0 for i in mini)
                for rows in plan.rank_micro_batches(m, rank):
                    micro = self._collate(samples, rows, adv)
                    for key, full in (("old_logp", old_logp), ("ref_logp", ref_logp)):
                        if full is not None:
                            micro.extras[key] = full[rows or [0], : micro.response_mask.shape[1]]
                    loss, metrics = self._micro_loss(micro, tokens, seqs, empty=not rows)
                    backend.backward(loss)
                    w = float(micro.response_mask.sum()) if rows else 0.0
                    for k, v in metrics.items():
                        # A micro-batch's loss is its share of the global loss (already divided by the global
                        # count): those add up. Every other metric is a token-weighted mean.
                        add = v / len(plan.minibatches) / self.cfg.algo.ppo_epochs if k in SUMMED_METRICS else v * w
                        sums[k] = sums.get(k, 0.0) + add
                        weights[k] = weights.get(k, 0.0) + (1.0 if k in SUMMED_METRICS else w)
                grad_norms.append(backend.step())
        out = {k: sums[k] if k in SUMMED_METRICS else sums[k] / weights[k] for k in sums if weights[k] > 0}
        out.update(extra_metrics)
        out["grad_norm"] = sum(grad_norms) / len(grad_norms)
        out["optimizer_steps"] = float(len(grad_norms))
        out["nonfinite_steps"] = float(sum(not math.isfinite(g) for g in grad_norms))  # skipped (Backend.step)
        out["replay_approximate"] = float(self.with_states and self.multiple_updates)
        out["_tokens"] = float(
            self.cfg.algo.ppo_epochs
            * sum(samples[i].response_len for m in range(len(plan.minibatches)) for i in plan.rank_rows(m, rank))
        )
        return out

    @torch.no_grad()
    def _rank_logprobs(
        self, samples, plan: UpdatePlan, rank: int, adv, R: int, model, estimator, collective: bool
    ) -> torch.Tensor:
        """[B, R] log-probs of this rank's rows (0 elsewhere), micro-batch by micro-batch. `collective`: the model
        may be partitioned over ranks (ZeRO-3), so an empty micro-batch still runs a forward (on row 0)."""
        out = None
        for m in range(len(plan.minibatches)):
            for rows in plan.rank_micro_batches(m, rank):
                if not rows and not collective:
                    continue
                with dropout_off(model):  # behaviour / reference log-probs: one value, not a dropout draw
                    lp = self._logprobs(model, self._collate(samples, rows, adv), estimator).logprobs.cpu()
                if out is None:  # the estimators' dtype: fp32, or fp64 for fp64 models
                    out = torch.zeros(len(samples), R, dtype=lp.dtype)
                if rows:
                    out[rows, : lp.shape[1]] = lp
        return out if out is not None else torch.zeros(len(samples), R)

    @torch.no_grad()
    def _ref_check(self, samples, plan: UpdatePlan, rank: int, adv, ref_logp) -> dict[str, float]:
        """A kpass reference's error: mean |kpass − exact| over the tokens of a few of this rank's rows."""
        if self.cfg.likelihood.ref_estimator != "kpass":
            return {}
        rows = [r for m in range(len(plan.minibatches)) for r in plan.rank_rows(m, rank)][:KPASS_CHECK_ROWS]
        if not rows:
            return {}
        micro = self._collate(samples, rows, adv)
        exact = self._logprobs(self.ref_model, micro, get_estimator("exact")).logprobs.cpu()
        mask = micro.response_mask
        diff = (ref_logp[rows, : mask.shape[1]] - exact).abs() * mask
        return {"ref_kpass_abs_err": float(diff.sum() / mask.sum().clamp_min(1))}

    def _micro_loss(self, micro: LearnerBatch, tokens: int, seqs: int, empty: bool = False):
        if empty:  # this rank has no rows in this micro-batch: a zero loss keeps collectives in step
            return sum(p.sum() for p in self.model.parameters()) * 0.0, {}
        out = self._logprobs(self.model, micro, with_entropy=True, entropy_grad=bool(self.cfg.algo.entropy_coef))
        dev = out.logprobs.device  # batches are built on the host; the model may sit on a GPU
        pick = lambda key: micro.extras[key].to(dev) if key in micro.extras else None  # noqa: E731
        mask = micro.response_mask.to(dev)
        loss, metrics = algos.compute_policy_loss(
            out.logprobs,
            pick("old_logp"),
            micro.extras["advantages"].to(dev),
            mask,
            self.loss_cfg,
            ref_logp=pick("ref_logp"),
            engine_logp=micro.engine_logprobs.to(dev),
            entropy=out.entropy,
            global_token_count=tokens,
            global_seq_count=seqs,
        )
        if self.cfg.algo.entropy_coef and out.entropy is not None:
            loss = loss - self.cfg.algo.entropy_coef * (out.entropy * mask).sum() / max(tokens, 1)
        return loss, metrics
