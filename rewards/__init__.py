"""rewards — reward functions and how they are run.

Owns: the reward interface, the loader for user reward functions (`file.py:fn` / `package.module:fn`), the
math-verify reward (gold parsed first, anchor required) and the process pool with hard per-item timeouts.
Imports nothing of ours.
"""
