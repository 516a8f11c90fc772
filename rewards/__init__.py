"""rewards — reward functions and how they are run.

Owns: the answer rules (`answer.py`: where a completion's answer is, how answer text is normalised, what a literal
number is), the reward interface and `RewardSet` (`base.py`), the loader for user reward functions
(`file.py:fn` / `package.module:fn`), the math-verify reward (`math.py`: gold parsed first, anchor required, a
strict option for literal numbers) and the process pool with hard per-item timeouts. docs/REWARDS.md states the
rules for users. Imports nothing of ours.
"""
