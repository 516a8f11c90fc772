"""The learner sections of the GPU benchmark (tools/gpu/gpu_bench.py, whose docstring has the shapes): `learner`
(one micro-batch's log-probs under the standard, replay and kpass estimators, a GRPO-like surrogate and its
backward; time and peak memory, beside the CPU goals) and `exact` (the teacher-forced recurrence, differentiable
through every step, at two response lengths).

Imported by tools/gpu/gpu_bench.py after it has made the packages a torch-only machine lacks look uninstalled.
"""

from __future__ import annotations

import statistics

import torch

from rl.estimators.likelihood import get_estimator
from rl.samples.batch import LearnerBatch
from tools.gpu.gpu_measure import Budget, Clock, gib, peak_memory

GOALS = {"replay/standard": 1.1, "kpass3/standard": 2.0}  # bench/likelihood.py's CPU goals


def build_batch(
    model, rows: int, prompt: int, response: int, group: int, device: torch.device, seed: int = 0
) -> LearnerBatch:
    """Right-padded rows (BOS + prompt + response, random tokens; `group` consecutive rows share their prompt, as
    a GRPO group does), on the host like a collated rollout batch; the recorded states (replay) are the states of
    a no-grad forward, in host memory as they arrive from the engines."""
    g = torch.Generator().manual_seed(seed)
    V, L = model.config.vocab_size, prompt + response
    ids = torch.randint(3, V, (rows, L), generator=g)
    ids[:, :prompt] = ids[::group, :prompt].repeat_interleave(group, dim=0)[:rows]
    ids[:, 0] = model.config.bos_token_id
    am = torch.ones(rows, L, dtype=torch.long)
    batch = LearnerBatch(
        ids,
        am,
        torch.full((rows,), prompt),
        torch.full((rows,), response),
        torch.ones(rows, response),
        torch.zeros(rows, response),
    )
    with torch.no_grad():
        h, _ = model.run_stack(model.embed(ids.to(device)), am.to(device))
    batch.states = h[:, prompt - 1 : L - 1].to("cpu", torch.float32)  # row j = state at P + j - 1
    batch.extras["advantages"] = torch.randn(rows, generator=g)
    return batch


def fwd_bwd(model, batch: LearnerBatch, name: str, passes: int, mode: str = "soft") -> None:
    """One learner micro-batch: the estimator's log-probs, a GRPO-like surrogate, its backward."""
    model.zero_grad(set_to_none=True)
    lp = get_estimator(name)(model, batch, mode, passes=passes).logprobs
    adv = batch.extras["advantages"].to(lp.device)
    loss = -(lp * adv[:, None]).sum() / batch.response_mask.sum().to(lp.device)
    loss.backward()


def bench_learner(model, spec: dict, clock: Clock, budget: Budget, emit, device) -> dict:
    s = spec["learner"]
    model.train()
    batch = build_batch(model, s["rows"], s["prompt"], s["response"], s["group"], device)
    runs = {"standard": ("standard", 1), "replay": ("replay", 1), "kpass3": ("kpass", 3)}
    times = {k: [] for k in runs}
    peaks = {}
    for r in range(s["reps"] + 1):  # round 0 warms up and measures peak memory
        if r and budget.left() < 0:
            break
        for key, (name, passes) in runs.items():
            if r == 0:
                _, peaks[key] = peak_memory(device, lambda: fwd_bwd(model, batch, name, passes))
                continue
            t, _ = clock.time(lambda: fwd_bwd(model, batch, name, passes))
            times[key].append(t)
            emit(f"learner {key} rep {r}: {1000 * t:.1f} ms")
    model.zero_grad(set_to_none=True)
    if not times["standard"]:
        return {
            "skipped": "budget spent before the first timed run",
            "peak_gib_above_weights": {k: gib(v) for k, v in peaks.items()},
        }
    med = {k: statistics.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}
    ratios = {f"{k}/standard": round(med[k] / med["standard"], 4) for k in runs if k != "standard"}
    return {
        "micro_batch": f"{s['rows']} rows x ({s['prompt']} prompt + {s['response']} response), "
        f"{s['group']} rows per prompt",
        "tokens": s["rows"] * (s["prompt"] + s["response"]),
        "timed_reps": len(times["standard"]),
        "median_ms": {k: round(1000 * v, 2) for k, v in med.items()},
        "best_ms": {k: round(1000 * v, 2) for k, v in best.items()},
        "ratios_of_medians": ratios,
        "ratios_of_best": {f"{k}/standard": round(best[k] / best["standard"], 4) for k in runs if k != "standard"},
        "cpu_goals": GOALS,
        "meets_cpu_goals": {k: ratios[k] <= g for k, g in GOALS.items()},
        "peak_gib_above_weights": {k: gib(v) for k, v in peaks.items()},
    }


# ---- exact --------------------------------------------------------------------------------------------------
def bench_exact(model, spec: dict, clock: Clock, budget: Budget, emit, device) -> dict:
    s = spec["exact"]
    model.train()
    out = {"rows": s["rows"], "prompt": s["prompt"]}
    warm = build_batch(model, s["rows"], s["prompt"], 8, 1, device, seed=2)
    fwd_bwd(model, warm, "exact", 1)  # kernels for the recurrence's step shapes
    for R in s["responses"]:
        if budget.left() < 0:
            out[f"R{R}"] = {"skipped": "budget"}
            continue
        batch = build_batch(model, s["rows"], s["prompt"], R, 1, device, seed=R)
        try:
            (t, _), peak = peak_memory(device, lambda: clock.time(lambda: fwd_bwd(model, batch, "exact", 1)))
            t_replay, _ = clock.time(lambda: fwd_bwd(model, batch, "replay", 1))
        except torch.OutOfMemoryError as e:
            model.zero_grad(set_to_none=True)
            out[f"R{R}"] = {"error": f"out of memory: {str(e).splitlines()[0]}"}
            emit(f"exact R={R}: out of memory")
            continue
        out[f"R{R}"] = {
            "fwd_bwd_s": round(t, 3),
            "ms_per_response_token": round(1000 * t / R, 3),
            "peak_gib_above_weights": gib(peak),
            "replay_fwd_bwd_s": round(t_replay, 4),
            "exact_over_replay": round(t / t_replay, 1),
        }
        emit(f"exact R={R}: {t:.2f} s (replay {t_replay:.3f} s), peak {gib(peak)} GiB")
    model.zero_grad(set_to_none=True)
    return out
