"""The `fbrl` command's exit (`actors.cli.entry`): exit handlers run and buffered output is flushed before the
process ends without finalizing its modules; a non-daemon thread still running gets the ordinary exit."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT

PROGRAM = """
import atexit, threading, time
import actors.cli as cli

def main(argv=None):
    print("the command's output")  # block-buffered into a pipe: flushed only at exit
    if WITH_THREAD:
        threading.Thread(target=lambda: (time.sleep(0.5), print("the thread finished"))).start()
    return 3

cli.main = main
atexit.register(lambda: print("an exit handler ran"))
cli.entry()
print("never printed: entry does not return")
"""


def run(with_thread: bool) -> subprocess.CompletedProcess:
    code = f"WITH_THREAD = {with_thread}\n{PROGRAM}"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # buffered, as a pipe is by default
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_entry_runs_exit_handlers_flushes_and_exits_with_the_code():
    p = run(with_thread=False)
    assert p.returncode == 3, p.stderr
    assert p.stdout.splitlines() == ["the command's output", "an exit handler ran"], p.stdout


def test_entry_with_a_thread_still_running_exits_as_usual():
    p = run(with_thread=True)
    assert p.returncode == 3, p.stderr
    assert p.stdout.splitlines() == ["the command's output", "the thread finished", "an exit handler ran"], p.stdout
