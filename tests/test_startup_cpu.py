"""tools/startup_cpu.py's pieces: a process's CPU time read from /proc, and the role its command line names."""

import os
import time

from tools.startup_cpu import cpu_seconds, role


def test_cpu_seconds_of_a_process_that_worked():
    t0 = time.process_time()
    while time.process_time() - t0 < 0.3:  # burn 0.3 s of CPU
        pass
    seconds, cmd = cpu_seconds(os.getpid())
    assert seconds >= 0.3 - 0.02 and "python" in cmd  # clock ticks are 10 ms
    assert cpu_seconds(2**22 + 12345) is None  # no such process


def test_roles_by_command_line():
    assert role("ray::RolloutActor.__init__") == "rollout engine"
    assert role("ray::RankActor") == "learner rank"
    assert role("ray::RewardHost") == "reward actor"
    assert role(".../ray/core/src/ray/raylet/raylet --raylet_socket_name=...") == "Ray's own processes"
