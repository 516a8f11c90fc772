"""The loop's console output: one line per step (`console_line`), a reward's failure printed once with its message
(`report_failures`), and the held-out eval line."""

from __future__ import annotations

from rl.report.metrics import EVAL_ACCURACY, EVAL_LENIENT, REWARD, by_mode, reward_failures


def fmt(acc: dict) -> str:
    return " ".join(f"{m} {a:.3f}" for m, a in acc.items())


def step_label(step: int, steps: int) -> str:
    return f"step {step:>{len(str(steps))}}/{steps}"


def eval_line(step: int, steps: int, strict: dict, lenient: dict, n_problems: int) -> str:
    return (
        f"{step_label(step, steps)} | eval {fmt(strict)}, lenient {fmt(lenient)} (held-out greedy, "
        f"{n_problems} problems)"
    )


def report_failures(failures: list[str], reported: set, log) -> None:
    """Print a reward's failure the first time it fails that way ("reward 'judge' raised ...", "... timed out");
    after that the step line counts them (`reward failures: judge 8`) and metrics.jsonl has every count."""
    for line in failures:
        name, _, rest = line.partition("' ")  # "reward 'judge", "raised RuntimeError: ..."
        kind = (name, rest.split(" ", 1)[0])
        if kind not in reported:
            reported.add(kind)
            log(f"{line} (printed once; the step lines count repeats)")


def console_line(m: dict, steps: int) -> str:
    """One line per step: what was learned (reward, accuracy), what was sampled (length, truncated share), how
    far the learner's log-probs are from the engine's, the KL to the reference when it is on, where the time
    went, the eval when there was one, and what went wrong (failed rewards, a skipped update)."""
    acc = "-" if m["accuracy"] is None else f"{m['accuracy']:.3f}"
    mismatch = m["logprob_mismatch_abs_mean"]
    parts = [
        step_label(m["step"], steps),
        f"reward {m['reward_mean']:.3f} acc {acc}",
        f"len {m['response_len_mean']:.1f} trunc {m['truncation_rate']:.2f}",
        "mismatch -" if mismatch is None else f"mismatch {mismatch:.1e}",
    ]
    if m.get("learner/kl_loss") is not None:
        parts.append(f"kl {m['learner/kl_loss']:.2e}")
    phases = {p: m[f"time_{p}_s"] for p in ("rollout", "reward", "learner", "sync")}
    # eval and checkpoint: what the phases do not account for. With the rollout queue (rl/train/rollout_queue.py) the
    # step holds only the wait for its batch (all of steps 1-2 when made inline, none when made ahead) and the
    # mismatch parts besides the learner and sync.
    accounted = (
        sum(phases.values())
        if "time_wait_s" not in m
        else m["time_wait_s"] + m.get("time_mismatch_parts_s", 0.0) + phases["learner"] + phases["sync"]
    )
    other = m["time_step_s"] - accounted
    parts.append(
        f"{m['time_step_s']:.1f}s: "
        + " ".join(f"{p} {t:.2f}" if t < 0.1 else f"{p} {t:.1f}" for p, t in phases.items())
        + (f" eval/ckpt {other:.1f}" if other >= 0.1 else "")
    )
    evals = by_mode(m, EVAL_ACCURACY)
    if evals:
        lenient = by_mode(m, EVAL_LENIENT)
        parts.append(f"eval {fmt(evals)}" + (f" (lenient {fmt(lenient)})" if lenient else ""))
    # samples each reward scored 0 because it raised or timed out
    failed = {name: n for name, n in reward_failures(m, prefix=REWARD).items() if n}
    if failed:  # the first failure of each kind was printed with its message (`report_failures`)
        parts.append("reward failures: " + ", ".join(f"{name} {int(n)}" for name, n in failed.items()))
    if m.get("staleness_max"):
        parts.append(f"stale {m['staleness_mean']:.1f} versions (waited {m['time_wait_s']:.1f}s)")
    if m.get("samples_stale_dropped"):
        parts.append(f"{m['samples_stale_dropped']} samples too stale: dropped")
    if m.get("skipped_nonfinite"):
        parts.append("skipped: loss or gradients not finite")
    elif m["skipped"]:
        parts.append("skipped: no usable signal")
    return " | ".join(parts)
