"""Tool environments (rewards/environments.py) and their process pool (rewards/env_pool.py): the calculator, TRL
tool functions and SkyRL-shaped environments run unchanged; an environment that raises, hangs or answers junk
ends its episode and is counted by kind, within its deadline."""

import pickle
import time

import pytest

from rewards.env_pool import EnvironmentPool, check_result
from rewards.environments import Calculator, StepResult, TextEnvAdapter, ToolFunctions, load_environment
from rewards.loader import RewardLoadError
from tests.data.tool_envs import TOOLS, GuessEnv

ENVS = "tests/data/tool_envs.py"


@pytest.mark.parametrize(
    "text, observation",
    [
        ("She has <<48/2=", "24>>"),
        ("<<3*(2+1.5)=", "10.5>>"),
        ("<<10/4=", "2.5>>"),
        ("total: <<1,200-200=", "1000>>"),
        ("<<2**99999=", "?>>"),  # no powers: a calculator does arithmetic only
        ("<<__import__('os')=", "?>>"),
        ("<<1/0=", "?>>"),
        ("so 3 + 4 = ", None),  # an '=' outside an annotation: nothing to answer, the model goes on
        ("<<5+5=10>> and 2 =", None),
    ],
)
def test_calculator_answers_gsm8k_annotations(text, observation):
    env = Calculator()
    env.reset({})
    out = env.step(text)
    assert out.observation == observation and out.reward == 0.0 and not out.done
    assert env.calls == (observation is not None) and env.bad_calls == (observation == "?>>")


def test_trl_tool_functions_run_unchanged():
    env = load_environment(f"{ENVS}:TOOLS")()
    assert isinstance(env, ToolFunctions) and env.stop_strings == ("</tool_call>",)
    call = 'Let me compute. <tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call>'
    assert env.step(call).observation == "<tool_response>\n42\n</tool_response>\n"
    bad = '<tool_call>{"name": "divide", "arguments": {}}</tool_call>'
    assert "error: KeyError" in env.step(bad).observation  # the model sees its mistake, as TRL shows it
    assert env.step("no call here </tool").observation is None
    assert ToolFunctions(TOOLS).tools == {"multiply": TOOLS[0]}


def test_a_skyrl_shaped_environment_runs_unchanged():
    env = load_environment(f"{ENVS}:GuessEnv")()
    assert isinstance(env, TextEnvAdapter) and env.env_cls.__name__ == GuessEnv.__name__
    env.reset({"prompt": "say 7", "answer": "7"})
    assert env.step("it is 3") == StepResult(" again:", 0.0, False)
    assert env.step("it is 7") == StepResult(None, 1.0, True)
    env = pickle.loads(pickle.dumps(env))  # environments travel as pickles between steps


def test_bad_environment_specs_name_the_problem():
    with pytest.raises(RewardLoadError, match="neither a built-in environment"):
        load_environment("calculater")
    with pytest.raises(RewardLoadError, match="has no object 'Nope'"):
        load_environment(f"{ENVS}:Nope")
    with pytest.raises(RewardLoadError, match="expected an environment class"):
        load_environment(f"{ENVS}:multiply")


@pytest.mark.parametrize(
    "result, why",
    [
        ({"observation": 42}, "observation is a int"),
        (StepResult("x", float("nan")), "not a finite number"),
        (StepResult("x", True), "not a finite number"),
        ("text", "step returned a str"),
    ],
)
def test_junk_step_results_are_refused(result, why):
    with pytest.raises(ValueError, match=why):
        check_result(result)


def test_numbers_of_other_shapes_are_accepted():
    np = pytest.importorskip("numpy")
    import torch

    assert check_result(StepResult("x", np.float32(0.5))).reward == 0.5
    assert check_result(StepResult(None, torch.tensor(2.0), 1)).reward == 2.0
    assert check_result(("obs", 1, False)) == StepResult("obs", 1.0, False)


def test_the_pool_steps_episodes_and_bounds_failures():
    pool = EnvironmentPool("calculator", num_workers=2, timeout_s=5.0)
    try:
        assert pool.stop_strings == ("=",)
        first = pool.step([None, None], [{}, {}], ["<<6*7=", "nothing"])
        assert [o.observation for o in first] == ["42>>", None] and all(o.failure is None for o in first)
        again = pool.step([first[0].env], [{}], ["<<42+1="])[0]  # the same environment, stepped on
        assert again.observation == "43>>" and pickle.loads(again.env).calls == 2
    finally:
        pool.close()
    for name, kind in (("Raises", "error"), ("Junk", "junk"), ("Hangs", "timeout")):
        pool = EnvironmentPool(f"{ENVS}:{name}", num_workers=1, timeout_s=1.5)
        try:
            t0 = time.monotonic()
            out = pool.step([None], [{}], ["<<1+1="])[0]
            assert time.monotonic() - t0 < 10
            assert out.kind == kind and out.done and out.env is None and out.observation is None, out
            assert name in out.failure or kind in out.failure
        finally:
            pool.close()


@pytest.mark.parametrize(
    "code, expected",
    [
        ("print(6 * 7)", "42"),
        ("import math\nprint(math.factorial(10))", "3628800"),
        ("1/0", "ZeroDivisionError: division by zero"),
        ("import socket\nsocket.create_connection(('127.0.0.1', 9))", "not allowed in the sandbox: socket"),
        ("import os\nos.system('echo hi')", "not allowed in the sandbox: os.system"),
        ("open('/tmp/fbrl-sandbox-escape', 'w').write('x')", "not allowed in the sandbox: writing"),
        ("open('inside.txt', 'w').write('ok'); print(open('inside.txt').read())", "ok"),
        ("while True: pass", "timed out after 2 s"),
        ("x = bytearray(2_000_000_000)", "MemoryError"),
        ("import ctypes", "not allowed in the sandbox: import ctypes"),
    ],
)
def test_the_python_sandbox_runs_code_within_its_limits(code, expected):
    env = load_environment("python", {"timeout_s": 2.0, "cpu_s": 3, "memory_mb": 256})()
    out = env.step(f"Let me check. <python>{code}</python>").observation
    assert out.startswith("<output>") and expected in out, out
    assert env.step("no code </python").observation is None
