"""RewardPool: hard per-item timeouts, crash recovery, and ≥ 50 adversarial completions through the math scorer.

Every adversarial item must come back within timeout + 1 s with a score in {0, 1}; the caller never sees an
exception, and afterwards the same pool still scores ordinary items correctly.
"""

import os
import time
from types import SimpleNamespace

import pytest

from rewards.math import WORKER_PRELOAD, MathReward, score_completion, warm_worker
from rewards.pool import RewardPool, _Pending

MB = 1_000_000
TIMEOUT_S = 2.0


# Item functions run in the workers; they are module-level so they pickle by reference.
def echo(x):
    return x


def sleep_then(seconds, x):
    time.sleep(seconds)
    return x


def hard_exit(code):
    os._exit(code)


def raise_value_error(msg):
    raise ValueError(msg)


def busy_c_loop():
    return 9 ** (9 ** 9)  # seconds of C bignum work: no signal gets in, only a kill stops it


def unpicklable():
    return lambda: None


@pytest.fixture(scope="module")
def pool():
    # Same preload as the math reward so the fork server (one per process) is warm for every pool in this run.
    # 3 workers on 2 cores: adversarial items mostly wait for (wall-clock) soft timeouts, not for CPU.
    p = RewardPool(num_workers=3, timeout_s=TIMEOUT_S, preload=WORKER_PRELOAD, init=warm_worker)
    yield p
    p.close()


def test_results_in_order(pool):
    out = pool.map(echo, [(i,) for i in range(20)])
    assert [r.value for r in out] == list(range(20))
    assert all(r.status == "ok" for r in out)


def test_keys_keep_a_group_on_one_worker_and_idle_workers_steal():
    p = _Pending(["a", "a", "b", "b", "c"])
    w1, w2 = SimpleNamespace(key=None), SimpleNamespace(key=None)
    assert [p.take(w1), p.take(w2), p.take(w1), p.take(w1), p.take(w2)] == [0, 2, 1, 4, 3]
    assert not p
    p = _Pending(["g"] * 4)
    assert [p.take(w1), p.take(w2), p.take(w2), p.take(w1)] == [0, 3, 1, 2]  # w2 steals the back item, then shares
    p.put_back(1)  # a requeued item (its worker was killed) is up for claiming again
    assert p and p.take(SimpleNamespace(key=None)) == 1


def test_keyed_map_returns_item_order(pool):
    out = pool.map(echo, [(i,) for i in range(12)], keys=[i % 3 for i in range(12)])
    assert [r.value for r in out] == list(range(12))
    with pytest.raises(ValueError, match="keys"):
        pool.map(echo, [(1,)], keys=[1, 2])


def test_hang_crash_error_are_isolated_and_workers_replaced(pool):
    pids = set(pool.worker_pids())
    before = dict(pool.stats)
    t0 = time.monotonic()
    out = pool.map(echo, [])
    assert out == []
    items = [(sleep_then, (30, "hung")), (hard_exit, (3,)), (raise_value_error, ("boom",)), (echo, ("fine",))]
    results = [pool.map(fn, [args])[0] for fn, args in items]
    assert [r.status for r in results] == ["timeout", "crash", "error", "ok"]
    assert results[0].seconds < TIMEOUT_S + 1
    assert "exit code 3" in results[1].error and "boom" in results[2].error
    assert results[3].value == "fine"
    assert pool.stats["timeouts"] == before["timeouts"] + 1 and pool.stats["crashes"] == before["crashes"] + 1
    assert pool.stats["restarts"] == before["restarts"] + 2
    assert len(set(pool.worker_pids()) - pids) == 2  # both killed/dead workers were replaced
    assert time.monotonic() - t0 < 2 * (TIMEOUT_S + 1)


def call(fn, *args):
    return fn(*args)


def test_c_level_hang_is_killed_while_other_items_flow():
    # Its own pool with a longer timeout: on a loaded 2-core machine a fresh worker can wait > 2 s for a core
    # before it even sends the unpicklable item's error, which then reads as a timeout (seen at load 13).
    timeout_s = 3 * TIMEOUT_S
    items = [(busy_c_loop,), (sleep_then, 30, 0), (unpicklable,)] + [(echo, i) for i in range(1, 9)]
    with RewardPool(num_workers=3, timeout_s=timeout_s, preload=WORKER_PRELOAD, init=warm_worker) as p:
        out = p.map(call, items)
    assert [r.status for r in out[:3]] == ["timeout", "timeout", "error"]
    assert out[0].seconds < timeout_s + 1 and out[1].seconds < timeout_s + 1
    assert "could not be sent" in out[2].error
    assert [r.value for r in out[3:]] == list(range(1, 9))  # the third worker kept serving meanwhile


def test_big_item_is_not_queued_behind_a_hung_one():
    # A 1 MB item queued behind a hung item would block the dispatcher in send() until the hang ends.
    with RewardPool(num_workers=1, timeout_s=1.0, preload=WORKER_PRELOAD, init=warm_worker) as p:
        t0 = time.monotonic()
        out = p.map(sleep_then, [(30, 0), (0, "x" * MB), (0, 2)])
        assert [r.status for r in out] == ["timeout", "ok", "ok"]
        assert len(out[1].value) == MB and out[2].value == 2
        assert time.monotonic() - t0 < 1.0 + 2.0


def test_spawn_start_method_works_too():
    with RewardPool(num_workers=1, timeout_s=5.0, start_method="spawn") as p:
        out = p.map(echo, [(1,), ("two",)]) + p.map(hard_exit, [(0,)]) + p.map(echo, [(3,)])
        assert [r.status for r in out] == ["ok", "ok", "crash", "ok"] and out[3].value == 3


def test_bad_start_is_loud():
    with pytest.raises(RuntimeError, match="no_such_module_xyz"):
        p = RewardPool(num_workers=1, timeout_s=1.0, preload=("no_such_module_xyz",))
        try:
            p.map(echo, [(1,)])
        finally:
            p.close()
    with pytest.raises(ValueError, match="fork"):
        RewardPool(start_method="fork")


def adversarial_completions() -> list[str]:
    huge_exponents = [
        "\\boxed{9^{9^{9^{9}}}}", "\\boxed{9^9^9^9}", "The final answer is 9^9^9^9", "\\boxed{10^{10^{10}}}",
        "\\boxed{2^{2^{2^{2^{2^{2}}}}}}", "\\boxed{(10^{100})!}", "\\boxed{100000!}", "\\boxed{10^{-10^{10}}}",
        "\\boxed{e^{e^{e^{e^{100}}}}}", "\\boxed{\\sqrt{2}^{10^{10}}}", "\\boxed{9^{9^{9^{9}}} - 9^{9^{9^{9}}}}",
        "\\boxed{\\sum_{n=1}^{10^{10}} n}", "\\boxed{\\binom{10^{9}}{5 \\cdot 10^{8}}}", "\\boxed{42^{42^{42}}}",
    ]
    nested = ["\\boxed{" + "{" * k + "42" + "}" * k + "}" for k in (10, 100, 250, 5000)] + [
        "\\boxed{" + "\\frac{1}{" * 200 + "2" + "}" * 200 + "}",
        "\\boxed{" + "(" * 400 + "1" + ")" * 400 + "}",
        "\\boxed{" + "\\sqrt{" * 100 + "2" + "}" * 100 + "}",
    ]
    malformed = [
        "\\boxed{\\frac{1}{}", "\\boxed{\\frac}", "\\boxed{\\left( 1 }", "\\boxed{\\begin{matrix} 1 & 2 \\\\ }",
        "\\boxed{\\sqrt[}{2}}", "\\boxed{^^^}", "\\boxed{\\\\\\\\}", "\\boxed{$$}", "\\boxed{\\end{array}}",
        "\\boxed{1 = = = 2}", "\\boxed{\\text{}}", "\\boxed{}", "\\boxed{{}}", "\\boxed{\\}", "\\boxed{\\frac{1}{0}}",
        "\\boxed{0/0}", "\\boxed{\\log(0)}", "\\boxed{\\infty - \\infty}", "Final answer: $$$$",
    ]
    unicode = [
        "\\boxed{４２}", "\\boxed{٤٢}", "\\boxed{42\u200b}", "\\boxed{½}", "\\boxed{√2}", "\\boxed{π}",
        "\\boxed{\ud800}", "\\boxed{😀}", "\\boxed{4\u03002}", "\\boxed{\u202e42}", "\\boxed{4\x002}",
    ]
    one_mb = [
        "x" * MB, "x" * MB + "\\boxed{42}", "\\boxed{" + "1" * MB + "}", "$" * MB, "{" * MB, "}" * MB, "\\" * MB,
        "\\boxed{" * (MB // 7), "final answer is " + "9" * MB, "Final answer: " + "(" * MB, "😀" * (MB // 4),
        "\\boxed{42}" + " " * MB,
    ]
    return huge_exponents + nested + malformed + unicode + one_mb


def test_adversarial_completions(pool):
    comps = adversarial_completions()
    assert len(comps) >= 50
    items = [("42", c, 512, 1) for c in comps]
    t0 = time.monotonic()
    out = pool.map(score_completion, items)
    wall = time.monotonic() - t0
    slow = [(i, r.seconds) for i, r in enumerate(out) if r.seconds > TIMEOUT_S + 1]
    assert not slow
    assert wall < (len(items) / pool.num_workers + 1) * (TIMEOUT_S + 1)
    scores = [r.value[0] if r.status == "ok" else 0.0 for r in out]
    assert set(scores) <= {0.0, 1.0}
    # The answer after a megabyte of junk, and before a megabyte of spaces, is still found.
    assert scores[comps.index("x" * MB + "\\boxed{42}")] == 1.0
    assert scores[comps.index("\\boxed{42}" + " " * MB)] == 1.0
    # The pool still answers, correctly, through the math reward.
    reward = MathReward(pool=pool)
    assert list(reward(["q"] * 3, ["\\boxed{42}", "\\boxed{41}", "\\boxed{-7}"], ["42", "42", "-7"])) == [1, 0, 1]


def test_math_reward_counts_hard_timeouts():
    with RewardPool(num_workers=1, timeout_s=1.0, preload=WORKER_PRELOAD, init=warm_worker) as p:
        reward = MathReward(pool=p, mv_timeout_s=30)  # soft timeout above the hard one: the kill must act
        out = reward(["q"] * 2, ["\\boxed{42^{42^{42}}}", "\\boxed{42}"], ["42", "42"])
        assert list(out) == [0.0, 1.0]
        assert out.timeouts == 1 and p.stats["timeouts"] == 1


def test_interrupted_call_does_not_leak_results_into_the_next(pool):
    # Simulate a map() that was interrupted (Ctrl-C) while a worker still held its item.
    w = next(w for w in pool._workers if w.ready)
    w.conn.send((sleep_then, (0, "stale")))
    w.queue.append(0)
    w.head_started = time.monotonic()
    out = pool.map(echo, [("fresh",)] * 4)
    assert [r.value for r in out] == ["fresh"] * 4
