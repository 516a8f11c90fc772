"""The silent-zero failure cannot happen here: scoring from a worker thread, an asyncio loop and Ray actors
(plain and threaded) gives exactly the main thread's rewards.

math-verify's timeouts use signal.alarm, which only works in a main thread; elsewhere it raises, and frameworks
that catch that error score 0 without saying so. Ray runs as fbrl starts it (127.0.0.1, a token for the run) with one CPU.
"""

import asyncio
import sys
import threading

import pytest

from rewards.math import MathReward

CASES = [
    ("42", "\\boxed{42}"),
    ("-7", "\\boxed{-7}"),
    ("\\frac{1}{2}", "The final answer is 0.5"),
    ("[0,1)", "\\boxed{[0, 1)}"),
    ("x^2+2x+1", "\\boxed{(x+1)^2}"),
    ("5", "\\boxed{3}, no: \\boxed{5}"),
    ("3", "\\boxed{4}"),
    ("42", "the answer is 42"),
    ("\\{1,2\\}", "\\boxed{\\{2,1\\}}"),
    ("2\\pi", "\\boxed{2\\pi}"),
]
GOLDS = [g for g, _ in CASES]
COMPS = [c for _, c in CASES]
EXPECTED = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0]


def score(reward: MathReward) -> list[float]:
    out = reward(["q"] * len(CASES), COMPS, GOLDS)
    assert out.errors == 0 and out.timeouts == 0
    return list(out)


@pytest.fixture(scope="module", params=["pool", "in_process"])
def reward(request):
    r = MathReward(in_process=request.param == "in_process", num_workers=1, timeout_s=10.0)
    yield r
    r.close()


def in_thread(fn, *args):
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("out", fn(*args)))
    t.start()
    t.join(120)
    return box["out"]


def test_math_verify_itself_fails_off_the_main_thread():
    # The failure mode we guard against: plain math-verify in a thread raises instead of scoring.
    from math_verify import parse

    def call():
        try:
            parse("\\boxed{1}", parsing_timeout=5, raise_on_error=True)
            return "scored"
        except ValueError as e:
            return str(e)

    assert "threaded environment" in in_thread(call)


def test_worker_thread_and_asyncio_equal_main_thread(reward):
    main = score(reward)
    assert main == EXPECTED
    assert in_thread(score, reward) == main  # one pool, used from another thread

    async def from_loop():
        return await asyncio.to_thread(score, reward)

    assert asyncio.run(from_loop()) == main


class Scorer:
    """Ray actor body: one pooled and one in-process math reward, created inside the actor."""

    def __init__(self):
        self.rewards = {"pool": MathReward(num_workers=1), "in_process": MathReward(in_process=True)}

    def score(self, mode):
        return score(self.rewards[mode]), threading.current_thread() is threading.main_thread()


def test_ray_actors_equal_main_thread():
    ray = pytest.importorskip("ray")
    from ray import cloudpickle

    from actors.placement import start_local_ray

    main = score(MathReward(in_process=True))  # this test's main thread
    assert main == EXPECTED
    # Ship this module's code (Scorer, score) by value: Ray workers need not find the tests folder, and an
    # already running Ray (another test's) serves as well.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    started = not ray.is_initialized()
    if started:
        start_local_ray(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        actor = ray.remote(num_cpus=0)(Scorer)
        plain = actor.remote()  # a plain actor runs methods in its main thread
        threaded = actor.options(max_concurrency=2).remote()  # methods run in a thread pool: no main thread
        calls = [a.score.remote(m) for a in (plain, threaded) for m in ("pool", "in_process")]
        got = ray.get(calls, timeout=240)
        assert [on_main for _, on_main in got] == [True, True, False, False]  # both situations really occur
        assert [scores for scores, _ in got] == [main] * 4
        for a in (plain, threaded):
            ray.kill(a)
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        if started:
            ray.shutdown()
