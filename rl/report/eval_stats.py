"""The offline evaluation's statistics and tables: the unbiased pass@k estimator, McNemar's exact test for paired
decode modes, and the tables `fbrl eval` prints (rl/train/evaluator.py computes what they read)."""

from __future__ import annotations

import math


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k) (Chen et al., 2021)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for discordant counts b (A right, B wrong) and c (A wrong, B right).

    Under H0 each discordant pair goes either way with probability 1/2: p = 2 * P(Binom(b+c, 1/2) <= min(b, c)),
    capped at 1.
    """
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def pass_at_k_values(samples: int) -> list[int]:
    ks = [1]
    while ks[-1] * 2 <= samples:
        ks.append(ks[-1] * 2)
    return ks + ([samples] if ks[-1] != samples else [])


def optional_number(x, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def paired_tests(a: dict, b: dict, name_a: str, name_b: str) -> list[dict]:
    """McNemar's exact test of two evaluations of the same problems, greedy and (when both sampled) first sample.

    `a` / `b` are `result["per_problem"][mode]` ({"greedy": [0/1 per problem], "sampled": [...]}), from one
    checkpoint's modes or from two checkpoints evaluated on the same rows (`fbrl eval --baseline`)."""
    out = []
    for which in [w for w in ("greedy", "sampled", "greedy_lenient", "sampled_lenient") if w in a and w in b]:
        xa, xb = a[which], b[which]
        if len(xa) != len(xb):
            raise ValueError(
                f"paired test {name_a} vs {name_b}: {len(xa)} and {len(xb)} problems; "
                f"a paired test needs the same problems"
            )
        a_only = sum(p and not q for p, q in zip(xa, xb))
        b_only = sum(q and not p for p, q in zip(xa, xb))
        out.append(
            {
                "a": name_a,
                "b": name_b,
                "which": which,
                "a_only": a_only,
                "b_only": b_only,
                "p_value": mcnemar_exact(a_only, b_only),
            }
        )
    return out


def format_table(result: dict) -> str:
    """The printed summary: one row per decode mode, then the paired comparisons."""
    meta = result["meta"]
    ks = list(next(iter(result["modes"].values()))["pass_at_k"]) if result["modes"] else []
    head = (
        f"{'mode':<9} {'greedy':>7} {'sampled':>8} {'greedy~':>7} {'sampled~':>8} "
        + " ".join(f"{'pass@' + k:>8}" for k in ks)
        + f" {'len(g)':>7} {'len(s)':>7} {'trunc(g)':>8} {'trunc(s)':>8}"
    )
    lines = [
        f"n={meta['n']} samples={meta['samples']} T={meta['temperature']} scorer={meta['scorer']} "
        f"(~: lenient read, the last number in the response)",
        head,
        "-" * len(head),
    ]
    for mode, m in result["modes"].items():
        lenient = m.get("lenient_accuracy", {"greedy": None, "sampled": None})
        lines.append(
            f"{mode:<9} {m['accuracy']['greedy']:>7.3f} {optional_number(m['accuracy']['sampled']):>8} "
            f"{optional_number(lenient['greedy']):>7} {optional_number(lenient['sampled']):>8} "
            + " ".join(f"{m['pass_at_k'][k]:>8.3f}" for k in ks)
            + f" {m['mean_length']['greedy']:>7.1f} {optional_number(m['mean_length']['sampled'], '.1f'):>7}"
            + f" {m['truncation_rate']['greedy']:>8.3f} {optional_number(m['truncation_rate']['sampled']):>8}"
        )
    if result["paired"]:
        lines.append("paired (McNemar exact): a_only = problems only a solves, b_only = only b")
        for p in result["paired"]:
            lines.append(
                f"  {p['a']} vs {p['b']} ({p['which']}): a_only={p['a_only']} b_only={p['b_only']} p={p['p_value']:.4g}"
            )
    return "\n".join(lines)


def format_levels(results: dict[str, dict], which: str = "greedy") -> str:
    """One line per difficulty level: accuracy per mode (and baseline mode), then each paired test's
    difference in points and McNemar p (`fbrl eval --by-difficulty`)."""
    if not results:
        return ""
    first = next(iter(results.values()))
    modes = list(first["modes"])
    pairs = [(p["a"], p["b"]) for p in first["paired"] if p["which"] == which]
    head = "| level | n | " + " | ".join(modes + [f"{a} − {b} (points, p)" for a, b in pairs]) + " |"
    lines = [f"{which} accuracy by level", head, "|" + "---|" * (2 + len(modes) + len(pairs))]
    for level, res in results.items():
        accs = [f"{res['modes'][m]['accuracy'][which]:.3f}" for m in modes]
        diffs = []
        for p in res["paired"]:
            if p["which"] == which:
                d = 100 * (res["modes"][p["a"]]["accuracy"][which] - res["modes"][p["b"]]["accuracy"][which])
                diffs.append(f"{d:+.1f}, p={p['p_value']:.2g}")
        lines.append(f"| {level} | {res['meta']['n']} | " + " | ".join(accs + diffs) + " |")
    return "\n".join(lines)
