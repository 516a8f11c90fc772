"""What the run's figures show: which metrics (metrics.jsonl keys) each panel draws, and how (rl/report/plots.py
draws them). Panels are built from whatever keys the rows hold, so a panel whose metrics a run does not log is left
out, and keys added later fit without changes here:

| panel (file)                         | keys                                                                    |
|---|---|
| reward and accuracy (`reward.png`)   | `reward_mean`, `accuracy`; each reward term `reward/rewards/<name>/mean` when there are several |
| held-out accuracy (`eval_accuracy`)  | `eval_accuracy_<mode>`: one line per decode mode                        |
| loss (`loss.png`)                    | `learner/loss`, `learner/pg_loss`, `learner/kl_loss`; `learner/grad_norm` on the right axis |
| KL and entropy (`kl_entropy.png`)    | `learner/*kl*` (reference KL, old-vs-new k3), `latent`-free; `learner/entropy` on the right axis |
| clip fraction (`clip_fraction.png`)  | `learner/pg_clipfrac_*`                                                 |
| length (`length.png`)                | `response_len_mean`; `truncation_rate` on the right axis                |
| mismatch (`mismatch.png`)            | every `.../mismatch/<part>` size (not its ESS / outside-share), log scale |
| mismatch parts (`mismatch_parts.png`) | `mismatch_parts/{engine,staleness,estimator,total}` (rl/estimators/mismatch_parts.py), log scale |
| step time (`step_time.png`)          | `time_<phase>_s` stacked per step; the rest of `time_step_s` as "other" (eval, checkpoint) |
| latent channel (`latent.png`)        | `learner/latent/*` (rl/report/latent_metrics.py): weight norms; shares, shift right |
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rl.report.metrics import EVAL_ACCURACY, EVAL_LENIENT, LEARNER, MISMATCH_PARTS, REWARD

PHASES = ("rollout", "reward", "learner", "sync")  # time_<phase>_s, in the order a step runs them
_NOT_SIZES = ("seq_ess", "ratio_outside_frac")  # mismatch keys that are not a size of the mismatch
_LABELS = {
    "reward_mean": "reward (mean)",
    "accuracy": "accuracy (sampled)",
    f"{LEARNER}loss": "total loss",
    f"{LEARNER}pg_loss": "policy-gradient loss",
    f"{LEARNER}kl_loss": "KL to reference",
    f"{LEARNER}grad_norm": "grad norm",
    f"{LEARNER}approx_kl": "k3 KL(old ‖ new)",
    f"{LEARNER}entropy": "entropy",
    f"{LEARNER}pg_clipfrac_low": "clipped low",
    f"{LEARNER}pg_clipfrac_high": "clipped high",
    f"{LEARNER}pg_clipfrac_dual": "dual clip",
    "response_len_mean": "mean response length",
    "truncation_rate": "truncated share",
    f"{LEARNER}mismatch/abs_logp_diff": "mean |Δ log p| engine vs learner",
    f"{LEARNER}mismatch/k3": "k3 KL(engine ‖ learner)",
    f"{MISMATCH_PARTS}engine": "engine: exact(θ_v) − engine(θ_v)",
    f"{MISMATCH_PARTS}staleness": "staleness: exact(θ_V) − exact(θ_v)",
    f"{MISMATCH_PARTS}estimator": "estimator: est(θ_V) − exact(θ_V)",
    f"{MISMATCH_PARTS}total": "total: est(θ_V) − engine(θ_v)",
    f"{LEARNER}latent/w_state_norm": "‖W_U‖ (state weights)",
    f"{LEARNER}latent/w_token_dev": "‖W_T − I‖ (token weights)",
    f"{LEARNER}latent/w_gate_norm": "‖W_G‖ (gate weights)",
    f"{LEARNER}latent/state_share": "state share of fused input",
    f"{LEARNER}latent/policy_shift": "mean |log π_soft − log π_std|",
    f"{LEARNER}latent/gate_mean": "gate mean",
    f"{LEARNER}latent/gate_std": "gate std",
}


@dataclass
class Series:
    label: str
    xs: list[int]
    ys: list[float]
    right: bool = False  # on the panel's right axis
    marker: str | None = None
    style: str = "-"


@dataclass
class Panel:
    name: str  # file stem
    title: str
    ylabel: str
    series: list[Series] = field(default_factory=list)
    right_label: str = ""
    log: bool = False
    stacked: bool = False  # stacked bars (step time)
    ylim: tuple[float, float] | None = None
    shares: tuple[str, ...] = ()  # axes ("left", "right") holding non-negative shares: drawn from 0
    smooth: bool = False  # raw values faint, a rolling mean on top
    legend_top: bool = False  # many series on two axes: the legend above the data (headroom), not over it

    def has_data(self) -> bool:
        return any(s.xs for s in self.series)


# ---------------------------------------------------------------------------------------------- panels


def _series(rows: list[dict], key: str, label: str | None = None, positive: bool = False, **kw) -> Series:
    pts = [
        (int(r["step"]), float(r[key]))
        for r in rows
        if isinstance(r.get(key), (int, float)) and math.isfinite(r[key]) and (not positive or r[key] > 0)
    ]
    return Series(label or _LABELS.get(key, key), [p[0] for p in pts], [p[1] for p in pts], **kw)


def _keys(rows: list[dict]) -> list[str]:
    seen: dict[str, None] = {}
    for r in rows:
        seen.update(dict.fromkeys(r))
    return list(seen)


def build_panels(rows: list[dict]) -> list[Panel]:
    """Every panel the rows have data for, in reading order."""
    train = [r for r in rows if r.get("step", 0) > 0]
    keys = _keys(train)
    panels = []

    p = Panel("reward", "Reward and accuracy (training samples)", "mean over samples", smooth=True)
    p.series += [_series(train, "reward_mean"), _series(train, "accuracy", style="--")]
    terms = [
        k
        for k in keys
        if k.startswith(f"{REWARD}rewards/") and k.endswith("/mean") and k != f"{REWARD}rewards/total/mean"
    ]
    if len(terms) > 1:  # one term is the total itself: drawing it again says nothing
        p.series += [_series(train, k, f"term: {k.split('/')[2]}", style=":") for k in terms]
    panels.append(p)

    modes = [k[len(EVAL_ACCURACY) + 1 :] for k in _keys(rows) if k.startswith(f"{EVAL_ACCURACY}_")]
    p = Panel("eval_accuracy", "Held-out greedy accuracy by decode mode", "accuracy", ylim=(0.0, 1.0))
    p.series += [_series(rows, f"{EVAL_ACCURACY}_{m}", m, marker="o") for m in modes]
    # the lenient read (last number in the response): a gain in the answer format alone opens a gap to it
    p.series += [
        _series(rows, f"{EVAL_LENIENT}_{m}", f"{m} (lenient read)", marker="x", style="--")
        for m in modes
        if f"{EVAL_LENIENT}_{m}" in _keys(rows)
    ]
    panels.append(p)

    p = Panel("loss", "Policy loss", "loss", right_label="grad norm")
    p.series += [_series(train, k) for k in (f"{LEARNER}loss", f"{LEARNER}pg_loss") if k in keys]
    p.series.append(_series(train, f"{LEARNER}grad_norm", right=True, style=":"))
    panels.append(p)

    p = Panel("kl_entropy", "KL and entropy", "KL", right_label="entropy (nats/token)", shares=("left", "right"))
    kls = [
        k
        for k in keys
        if k.startswith(LEARNER) and "kl" in k.split("/")[-1] and "mismatch" not in k and "latent" not in k
    ]
    p.series += [_series(train, k) for k in kls]
    p.series.append(_series(train, f"{LEARNER}entropy", right=True, style="--"))
    panels.append(p)

    p = Panel("clip_fraction", "Clip fraction (share of tokens)", "fraction", shares=("left",))
    p.series += [_series(train, k) for k in keys if k.startswith(f"{LEARNER}pg_clipfrac_")]
    panels.append(p)

    p = Panel("length", "Response length and truncation", "tokens", right_label="truncated share", shares=("right",))
    p.series += [_series(train, "response_len_mean"), _series(train, "truncation_rate", right=True, style="--")]
    panels.append(p)

    mism = [k for k in keys if "mismatch/" in k and k.split("/")[-1] not in _NOT_SIZES]
    if not mism and "logprob_mismatch_abs_mean" in keys:
        mism = ["logprob_mismatch_abs_mean"]
    p = Panel("mismatch", "Log-prob mismatch (engine vs learner)", "per token (log scale)", log=True)
    p.series += [_series(train, k, _LABELS.get(k, k.replace(LEARNER, "")), positive=True) for k in mism]
    panels.append(p)

    # the three parts of the mismatch (and their sum) on the diagnostic rows; an exact 0 (staleness at s = 0, the
    # exact estimator) has no place on a log axis and is left out
    p = Panel(
        "mismatch_parts", "Mismatch taken apart (diagnostic rows)", "mean |Δ log p| per token (log scale)", log=True
    )
    p.series += [
        _series(train, f"{MISMATCH_PARTS}{part}", positive=True, style=":" if part == "total" else "-")
        for part in ("engine", "staleness", "estimator", "total")
    ]
    panels.append(p)

    p = Panel("step_time", "Step time by phase", "seconds", stacked=True)
    p.series += [_series(train, f"time_{ph}_s", ph) for ph in PHASES if f"time_{ph}_s" in keys]
    other = [
        (int(r["step"]), r["time_step_s"] - sum(r.get(f"time_{ph}_s") or 0.0 for ph in PHASES))
        for r in train
        if isinstance(r.get("time_step_s"), (int, float))
    ]
    if other:
        p.series.append(Series("other (eval, checkpoint)", [o[0] for o in other], [max(o[1], 0.0) for o in other]))
    panels.append(p)

    latent = [k for k in keys if k.startswith(f"{LEARNER}latent/")]  # rl/report/latent_metrics.py
    p = Panel(
        "latent",
        "Latent channel",
        "weight norm (Frobenius)",
        right_label="share / log-prob shift",
        shares=("left", "right"),
        legend_top=True,
    )
    p.series += [
        _series(
            train,
            k,
            _LABELS.get(k, k.split("/")[-1]),
            right=not k.split("/")[-1].startswith("w_"),
            style="-" if k.split("/")[-1].startswith("w_") else "--",
        )
        for k in latent
    ]
    panels.append(p)

    for panel in panels:
        panel.series = [s for s in panel.series if s.xs]
    return [p for p in panels if p.has_data()]
