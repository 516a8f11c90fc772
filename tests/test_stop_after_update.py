"""A stop after the learner's update — raised in the weight sync, in the held-out eval, or by the rewards in the
producer thread at max_staleness >= 1 — ends the job as a stop at every staleness (in-process workers: torch engine,
torch learner). Kept apart from tests/test_faults*.py, whose tests each have a generated row in docs/RELIABILITY.md.
"""

from __future__ import annotations

import pytest
from fault_harness import check_checkpoints, metrics_of
from test_faults_async import local_args


class StopsIn:
    """In-process workers (rollout or rewards) whose `n`-th call of `method` raises `RunStopped`, as a lost engine
    or a used-up restart bound does: `sync_weights` (after the learner's update), `generate` at temperature 0 (the
    held-out eval, after the update) or the rewards' `score` (in the producer thread at max_staleness >= 1)."""

    def __init__(self, inner, method, n):
        self.inner, self.method, self.n, self.calls = inner, method, n, 0

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name != self.method:
            return attr

        def call(*args, **kwargs):
            if name != "generate" or args[1].temperature == 0:
                self.calls += 1
                if self.calls == self.n:
                    from rl.train.faults import RunStopped

                    raise RunStopped(f"{name} lost its worker (injected), and its restarts are used up: stopping")
            return attr(*args, **kwargs)

        return call


# each place and each staleness once in CI (~30 s a case); the other six combinations are slow
CASES = [("sync", 1), ("eval", 2), ("reward", 3)]


@pytest.mark.parametrize(
    "where,staleness",
    [
        pytest.param(w, s, marks=() if (w, s) in CASES else pytest.mark.slow)
        for w in ("sync", "eval", "reward")
        for s in (1, 2, 3)
    ],
)
def test_a_stop_after_the_update_checkpoints_the_step(tmp_path, monkeypatch, capsys, staleness, where):
    """A stop raised after the learner's update (in the weight sync, in the held-out eval) or in the rewards (the
    producer thread at s >= 1) ends the job as a stop at every staleness: exit code 3, "stopped after step N, which
    is checkpointed", step N checkpointed with its metrics row written once, and `--resume` completes the run."""
    import actors.placement
    from actors.cli import main

    real = actors.placement.build_workers

    def build(cfg, use_ray, **kwargs):
        rollout, learner, rewards = real(cfg, use_ray, **kwargs)
        if where == "reward":
            return rollout, learner, StopsIn(rewards, "score", 3)
        method, n = ("sync_weights", 3) if where == "sync" else ("generate", 2)
        return StopsIn(rollout, method, n), learner, rewards

    monkeypatch.setattr(actors.placement, "build_workers", build)
    args = local_args(tmp_path, "train.steps=5", f"train.max_staleness={staleness}", "train.eval_every=1")
    args += ["train.eval_n=4"]
    code = main(args)
    out, err = capsys.readouterr()
    run_dir = tmp_path / "run"
    steps = [r["step"] for r in metrics_of(run_dir) if r["step"] > 0]  # (row 0: the eval before training)
    last = steps[-1]
    assert code == 3, (out, err)
    assert "Traceback" not in out + err and f"stopped after step {last}, which is checkpointed" in err, err
    assert 1 <= last < 5 and steps == list(range(1, last + 1))
    check_checkpoints(run_dir, last, [last])
    monkeypatch.setattr(actors.placement, "build_workers", real)
    assert main(["train", "--no-ray", "--resume", str(run_dir)]) == 0
    assert [r["step"] for r in metrics_of(run_dir) if r["step"] > 0] == list(range(1, 6))
