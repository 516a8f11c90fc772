"""RewardSet and the loader: weights, metrics, user functions that raise / hang / return junk, config specs.

A failing user function must be counted, scored 0, reported with its name, and the batch must complete.
"""

import asyncio
import logging
import textwrap
import threading
import time

import numpy as np
import pytest

from rewards.base import RewardEntry, RewardResult, RewardSet, validate_scores
from rewards.loader import RewardLoadError, build_reward_set, load_reward_fn, make_reward
from rewards.math import MathReward

P, C, A = ["p1", "p2", "p3"], ["\\boxed{1}", "\\boxed{2}", "nothing"], ["1", "3", "1"]


def length_reward(prompts, completions, answers, **row_fields):
    return [len(c) / 10 for c in completions]


def uses_row_field(prompts, completions, answers, difficulty):
    return [float(d) for d in difficulty]


def raises(prompts, completions, answers, **kw):
    raise ZeroDivisionError("user bug")


def hangs(prompts, completions, answers, **kw):
    time.sleep(1.5)
    return [1.0] * len(completions)


def wrong_length(prompts, completions, answers, **kw):
    return [1.0]


def wrong_type(prompts, completions, answers, **kw):
    return "1.0"


def bad_items(prompts, completions, answers, **kw):
    return [1.0, float("nan"), "x"]


def numpy_scores(prompts, completions, answers, **kw):
    return np.array([0.5, 0.25, 1.0])


async def async_reward(prompts, completions, answers, **kw):
    await asyncio.sleep(0.01)
    return [2.0] * len(completions)


async def async_hangs(prompts, completions, answers, **kw):
    await asyncio.sleep(30)
    return [1.0] * len(completions)


def test_weights_row_fields_and_metrics():
    rs = RewardSet([(length_reward, 2.0), (uses_row_field, -1.0), async_reward, numpy_scores])
    out = rs(P, C, A, difficulty=[1, 2, 3], unrelated=["a", "b", "c"])
    assert out.per_reward["length_reward"] == [0.9, 0.9, 0.7]
    assert out.per_reward["uses_row_field"] == [1.0, 2.0, 3.0]  # only the fields it names are passed
    assert out.per_reward["async_reward"] == [2.0] * 3
    expected = [2 * x - d + 2 + n for x, d, n in zip([0.9, 0.9, 0.7], [1, 2, 3], [0.5, 0.25, 1.0])]
    assert out.rewards == pytest.approx(expected)
    m = out.metrics
    assert m["rewards/length_reward/mean"] == pytest.approx(2.5 / 3)
    assert m["rewards/length_reward/errors"] == 0 and m["rewards/length_reward/timeouts"] == 0
    assert m["rewards/length_reward/latency_s"] >= 0 and m["rewards/total/mean"] == pytest.approx(sum(expected) / 3)
    assert out.errors == []


def test_failing_user_functions_are_counted_named_and_zeroed(caplog):
    rs = RewardSet(
        [
            raises,
            wrong_length,
            wrong_type,
            bad_items,
            length_reward,
            RewardEntry(hangs, 1.0, timeout_s=0.5),
            RewardEntry(async_hangs, 1.0, timeout_s=0.5),
        ]
    )
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="rewards.base"):
        out = rs(P, C, A)
    assert time.monotonic() - t0 < 2.0  # the batch completes at the deadline, not when the hung function returns
    m = out.metrics
    for name in ("raises", "wrong_length", "wrong_type"):
        assert out.per_reward[name] == [0.0] * 3 and m[f"rewards/{name}/errors"] == 3
    assert out.per_reward["bad_items"] == [1.0, 0.0, 0.0] and m["rewards/bad_items/errors"] == 2
    for name in ("hangs", "async_hangs"):
        assert out.per_reward[name] == [0.0] * 3 and m[f"rewards/{name}/timeouts"] == 3
    assert out.per_reward["length_reward"] == [0.9, 0.9, 0.7]  # the healthy reward is untouched
    assert out.rewards == pytest.approx([1.9, 0.9, 0.7])
    text = "\n".join(out.errors)
    for frag in (
        "'raises' raised ZeroDivisionError: user bug",
        "'wrong_length' returned 1 scores for a batch of 3",
        "'wrong_type' returned str",
        "'bad_items' returned a non-finite",
        "'hangs' timed out after 0.5 s",
        "'async_hangs' timed out",
    ):
        assert frag in text
    assert "'raises' raised ZeroDivisionError" in caplog.text


def test_hung_function_is_not_reentered_until_it_returns():
    rs = RewardSet([RewardEntry(hangs, 1.0, timeout_s=0.3)])
    first = rs(P, C, A)
    hung = rs.entries[0].running
    before = set(threading.enumerate())
    second = rs(P, C, A)  # the first call's thread is still sleeping
    assert first.metrics["rewards/hangs/timeouts"] == 3 and second.metrics["rewards/hangs/timeouts"] == 3
    assert "still running" in second.errors[0]
    assert hung.is_alive() and set(threading.enumerate()) - before == set()  # no second thread for it
    hung.join(5)
    third = rs(P, C, A)  # once the old call has returned, the function is called again
    assert "timed out" in third.errors[0]


def test_reward_result_counts_flow_into_metrics():
    def counted(prompts, completions, answers):
        return RewardResult([0.0, 1.0, 0.0], errors=1, timeouts=1, counts={"no_answer": 1})

    out = RewardSet([counted])(P, C, A)
    assert out.metrics["rewards/counted/errors"] == 1 and out.metrics["rewards/counted/timeouts"] == 1
    assert out.metrics["rewards/counted/no_answer"] == 1


def test_validate_scores_edge_cases():
    assert validate_scores([True, 0, 2.5], 3) == ([1.0, 0.0, 2.5], 0, "")
    assert validate_scores(None, 2)[1] == 2
    assert validate_scores({"a": 1.0}, 1)[1] == 1
    assert validate_scores([float("inf")], 1)[:2] == ([0.0], 1)


def test_duplicate_names_and_mismatched_batch():
    rs = RewardSet([length_reward, length_reward])
    assert [e.name for e in rs.entries] == ["length_reward", "length_reward_2"]
    with pytest.raises(ValueError, match="batch sizes differ"):
        rs(P, C, A[:2])


def test_acall_from_a_running_event_loop():
    rs = RewardSet([async_reward, length_reward])
    out = asyncio.run(rs.acall(P, C, A))
    assert out.per_reward["async_reward"] == [2.0] * 3


# ----- loader ---------------------------------------------------------------------------------------------------
@pytest.fixture
def user_file(tmp_path):
    f = tmp_path / "my_rewards.py"
    f.write_text(
        textwrap.dedent("""
        def correct_len(prompts, completions, answers, **row_fields):
            return [float(len(c) == len(a)) for c, a in zip(completions, answers)]

        def too_few(prompts, completions):
            return [0.0]

        class Stateful:
            def __init__(self):
                self.calls = 0
            def __call__(self, prompts, completions, answers, **kw):
                self.calls += 1
                return [float(self.calls)] * len(completions)

        NOT_A_FUNCTION = 3
    """)
    )
    (tmp_path / "broken.py").write_text("import no_such_module_abc\n")
    return f


def test_load_from_file_and_module(user_file, tmp_path):
    fn = load_reward_fn(f"{user_file}:correct_len")
    assert fn(["p"], ["ab"], ["xy"]) == [1.0]
    fn2 = load_reward_fn("my_rewards.py:correct_len", base_dir=tmp_path)  # relative to the config's folder
    assert fn2 is fn
    inst = load_reward_fn(f"{user_file}:Stateful")
    assert inst(["p"], ["c"], ["a"]) == [1.0] and inst.__name__ == "Stateful"
    assert load_reward_fn("rewards.math:format_reward")(["p"], ["\\boxed{1}"], ["1"]) == [1.0]


@pytest.mark.parametrize(
    "spec,fragment",
    [
        ("missing_dir/nope.py:fn", "reward file not found"),
        ("no_such_pkg_xyz.mod:fn", "reward module 'no_such_pkg_xyz.mod' not found"),
        ("rewards.math:no_such_fn", "has no function 'no_such_fn'"),
        ("rewards.math", "must look like"),
        ("rewards.math:", "must look like"),
    ],
)
def test_load_errors_name_what_is_missing(spec, fragment):
    with pytest.raises(RewardLoadError, match=fragment):
        load_reward_fn(spec)


def test_load_errors_in_user_files(user_file, tmp_path):
    with pytest.raises(RewardLoadError, match=r"reward function 'too_few' must accept \(prompts, completions"):
        load_reward_fn(f"{user_file}:too_few")
    with pytest.raises(RewardLoadError, match="not a function"):
        load_reward_fn(f"{user_file}:NOT_A_FUNCTION")
    with pytest.raises(RewardLoadError, match=r"has no function 'nope'.*correct_len"):
        load_reward_fn(f"{user_file}:nope")
    with pytest.raises(RewardLoadError, match=r"importing reward file .*broken.py failed: ModuleNotFoundError"):
        load_reward_fn(f"{tmp_path / 'broken.py'}:fn")


def test_build_reward_set_with_builtins(user_file):
    rs = build_reward_set(
        [
            {"fn": "math", "weight": 1.0, "options": {"in_process": True}},
            {"fn": "format", "weight": 0.1},
            {"fn": f"{user_file}:correct_len", "weight": 0.5, "timeout_s": 5},
        ]
    )
    assert isinstance(rs.entries[0].fn, MathReward) and rs.entries[0].timeout_s is None
    assert rs.entries[1].timeout_s == 60.0 and rs.entries[2].timeout_s == 5
    pooled = build_reward_set([{"fn": "math", "timeout_s": 3.0}], num_workers=3).entries[0]
    # For math, timeout_s is its pool's per-item deadline; the call itself runs inline.
    assert pooled.timeout_s is None and pooled.fn.timeout_s == 3.0 and pooled.fn.num_workers == 3
    out = rs(P, C, A, finish_reasons=["stop", "stop", "length"])
    assert out.per_reward["math"] == [1.0, 0.0, 0.0] and out.per_reward["format_reward"] == [1.0, 1.0, 0.0]
    assert out.rewards == pytest.approx([1.1 + 0.5 * 0, 0.1, 0.0 + 0.5 * 0])
    assert out.metrics["rewards/math/wrong"] == 1 and out.metrics["rewards/math/truncated"] == 1
    with pytest.raises(RewardLoadError, match="only for built-in"):
        make_reward(f"{user_file}:correct_len", in_process=True)
    with pytest.raises(RewardLoadError, match="needs 'fn'"):
        build_reward_set([{"weight": 1.0}])
    rs.close()
