"""Tiny RL jobs whose policy talks to a tool environment over several turns, with environments written for other
libraries and run unchanged: TRL tool functions (in-process workers), and a SkyRL-shaped `step()` environment on the
real stack (Ray, the reward actor hosting the environments' processes)."""

from __future__ import annotations

import json

from test_e2e import fbrl_train
from test_faults_async import local_args

from actors import api

ENVS = "tests/data/tool_envs.py"


def rows_of(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_trl_tool_functions_in_a_tiny_job(tmp_path):
    env = f"env={{name: {ENVS}:TOOLS, max_turns: 3}}"
    argv = local_args(tmp_path, "train.steps=2", env, "train.eval_every=2", "train.eval_n=6")
    run = api.train(argv[2], argv[3:], no_ray=True)
    rows = [r for r in rows_of(run) if "reward/env/turns_mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["reward/env/turns_mean"] >= 1.0 and r["reward/env/failures_error"] == 0.0, r
    # the held-out evaluation runs greedy episodes with the same tools, and records their calls per problem
    record = json.loads((run / "eval" / "step_000002.json").read_text())
    assert len(record["modes"]["soft"]["tool_calls"]) == 6


def test_a_step_environment_on_the_real_stack(tmp_path):
    """GuessEnv answers every turn the model ends with its stop token until the answer appears: episodes of two
    turns, the second resumed from the first turn's recorded states."""
    argv = local_args(tmp_path, "train.steps=2", f"env={{name: {ENVS}:GuessEnv, max_turns: 2}}")
    fbrl_train(*argv[2:])  # a process of its own: its own local Ray, whatever other tests left in this one
    rows = rows_of(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    assert max(r["reward/env/turns_mean"] for r in rows) > 1.0, rows  # some episodes took a second turn
    assert all(0 < r["reward/env/observation_token_frac"] < 1 for r in rows)
    assert all(r["reward/env/failures_error"] == 0.0 for r in rows)


def test_episodes_on_vllm(tmp_path):
    """The same chat environment with the vLLM engine: a later turn resumes from the states vLLM recorded, through
    its replay prefill (tests/test_vllm_continuation.py checks it token by token)."""
    env = f"env={{name: {ENVS}:GuessEnv, max_turns: 2}}"
    argv = local_args(tmp_path, "train.steps=1", env, "rollout.engine=vllm")
    run = api.train(argv[2], argv[3:], no_ray=True)
    rows = rows_of(run)
    assert rows[-1]["reward/env/turns_mean"] > 1.0 and rows[-1]["reward/env/failures_error"] == 0.0, rows[-1]
    # the job's engine ended with the job: left to the garbage collector, its shutdown would later tear down the
    # process-wide groups of whatever vLLM engine is alive then
    from vllm.distributed import parallel_state

    assert not parallel_state.model_parallel_is_initialized()
