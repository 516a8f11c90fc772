"""Every shape a user's reward can return is either taken as its numbers or counted as a failure with a line naming
the reward; none ends the batch (rewards.base.RewardSet)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rewards.base import RewardSet
from rewards.conventions import adapt

N = 2
# (what the reward returns for a batch of N, the scores taken, samples counted as errors, a piece of the line)
BATCH_RETURNS = [
    ("list of floats", lambda: [0.5, 1.0], [0.5, 1.0], 0, ""),
    ("list of ints and bools", lambda: [1, True], [1.0, 1.0], 0, ""),
    ("list of numpy scalars", lambda: [np.float32(0.5), np.int64(1)], [0.5, 1.0], 0, ""),
    ("list of 0-d tensors", lambda: [torch.tensor(0.5), torch.tensor(1.0, requires_grad=True)], [0.5, 1.0], 0, ""),
    ("list of 0-d arrays", lambda: [np.array(0.5), np.array(1.0)], [0.5, 1.0], 0, ""),
    ("1-d tensor", lambda: torch.tensor([0.5, 1.0]), [0.5, 1.0], 0, ""),
    ("1-d array", lambda: np.array([0.5, 1.0]), [0.5, 1.0], 0, ""),
    ("tuple", lambda: (0.5, 1.0), [0.5, 1.0], 0, ""),
    ("a None in the list", lambda: [None, 1.0], [0.0, 1.0], 1, "non-numeric score None"),
    ("a NaN in the list", lambda: [math.nan, 1.0], [0.0, 1.0], 1, "non-finite"),
    ("an inf in the list", lambda: [0.5, -math.inf], [0.5, 0.0], 1, "non-finite"),
    ("an absurd score", lambda: [0.5, 1e9], [0.5, 0.0], 1, "absurd"),
    ("a str in the list", lambda: ["1", 1.0], [0.0, 1.0], 1, "non-numeric score '1'"),
    ("a complex in the list", lambda: [1j, 1.0], [0.0, 1.0], 1, "non-numeric score 1j"),
    ("a huge int in the list", lambda: [10**400, 1.0], [0.0, 1.0], 1, "non-numeric"),
    ("a NaN tensor in the list", lambda: [torch.tensor(math.nan), 1.0], [0.0, 1.0], 1, "non-finite"),
    ("a list in the list", lambda: [[0.5, 1.0], 1.0], [0.0, 1.0], 1, "non-numeric score [0.5, 1.0]"),
    ("a 2-d tensor", lambda: torch.ones(2, 2), [0.0, 0.0], 2, "non-numeric"),
    ("None", lambda: None, [0.0, 0.0], 2, "returned NoneType, expected a list of 2 floats"),
    ("one float", lambda: 1.0, [0.0, 0.0], 2, "returned one number (float), expected a list of 2 floats"),
    ("one bool", lambda: True, [0.0, 0.0], 2, "returned one number (bool)"),
    ("one numpy scalar", lambda: np.float64(1.0), [0.0, 0.0], 2, "returned one number (float64)"),
    ("one 0-d tensor", lambda: torch.tensor(1.0), [0.0, 0.0], 2, "returned one number (Tensor)"),
    ("one 0-d array", lambda: np.array(1.0), [0.0, 0.0], 2, "returned one number (ndarray)"),
    ("a str", lambda: "1.0", [0.0, 0.0], 2, "returned str"),
    ("a dict", lambda: {"a": 1.0, "b": 1.0}, [0.0, 0.0], 2, "returned dict"),
    ("a generator", lambda: (x for x in [0.5, 1.0]), [0.0, 0.0], 2, "returned generator"),
    ("too few", lambda: [1.0], [0.0, 0.0], 2, "returned 1 scores for a batch of 2"),
]


@pytest.mark.parametrize("deadline", [None, 5.0], ids=["inline", "thread"])
@pytest.mark.parametrize("what, returns, scores, errors, line", BATCH_RETURNS, ids=[c[0] for c in BATCH_RETURNS])
def test_every_return_shape_is_a_score_or_a_counted_failure(what, returns, scores, errors, line, deadline):
    """Taken as its numbers, or each unusable sample scored 0, counted in `rewards/<name>/errors` and named in one
    line; the call never raises (a raise here would end the job)."""

    def shaped(prompts, completions, answers, **_):
        return returns()

    result = RewardSet([shaped], timeout_s=deadline)(["p"] * N, ["c"] * N, ["a"] * N)
    assert result.rewards == pytest.approx(scores) and all(type(r) is float for r in result.rewards)
    assert result.metrics["rewards/shaped/errors"] == errors
    if line:
        assert len(result.errors) == 1 and result.errors[0].startswith("reward 'shaped' ") and line in result.errors[0]
    else:
        assert result.errors == []


@pytest.mark.parametrize(
    "one", [torch.tensor(0.5), np.array(0.5), np.float32(0.5), 0.5], ids=["tensor", "array", "numpy", "float"]
)
def test_one_number_for_a_batch_of_one_is_its_score(one):
    result = RewardSet([lambda p, c, a, **_: one], timeout_s=None)(["p"], ["c"], ["a"])
    assert result.rewards == [0.5] and result.errors == []


@pytest.mark.parametrize(
    "value, score, failed",
    [
        (torch.tensor(0.5), 0.5, False),
        (np.array(0.5), 0.5, False),
        (np.float64(0.5), 0.5, False),
        (True, 1.0, False),
        ({"score": torch.tensor(0.5)}, 0.5, False),
        (None, 0.0, True),
        (math.nan, 0.0, True),
        ("0.5", 0.0, True),
    ],
    ids=["tensor", "array", "numpy", "bool", "dict", "None", "nan", "str"],
)
def test_a_verl_score_of_each_shape(value, score, failed):
    """verl's convention returns one number per completion: each shape is that number or a counted failure."""

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return value

    fn, _ = adapt(compute_score, "verl")
    result = RewardSet([fn], timeout_s=None)(["p"] * N, ["c"] * N, ["a"] * N)
    assert result.rewards == [score] * N
    assert result.metrics["rewards/compute_score/errors"] == (N if failed else 0) and bool(result.errors) == failed
