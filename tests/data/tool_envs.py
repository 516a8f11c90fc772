"""Environments written for other libraries, as their users write them: fbrl runs them unchanged
(tests/test_environments.py, and tiny jobs in tests/test_tool_jobs.py)."""

import time


# ---- TRL: tools are plain functions with type hints and a docstring --------------------------------------------
def multiply(a: float, b: float) -> float:
    """Multiply two numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a * b


TOOLS = [multiply]


# ---- SkyRL: a BaseTextEnv-shaped class (init / step returning observations, reward, done) -----------------------
class GuessEnv:
    """Asks the model to say the answer; two turns at most."""

    def __init__(self, env_config=None, extras=None):
        self.answer = str((extras or {}).get("answer", ""))
        self.turns = 0

    def init(self, prompt):
        return prompt, {}

    def step(self, action: str):
        self.turns += 1
        done = self.answer in action or self.turns >= 2
        reward = 1.0 if self.answer and self.answer in action else 0.0
        observations = [] if done else [{"role": "user", "content": " again:"}]
        return {"observations": observations, "reward": reward, "done": done, "metadata": {}}


# ---- environments that misbehave: each must be counted and bounded, never sink the batch ----------------------
class Raises:
    stop_strings = ("=",)

    def reset(self, row):
        pass

    def step(self, text):
        raise RuntimeError("the tool broke")


class Hangs(Raises):
    def step(self, text):
        time.sleep(3600)


class Junk(Raises):
    def step(self, text):
        return {"observation": 42, "reward": "lots", "done": False}
