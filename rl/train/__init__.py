"""rl.train — what the RL loop (rl/loop.py) is written against and calls, one module per concern.

`workers` (the worker interfaces), `sampling` (rollout requests), `rollout_queue` (where batches come from,
synchronous or ahead of the learner), `policy_update` (one learner rank's update), `faults` (counters and stop
rules), `run_dir` (the run directory: config, metrics, atomic checkpoints, restore), `evaluate` and `heldout` (the
evaluator, and the held-out eval during training), `job` (what one job runs with, and the bookkeeping around a
step). Importing the package loads nothing.
"""
