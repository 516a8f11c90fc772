"""Compare the likelihood estimators against the exact recurrence (`fbrl compare-likelihood`).

For a batch of rollouts (with recorded states) and K = 1..M passes, replay and standard (the model read as a
standard transformer: no feedback anywhere, the error a feedback-blind learner would make), pooled over response
tokens:

- `mean_abs_logp_diff` (and `max_abs_logp_diff`): |log p_est(y) - log p_exact(y)| at the sampled tokens;
- `kl`: KL(exact ‖ estimate) over the full vocabulary, per token;
- `top1_agreement`: fraction of response positions whose argmax token agrees with the exact one;
- `k_rel_l2` / `v_rel_l2`: per layer, ||K_est - K_exact|| / ||K_exact|| over the cache entries of the response
  tokens (the prompt's entries are identical for every estimator, so they would only dilute the figure); the
  exact cache is the recurrence's own;
- `time_per_token_ms`: wall time of the estimator (forward, no grad, and the full-vocabulary log-softmax at the
  response positions) per response token, from the one run that is scored: kpass K's time is its K passes
  (pass k of the chain runs once and feeds pass k + 1, as inside kpass K); exact's is the recurrence, run once
  over all rows;
- `abs_logp_diff_by_position`: mean |Δ log p| at each response index j (where along a chain the error sits).

`replay` replays the states as recorded; `replay_formats` replays them after a round trip through each storage
format of rl/samples/states.py (bf16, fp8 with a per-row scale): the estimator error that storing states in that
format costs (`rollout.record_states_dtype`).

The parallel passes and log-dists are computed per micro-batch of rows and pooled, so memory stays bounded by the
micro-batch (plus the recurrence's states and cache of the whole batch). In `soft` decoding every estimator reads
the prompt plainly, so each micro-batch's prompts run once (timed, and that time counted in every estimator's) and
each estimator's passes run over the response positions only, attending to the prompts' K/V — the learner's
prompt-once forward (rl/estimators/shared_prompt.py). `fused` prompts carry feedback: there every pass runs whole.
"""

from __future__ import annotations

import dataclasses
import time

import torch

import rl.samples.states as state_formats
from rl.estimators.batch_inputs import fusion_masks, micro_batches, recorded_carried
from rl.estimators.likelihood import exact_states_and_kv, last_pass_inputs, response_log_dists, run_pass
from rl.estimators.shared_prompt import PromptCache, _embed, _fuse, _row_layout, _stack, prompt_share_of
from rl.model.fusion import positions_from_mask
from rl.samples.batch import LearnerBatch, Sample, collate

# storage formats whose replay error is reported besides the states as recorded (rl/samples/states.py; config names)
STORED_FORMATS = ("bf16", "fp8")
METRICS = (
    "mean_abs_logp_diff",
    "max_abs_logp_diff",
    "kl",
    "top1_agreement",
    "k_rel_l2_mean",
    "v_rel_l2_mean",
    "time_per_token_ms",
)


class _Pool:
    """Token-pooled sums for one estimator."""

    def __init__(self, n_layers: int):
        self.abs = self.kl = self.agree = self.n = 0.0
        self.max_abs = 0.0
        self.dk = [0.0] * n_layers
        self.dv = [0.0] * n_layers
        self.seconds = 0.0
        self.pos_abs: list[float] = []  # per response index j: sum of |Δ log p| and token count
        self.pos_n: list[float] = []

    def add(self, lp_est, logp_est, kv_est, ex: _Exact):
        """One micro-batch of an estimator: `lp_est` [B, R] at the sampled tokens, `logp_est` [B, R, V], `kv_est`
        per layer, against the exact recurrence's `ex`."""
        mask, kv_ex, kv_mask = ex.mask, ex.kv, ex.kv_mask
        d = (lp_est - ex.lp).abs() * mask
        self.abs += float(d.sum())
        for j, (a, c) in enumerate(zip(d.sum(0).tolist(), mask.sum(0).tolist())):
            if j == len(self.pos_abs):
                self.pos_abs.append(0.0)
                self.pos_n.append(0.0)
            self.pos_abs[j] += a
            self.pos_n[j] += c
        self.max_abs = max(self.max_abs, float(d.max()))
        kl = (ex.p * (ex.logp - logp_est)).sum(-1)
        self.kl += float((kl * mask).sum())
        self.agree += float(((logp_est.argmax(-1) == ex.top1).float() * mask).sum())
        self.n += float(mask.sum())
        m = kv_mask[:, None, :, None].to(kv_ex[0][0].dtype)  # [B, 1, L, 1] over [B, heads, L, head_dim]
        for i, ((k, v), (k0, v0)) in enumerate(zip(kv_est, kv_ex)):
            self.dk[i] += float((((k - k0) * m) ** 2).sum())
            self.dv[i] += float((((v - v0) * m) ** 2).sum())

    def record(self, ref_k: list[float], ref_v: list[float]) -> dict:
        n = max(self.n, 1.0)
        k_rel = [(a / max(b, 1e-30)) ** 0.5 for a, b in zip(self.dk, ref_k)]
        v_rel = [(a / max(b, 1e-30)) ** 0.5 for a, b in zip(self.dv, ref_v)]
        return {
            "mean_abs_logp_diff": self.abs / n,
            "max_abs_logp_diff": self.max_abs,
            "kl": self.kl / n,
            "top1_agreement": self.agree / n,
            "k_rel_l2": k_rel,
            "v_rel_l2": v_rel,
            "k_rel_l2_mean": sum(k_rel) / len(k_rel),
            "v_rel_l2_mean": sum(v_rel) / len(v_rel),
            "time_per_token_ms": 1000.0 * self.seconds / n,
            # the error grows along the response when the state the recurrence carries matters
            "abs_logp_diff_by_position": [a / c if c else None for a, c in zip(self.pos_abs, self.pos_n)],
        }


def _responses_trimmed(mb: LearnerBatch) -> LearnerBatch:
    """The micro-batch's response columns cut to its longest response (its log-dists are pooled, not
    concatenated with other micro-batches')."""
    R = max(int(mb.response_lens.max()), 1)
    if R >= mb.response_mask.shape[1]:
        return mb
    cut = lambda t: None if t is None else t[:, :R]
    return dataclasses.replace(
        mb,
        response_mask=cut(mb.response_mask),
        engine_logprobs=cut(mb.engine_logprobs),
        states=cut(mb.states),
        extras={},
    )


def _kv_mask(batch: LearnerBatch) -> torch.Tensor:
    """[B, L] bool: cache positions of the response tokens (P_b .. P_b + R_b - 1)."""
    L = batch.input_ids.shape[1]
    pos = torch.arange(L)[None, :]
    return (pos >= batch.prompt_lens[:, None]) & (pos < (batch.prompt_lens + batch.response_lens)[:, None])


@dataclasses.dataclass
class _Exact:
    """The exact recurrence on one micro-batch: what every estimator is scored against."""

    logp: torch.Tensor  # [B, R, V] log-dists at the response positions
    lp: torch.Tensor  # [B, R] at the sampled tokens, 0 on padding
    kv: list  # per layer (keys, values) [B, kv_heads, L, head_dim], the recurrence's own cache
    mask: torch.Tensor  # [B, R] response mask
    kv_mask: torch.Tensor  # [B, L] response positions
    tok: torch.Tensor  # [B, R, 1] sampled tokens
    p: torch.Tensor | None = None  # logp.exp(), once for every estimator's KL
    top1: torch.Tensor | None = None  # [B, R] exact's argmax tokens

    def __post_init__(self):
        self.p, self.top1 = self.logp.exp(), self.logp.argmax(-1)


class _Totals:
    """Batch-wide sums besides the estimators' pools: exact's time, the engine's error, the reference K/V norms."""

    def __init__(self, n_layers: int):
        self.exact_seconds = self.engine_abs = self.engine_max = 0.0
        self.ref_k, self.ref_v = [0.0] * n_layers, [0.0] * n_layers

    def add(self, mb: LearnerBatch, ex: _Exact) -> None:
        d_eng = (mb.engine_logprobs.to(ex.lp.device) - ex.lp).abs() * ex.mask
        self.engine_abs += float(d_eng.sum())
        self.engine_max = max(self.engine_max, float(d_eng.max()))
        m = ex.kv_mask[:, None, :, None].to(ex.kv[0][0].dtype)
        for i, (k0, v0) in enumerate(ex.kv):
            self.ref_k[i] += float(((k0 * m) ** 2).sum())
            self.ref_v[i] += float(((v0 * m) ** 2).sum())


def _exact_part(model, mb, h_all, kv_all, rows: slice, temperature, totals: _Totals, seg=None) -> _Exact:
    """Micro-batch `rows` of the whole batch's recurrence (states `h_all`, cache `kv_all`), its log-dists timed
    into exact's time. With `seg` (soft prompts shared), its K/V are taken at the response positions only, the
    layout of the estimators' response passes."""
    dev, L = h_all.device, mb.input_ids.shape[1]
    t0 = time.perf_counter()
    logp = response_log_dists(model, h_all[rows, :L], mb, temperature)
    totals.exact_seconds += time.perf_counter() - t0
    mask, tok = mb.response_mask.to(dev), mb.response_ids.to(dev)[..., None]
    kv = [(k[rows, :, :L], v[rows, :, :L]) for k, v in kv_all]
    kv_mask = _kv_mask(mb).to(dev)
    if seg is not None:
        kv, kv_mask = [(seg.at_response(k), seg.at_response(v)) for k, v in kv], seg.share.response_mask.bool()
    ex = _Exact(logp, torch.gather(logp, -1, tok)[..., 0] * mask, kv, mask, kv_mask, tok)
    totals.add(mb, ex)
    return ex


@dataclasses.dataclass
class _Segments:
    """A soft micro-batch's prompts run once (plain, as every estimator reads them), for response-only passes."""

    share: object  # rl.estimators.shared_prompt.PromptShare
    cache: PromptCache
    h_rows: torch.Tensor  # [B, P, d] each row's prompt states
    e_resp: torch.Tensor  # [B, T, d] the response segment's embeddings
    L: int
    seconds: float  # the prompt pass: counted in every estimator's time

    def at_response(self, t: torch.Tensor) -> torch.Tensor:
        """[B, heads, L, head_dim] in the row layout -> [B, heads, T, head_dim] at each row's response positions."""
        idx = self.share.response_pos.clamp(max=t.shape[2] - 1)
        return t.gather(2, idx[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[3]))

    def response_pass(self, model, carried, mask):
        """(h in the row layout [B, L, d], the response positions' K/V [B, heads, T, head_dim] per layer)."""
        cache = self.cache.for_rows(detached=True)
        x = _fuse(model, self.e_resp, carried, mask) if carried is not None else self.e_resp
        h, _ = _stack(model, x, self.cache.mask(), self.share.response_pos, cache)
        P = self.h_rows.shape[1]
        kv = [(layer.keys[:, :, P:], layer.values[:, :, P:]) for layer in cache.layers]
        return _row_layout(self.h_rows, h, self.share, self.L), kv

    def feeding(self, h_rows_layout: torch.Tensor) -> torch.Tensor:
        """What a next pass fuses at the response positions: the previous position's state."""
        idx = (self.share.response_pos - 1).clamp(max=h_rows_layout.shape[1] - 1)
        return torch.gather(h_rows_layout, 1, idx[..., None].expand(-1, -1, h_rows_layout.shape[-1]))

    def recorded(self, model, mb, fb) -> torch.Tensor:
        """Replay's recorded states at the response positions."""
        carried = recorded_carried(model, mb, fb)
        idx = self.share.response_pos.clamp(max=carried.shape[1] - 1)
        return torch.gather(carried, 1, idx[..., None].expand(-1, -1, carried.shape[-1]))


def _segments(model, mb, fb) -> _Segments:
    """The micro-batch's distinct prompts run once, plainly, keeping their K/V (timed)."""
    t0 = time.perf_counter()
    share = prompt_share_of(mb, fb, fb.device)
    h_prompt, cache = _stack(
        model,
        _embed(model, share.prompt_ids),
        share.prompt_mask,
        positions_from_mask(share.prompt_mask),
        use_cache=True,
    )
    h_rows = h_prompt.index_select(0, share.inverse)
    seg = _Segments(
        share, PromptCache(cache, share), h_rows, _embed(model, share.response_ids), mb.input_ids.shape[1], 0.0
    )
    seg.seconds = time.perf_counter() - t0
    return seg


def _score(model, pools: list[_Pool], ex: _Exact, mb, temperature, run_pass_once):
    """Run an estimator's final pass once (`run_pass_once()` -> (h in the row layout, its K/V)) and score it against
    `ex` into each of `pools` (estimators that compute the very same pass). Returns (h, seconds of the pass,
    seconds of its log-dists): that run is the one timed."""
    t0 = time.perf_counter()
    h, kv = run_pass_once()
    t1 = time.perf_counter()
    logp = response_log_dists(model, h, mb, temperature)
    t2 = time.perf_counter()
    lp = torch.gather(logp, -1, ex.tok)[..., 0] * ex.mask
    for pool in pools:
        pool.add(lp, logp, kv, ex)
    return h, t1 - t0, t2 - t1


def _whole_pass(model, mb, decode_mode, name, passes, prev, masks):
    """Estimator `name`'s final pass over prompt and response, keeping its K/V cache."""
    carried, fmask = last_pass_inputs(model, mb, decode_mode, name, passes, prev_hidden=prev, masks=masks)
    return run_pass(model, mb, carried, fmask, with_kv=True)


def _replay_variants(mb, formats) -> list[tuple[str, LearnerBatch]]:
    """Replay's rows as recorded, then after a round trip of the states through each storage format."""
    variants = [("replay", mb)]
    for f in formats:
        stored = state_formats.encode(mb.states, state_formats.CONFIG_NAMES[f])
        variants.append((f"replay_{f}", dataclasses.replace(mb, states=state_formats.decode(stored))))
    return variants


def _score_segments(model, pools, ex: _Exact, mb, seg: _Segments, fb, max_passes, temperature, formats) -> None:
    """`_score_micro_batch` in soft decoding with each prompt run once: every estimator's time is the prompt pass
    plus its own response passes (kpass K: the chain's passes 1..K) and log-dists."""
    feed = seg.share.feedback
    chain, prev = seg.seconds, None
    for k in range(1, max_passes + 1):  # K=1 feeds nothing back: the very pass of standard (scored once for both)
        same = [pools[k]] + ([pools["standard"]] if k == 1 else [])
        carried = seg.feeding(prev) if prev is not None else None
        prev, t_pass, t_dist = _score(model, same, ex, mb, temperature, lambda: seg.response_pass(model, carried, feed))
        chain += t_pass
        for pool in same:
            pool.seconds += chain + t_dist
    for key, b in _replay_variants(mb, formats):
        carried = seg.recorded(model, b, fb)
        _, t_pass, t_dist = _score(
            model, [pools[key]], ex, mb, temperature, lambda: seg.response_pass(model, carried, feed)
        )
        pools[key].seconds += seg.seconds + t_pass + t_dist


def _score_micro_batch(model, pools, ex: _Exact, mb, decode_mode, max_passes, temperature, formats) -> None:
    """Every estimator on one micro-batch, each run once. kpass K's time is its K passes: pass k runs once and
    feeds K = k + 1 (as it would inside kpass K), so K's time is the chain's passes 1..K plus its log-dists."""
    t0 = time.perf_counter()
    masks = fusion_masks(model, mb, decode_mode)  # every estimator computes these (fused: the prompt's prefill)
    t_masks = time.perf_counter() - t0
    chain, prev = t_masks, None
    # soft prompts: kpass with one pass feeds nothing back, the very pass of standard (scored once for both)
    alike = {1: "standard"} if decode_mode == "soft" else {}
    for k in range(1, max_passes + 1):
        same = [pools[k]] + ([pools[alike[k]]] if k in alike else [])
        run = lambda: _whole_pass(model, mb, decode_mode, "kpass", k, prev, masks)
        prev, t_pass, t_dist = _score(model, same, ex, mb, temperature, run)
        chain += t_pass
        for pool in same:
            pool.seconds += chain + t_dist
    # stored formats change the states only, not the masks
    variants = _replay_variants(mb, formats) + [("standard", mb)] * (decode_mode != "soft")
    for key, b in variants:
        name = "standard" if key == "standard" else "replay"
        _, t_pass, t_dist = _score(
            model, [pools[key]], ex, b, temperature, lambda: _whole_pass(model, b, decode_mode, name, 1, None, masks)
        )
        pools[key].seconds += t_masks + t_pass + t_dist


@torch.no_grad()
def compare_estimators(
    model,
    batch: LearnerBatch,
    decode_mode: str = "soft",
    max_passes: int = 6,
    temperature: float = 1.0,
    micro_batch_size: int | None = 8,
    state_formats_compared=STORED_FORMATS,
    share_prompts: bool = True,
) -> dict:
    """Every estimator against `exact` on one batch (needs `batch.states` for replay). Returns the report dict:
    `passes` (one record per K = 1..max_passes, each with `k`), `replay`, `replay_formats` (replay after storing
    the states in each of `state_formats_compared`, config names), `standard`, `exact` (its time per token) and
    `engine` (the engine's own log-probs against exact).

    The recurrence runs once over all rows (its steps are sequential: one batch amortizes them); the parallel
    passes and the full-vocabulary log-dists run per micro-batch of rows, which bounds memory. `share_prompts`
    (soft decoding): each micro-batch's prompts run once and the passes over the responses only (the figures are
    the same up to rounding; false: every pass over prompt and response)."""
    _check_arguments(max_passes, state_formats_compared)
    model.eval()
    n_layers = model.config.num_hidden_layers
    pools = {k: _Pool(n_layers) for k in (*range(1, max_passes + 1), "replay", "standard")}
    pools.update({f"replay_{f}": _Pool(n_layers) for f in state_formats_compared})
    totals = _Totals(n_layers)
    # rows by length: micro-batches of like lengths pad (and compute) less; every figure pools tokens
    batch = batch.select(torch.argsort(batch.prompt_lens + batch.response_lens, stable=True))
    whole = next(micro_batches(batch, None))  # trailing all-padding columns trimmed
    t0 = time.perf_counter()
    h_all, kv_all = exact_states_and_kv(model, whole, decode_mode)
    totals.exact_seconds += time.perf_counter() - t0
    size = micro_batch_size if micro_batch_size and micro_batch_size < len(batch) else len(batch)
    for start, mb in zip(range(0, len(batch), size), micro_batches(batch, micro_batch_size)):
        rows, mb = slice(start, start + len(mb)), _responses_trimmed(mb)
        args = (max_passes, temperature, state_formats_compared)
        if decode_mode == "soft" and share_prompts:
            fb = fusion_masks(model, mb, decode_mode)[0]
            seg = _segments(model, mb, fb)
            _score_segments(
                model, pools, _exact_part(model, mb, h_all, kv_all, rows, temperature, totals, seg), mb, seg, fb, *args
            )
        else:
            _score_micro_batch(
                model, pools, _exact_part(model, mb, h_all, kv_all, rows, temperature, totals), mb, decode_mode, *args
            )
    n_tok = max(float(batch.response_mask.sum()), 1.0)
    record = lambda key: pools[key].record(totals.ref_k, totals.ref_v)
    return {
        "decode_mode": decode_mode,
        "temperature": temperature,
        "n_samples": len(batch),
        "n_tokens": int(batch.response_mask.sum()),
        "n_layers": n_layers,
        "exact": {"time_per_token_ms": 1000.0 * totals.exact_seconds / n_tok},
        "engine": {"mean_abs_logp_diff": totals.engine_abs / n_tok, "max_abs_logp_diff": totals.engine_max},
        "passes": [{"k": k, **record(k)} for k in range(1, max_passes + 1)],
        "replay": record("replay"),
        "standard": record("standard"),
        "replay_formats": {f: record(f"replay_{f}") for f in state_formats_compared},
    }


def _check_arguments(max_passes: int, formats) -> None:
    if max_passes < 1:
        raise ValueError(f"max_passes must be >= 1, got {max_passes}")
    unknown = [f for f in formats if f not in state_formats.CONFIG_NAMES]
    if unknown:
        raise ValueError(f"state formats {unknown}: expected some of {sorted(state_formats.CONFIG_NAMES)}")


def compare_samples(model, samples: list[Sample], pad_id: int = 0, **kwargs) -> dict:
    """`compare_estimators` on engine samples (they must carry recorded states)."""
    return compare_estimators(model, collate(samples, pad_id=pad_id, with_states=True), **kwargs)


def format_comparison(report: dict) -> str:
    """A plain-text table: one line per K, then replay (as recorded and per storage format), standard and exact."""
    head = f"{'estimator':>11} {'|dlogp|':>10} {'KL':>10} {'top1':>7} {'K relL2':>9} {'V relL2':>9} {'ms/tok':>8}"
    rows = [
        f"compare-likelihood: {report['n_samples']} samples, {report['n_tokens']} response tokens, "
        f"decode_mode={report['decode_mode']}, T={report['temperature']}",
        head,
    ]

    def line(name, r):
        return (
            f"{name:>11} {r['mean_abs_logp_diff']:10.3e} {r['kl']:10.3e} {r['top1_agreement']:7.2%} "
            f"{r['k_rel_l2_mean']:9.3%} {r['v_rel_l2_mean']:9.3%} {r['time_per_token_ms']:8.3f}"
        )

    rows += [line(f"K={r['k']}", r) for r in report["passes"]]
    rows.append(line("replay", report["replay"]))
    rows += [line(f"replay {f}", r) for f, r in report.get("replay_formats", {}).items()]
    if "standard" in report:  # reports written before the row existed lack it
        rows.append(line("standard", report["standard"]))
    rows.append(f"{'exact':>11} {'':>10} {'':>10} {'':>7} {'':>9} {'':>9} {report['exact']['time_per_token_ms']:8.3f}")
    rows.append(
        f"engine log-probs vs exact: mean |dlogp| {report['engine']['mean_abs_logp_diff']:.3e}, "
        f"max {report['engine']['max_abs_logp_diff']:.3e}"
    )
    return "\n".join(rows)


def plot_report(report: dict, path: str) -> None:
    """Error against passes with replay (dashed) and standard (dotted) as horizontal lines (the paper's Figure 8
    layout): left mean |Δ log p| and KL, right mean K / V relative L2. Log scale; exact zeros are drawn at a floor
    of 1e-10."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    floor = 1e-10
    ks = [r["k"] for r in report["passes"]]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    panels = [
        (axes[0], [("mean_abs_logp_diff", "mean |Δ log p|", "C0"), ("kl", "KL(exact‖est)", "C1")]),
        (axes[1], [("k_rel_l2_mean", "K rel. L2", "C2"), ("v_rel_l2_mean", "V rel. L2", "C3")]),
    ]
    for ax, series in panels:
        for key, label, color in series:
            ax.plot(ks, [max(r[key], floor) for r in report["passes"]], "o-", color=color, label=f"K-pass {label}")
            ax.axhline(max(report["replay"][key], floor), color=color, ls="--", label=f"replay {label}")
            if "standard" in report:
                ax.axhline(max(report["standard"][key], floor), color=color, ls=":", label=f"standard {label}")
        ax.set_yscale("log")
        ax.set_xlabel("passes K")
        ax.set_xticks(ks)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_title("log-prob error vs exact recurrence")
    axes[1].set_title("KV-cache error vs exact recurrence")
    fig.suptitle(f"{report['n_samples']} samples, {report['n_tokens']} tokens, {report['decode_mode']} decoding")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
