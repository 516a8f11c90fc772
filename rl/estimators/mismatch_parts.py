"""The rollout / learner mismatch taken apart, on a diagnostic subset of each step's rows.

A sample drawn by the engine with the weights of version v is trained while the learner holds version V ≥ v
(V − v is its staleness: 0 in synchronous training, up to `train.max_staleness` in asynchronous). What the loss
sees per token is est(θ_V) − engine(θ_v): the configured estimator under the current weights against the engine's
log-prob. It splits exactly (per token, signed) into three parts:

    est(θ_V) − engine(θ_v) = [est(θ_V) − exact(θ_V)] + [exact(θ_V) − exact(θ_v)] + [exact(θ_v) − engine(θ_v)]
            total          =       estimator         +         staleness         +          engine

- **engine**: the same weights, two implementations (kernels, batching, precision): ≈ 0 for the torch engine in
  fp32, ~1e-7 for vLLM fp32. Computed on every row whose sampling version's weights are kept (all of them in
  normal operation), not only on rows of staleness 0 — with θ_v at hand the comparison is the same.
- **staleness**: what the policy moved since the sample was drawn, both sides exact: exactly 0 at s = 0.
- **estimator**: the estimator's own error under the current weights. For an FBT this is where staleness meets
  the latent states: `replay` feeds the states θ_v recorded to θ_V (its error grows with staleness), `kpass`
  recomputes them under θ_V (its error is the K-pass truncation only), `exact` is 0, and so is every estimator in
  standard decoding (no position is fed back: each is the plain forward, not run a second time).

`exact` is the teacher-forced recurrence (rl/estimators/likelihood.py) under each version's weights. The learner keeps a
CPU copy of the weights of every version it trained at in the last `max_staleness + 1` (`WeightHistory`), records the
current one at each step, and runs the exact recurrence of old versions in a scratch model (`MismatchProbe`, rank 0).
Costs per step: one CPU copy of the weights and, on `train.mismatch_parts_frac` of the rows, three no-grad passes (two
exact recurrences and the estimator). Logged as `mismatch_parts/<part>` (mean |Δ| per token) and
`mismatch_parts/<part>_signed`; rl/report/plots.py draws them (`mismatch_parts.png`).
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Callable

import torch

from rl.algos.mismatch import mismatch_decomposition
from rl.estimators.likelihood import get_estimator, needs_recorded_states
from rl.samples.batch import Sample, collate

PARTS = ("engine", "staleness", "estimator")


def diagnostic_rows(n_rows: int, frac: float, seed: int, step: int) -> list[int]:
    """ceil(frac · n) row indices (at least one when frac > 0 and there are rows), the same for the same
    (seed, step) — so two runs of one experiment measure the same rows."""
    if frac <= 0 or n_rows == 0:
        return []
    k = min(n_rows, max(1, math.ceil(frac * n_rows)))
    return sorted(random.Random(f"fbrl-mismatch-parts:{seed}:{step}").sample(range(n_rows), k))


def within_token_budget(rows: list[int], lengths: list[int], max_tokens: int) -> list[int]:
    """The first of `rows` (already a seeded draw) whose response tokens add up to at most `max_tokens`; always the
    first row, so the parts are measured every step (0: no budget)."""
    if max_tokens <= 0:
        return rows
    out, used = [], 0
    for r in rows:
        if out and used + lengths[r] > max_tokens:
            break
        out.append(r)
        used += lengths[r]
    return out


class WeightHistory:
    """CPU copies of the policy's weights by version, the newest `keep` versions."""

    def __init__(self, keep: int):
        if keep < 1:
            raise ValueError(f"WeightHistory keeps at least one version, got {keep}")
        self.keep = keep
        self._states: OrderedDict[int, dict[str, torch.Tensor]] = OrderedDict()

    def record(self, version: int, state: dict[str, torch.Tensor]) -> None:
        """Keep `state` (tensors already copied off the live model by the caller) as `version`."""
        self._states[version] = state
        self._states.move_to_end(version)
        while len(self._states) > self.keep or (self._states and next(iter(self._states)) < version - self.keep + 1):
            self._states.popitem(last=False)

    def get(self, version: int) -> dict[str, torch.Tensor] | None:
        return self._states.get(version)

    def versions(self) -> list[int]:
        return list(self._states)


class MismatchProbe:
    """The learner side of the diagnostic: `measure(samples, version, state)` records `state` (the current weights,
    a CPU copy) as `version` and returns the parts on `samples`. `load_model()` builds the scratch model the
    exact recurrences run in (one extra copy of the policy, on `device`)."""

    def __init__(self, cfg, load_model: Callable[[], torch.nn.Module], pad_id: int, device="cpu"):
        self.cfg, self.pad_id, self.device = cfg, pad_id, device
        self.history = WeightHistory(cfg.train.max_staleness + 1)
        self._load_model = load_model
        self._scratch = None

    def _model(self, state: dict[str, torch.Tensor]) -> torch.nn.Module:
        if self._scratch is None:
            self._scratch = self._load_model().to(self.device).eval().requires_grad_(False)
        missing, unexpected = self._scratch.load_state_dict(state, strict=False)
        tied = {"lm_head.weight"} if getattr(self._scratch.config, "tie_word_embeddings", False) else set()
        if unexpected or set(missing) - tied:
            raise ValueError(
                f"mismatch parts: weights do not fit the model: missing={sorted(set(missing) - tied)} "
                f"unexpected={sorted(unexpected)}"
            )
        return self._scratch

    def _logprobs(self, estimator: str, model, batch) -> torch.Tensor:
        c, r = self.cfg, self.cfg.rollout
        # the learner's log-prob contract (rl/samples/logprob_contract.py): the engines' behaviour density, top-k /
        # top-p kept set included, so the engine part compares like with like
        return get_estimator(estimator)(
            model,
            batch,
            r.decode_mode,
            passes=c.likelihood.passes,
            temperature=r.temperature or 1.0,
            top_k=max(r.top_k, 0),
            top_p=r.top_p,
            micro_batch_size=c.learner.micro_batch_size,
        ).logprobs.cpu()

    @torch.no_grad()
    def measure(self, samples: list[Sample], version: int, state: dict[str, torch.Tensor]) -> dict[str, float]:
        self.history.record(version, state)
        if not samples:
            return {}
        estimator = self.cfg.likelihood.estimator
        batch = collate(samples, self.pad_id, with_states=needs_recorded_states(estimator))
        model = self._model(state)
        exact_now = self._logprobs("exact", model, batch)
        # In standard decoding no position is fed back: every estimator is the one plain forward exact is.
        same = estimator == "exact" or self.cfg.rollout.decode_mode == "standard"
        est_now = exact_now if same else self._logprobs(estimator, model, batch)
        exact_then = torch.zeros_like(exact_now)
        known = torch.zeros(len(samples), dtype=torch.bool)
        for v in sorted({s.policy_version for s in samples}):
            weights = self.history.get(v)
            if weights is None:
                continue
            rows = [i for i, s in enumerate(samples) if s.policy_version == v]
            if v == version:  # drawn with the current weights (every row in synchronous training): the same
                exact_then[rows] = exact_now[rows]  # recurrence under the same weights, not run a second time
                known[rows] = True
                continue
            sub = batch.select(rows)
            exact_then[rows, : sub.response_mask.shape[1]] = self._logprobs("exact", self._model(weights), sub)
            known[rows] = True
        out = mismatch_decomposition(batch.engine_logprobs, exact_then, exact_now, est_now, batch.response_mask, known)
        out["rows"] = float(len(samples))
        out["rows_without_weights"] = float(len(samples) - int(known.sum()))
        out["staleness_mean"] = sum(version - s.policy_version for s in samples) / len(samples)
        return out


def measure_parts(cfg, learner, samples: list[Sample], version: int, step: int) -> dict:
    """The loop's step 4: the parts of this step's mismatch (`learner.mismatch_parts`) on its diagnostic subset
    (`train.mismatch_parts_frac` of the rows, within `train.mismatch_parts_max_tokens`); {} when off."""
    if cfg.train.mismatch_parts_frac <= 0:
        return {}
    diag = within_token_budget(
        diagnostic_rows(len(samples), cfg.train.mismatch_parts_frac, cfg.train.seed, step),
        [s.response_len for s in samples],
        cfg.train.mismatch_parts_max_tokens,
    )
    return learner.mismatch_parts([samples[i] for i in diag], version)
