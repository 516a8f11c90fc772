"""Math reward throughput: rewards/s for typical completions, process pool vs in-process serial. Prints JSON.
With --suite: math-verify's own public test cases through our reward, as a table (bench/rewards_suite.py).

    python -m bench.rewards [--n 1024] [--workers 2] [--group 8] [--repeats 3]
    python -m bench.rewards --suite [--strict] [--verbose] [--json OUT]

Completions are generated deterministically: a GRPO-like batch of n/group prompts with `group` samples each
(so a gold answer is shared by a group, as in training). Half are the embedded arithmetic task's shape
(" 5*3=15, 37+15=52. \\boxed{52}"), half MATH-style (a paragraph of reasoning, then a fraction, root, interval,
set or polynomial in `\\boxed{}` or after "The final answer is"); about a third are wrong, a few carry no anchor
or are truncated. Both modes start warm (math-verify's first parses done, as a pool worker does before it is
ready) with cold gold caches (fresh workers for each pool pass); pool start-up is timed separately. Passes
alternate serial/pool (this machine is shared and noisy); the best wall time of each is reported, with CPU
seconds (the caller's plus, for the pool, its workers'). All passes must give identical scores (checked).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

from rewards.math import MathReward, _parse_gold, warm_worker  # noqa: E402

FILLER = (
    "We rewrite the expression and collect like terms. Substituting the known values and simplifying each "
    "factor separately keeps the arithmetic manageable; checking the boundary cases confirms the sign. "
)


def _math_answer(rng: random.Random) -> tuple[str, str]:
    """(gold, a correct but differently written prediction)."""
    kind = rng.randrange(6)
    a, b = rng.randint(1, 30), rng.randint(2, 40)
    if kind == 0:
        return f"\\frac{{{a}}}{{{b}}}", f"\\dfrac{{{2 * a}}}{{{2 * b}}}"
    if kind == 1:
        return f"{a}\\sqrt{{{b}}}", f"\\sqrt{{{a * a * b}}}"
    if kind == 2:
        return f"[{-a}, {b})", f"[{-a},{b})"
    if kind == 3:
        return f"\\{{{a},{b}\\}}", f"\\{{{b}, {a}\\}}"
    if kind == 4:
        return f"x^2+{a + b}x+{a * b}", f"(x+{a})(x+{b})"
    return str(a / 4), f"\\frac{{{a}}}{{4}}"


def _arith(rng: random.Random) -> tuple[str, str, str]:
    x, y, z = rng.randint(1, 99), rng.randint(1, 12), rng.randint(1, 12)
    v = x + y * z
    return f"Q: {x}+{y}*{z}=? Put the answer in \\boxed{{}}.\nA:", str(v), f" {y}*{z}={y * z}, {x}+{y * z}={v}."


def make_batch(n: int, group: int, seed: int = 0):
    rng = random.Random(seed)
    prompts, completions, golds, finish = [], [], [], []
    for p in range(n // group):
        if p % 2 == 0:
            prompt, gold, work = _arith(rng)
            right = [f"{work} \\boxed{{{gold}}}"]
            wrong = f"{work} \\boxed{{{int(gold) + rng.choice((-1, 1, 10))}}}"
        else:
            prompt = f"Problem {p}: find the value."
            gold, pred = _math_answer(rng)
            body = FILLER * rng.randint(2, 6)
            right = [f"{body}\\boxed{{{pred}}}", f"{body}The final answer is ${pred}$. I hope it is correct."]
            wrong = f"{body}\\boxed{{{pred}+1}}"
        for j in range(group):
            r = rng.random()
            text = wrong if r < 0.3 else "I could not finish the computation." if r < 0.35 else rng.choice(right)
            prompts.append(prompt)
            completions.append(f"Attempt {j}:{text}")  # samples differ, so nothing is scored twice
            golds.append(gold)
            finish.append("length" if rng.random() < 0.03 else "stop")
    return prompts, completions, golds, finish


def _cpu_s(pids: list[int]) -> float:
    """utime + stime of live processes (Linux /proc), in seconds."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--repeats", type=int, default=3, help="alternating serial/pool passes; best of each reported")
    ap.add_argument("--timeout-s", type=float, default=10.0)
    ap.add_argument("--suite", action="store_true", help="math-verify's public test cases: agree / by design / wrong")
    ap.add_argument("--strict", action="store_true", help="--suite with the strict option (literal numbers)")
    ap.add_argument("--verbose", action="store_true", help="--suite: list every case that does not agree")
    ap.add_argument("--json", default=None, help="--suite: write counts and per-case rows here")
    args = ap.parse_args()
    if args.suite:
        return suite(args)
    prompts, completions, golds, finish = make_batch(args.n, args.group)
    n = len(completions)

    warm_worker()  # what every pool worker does before it is ready: same warm state for both modes
    serial = MathReward(in_process=True, timeout_s=args.timeout_s)
    pooled = MathReward(num_workers=args.workers, timeout_s=args.timeout_s)
    t0 = time.perf_counter()
    pooled.pool.warmup()
    start_s = time.perf_counter() - t0
    runs = {"serial": [], "pool": []}
    for _ in range(args.repeats):
        for mode, reward in (("serial", serial), ("pool", pooled)):
            _parse_gold.cache_clear()  # cold gold caches in every pass (the workers' are cleared by restarting)
            if mode == "pool":
                pooled.pool.close()
                pooled._pool = None
                pooled.pool.warmup()
            pids = [] if mode == "serial" else pooled.pool.worker_pids()
            cpu0, wcpu0, t0 = time.process_time(), _cpu_s(pids), time.perf_counter()
            out = reward(prompts, completions, golds, finish_reasons=finish)
            wall = time.perf_counter() - t0
            runs[mode].append((wall, time.process_time() - cpu0 + _cpu_s(pids) - wcpu0, out))
    pooled.close()
    best = {m: min(r, key=lambda x: x[0]) for m, r in runs.items()}
    (s_wall, s_cpu, s_out), (p_wall, p_cpu, p_out) = best["serial"], best["pool"]
    print(
        json.dumps(
            {
                "n": n,
                "group": args.group,
                "workers": args.workers,
                "cpus": os.cpu_count(),
                "repeats": args.repeats,
                "serial_s": round(s_wall, 3),
                "serial_rewards_per_s": round(n / s_wall, 1),
                "serial_cpu_s": round(s_cpu, 3),
                "pool_s": round(p_wall, 3),
                "pool_rewards_per_s": round(n / p_wall, 1),
                "pool_cpu_s": round(p_cpu, 3),
                "pool_speedup": round(s_wall / p_wall, 2),
                "pool_start_s": round(start_s, 3),
                "all_walls_s": {m: [round(w, 2) for w, _, _ in r] for m, r in runs.items()},
                "mean_reward": round(sum(p_out) / n, 4),
                "identical_scores": all(list(o) == list(s_out) for r in runs.values() for _, _, o in r),
                "counts": p_out.counts,
                "errors": p_out.errors,
                "timeouts": p_out.timeouts,
                "load_avg_1m": round(os.getloadavg()[0], 2),
            }
        )
    )


def suite(args) -> None:
    from bench import rewards_suite as rs

    result = rs.run_suite(strict=args.strict)
    print(rs.format_table(result, rs.math_verify_alone(), verbose=args.verbose))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":  # the pool's forkserver/spawn children import this file's path
    main()
