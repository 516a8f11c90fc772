"""The start-up probe of a multi-node job (`actors.placement.check_shared_storage`): learner ranks on other nodes
than the driver must read a file the driver writes under `train.run_dir`, or the job stops now (exit 2, naming
`train.run_dir`) instead of at its first checkpoint. Stand-in rank actors run the probe's function in this process
over a directory of their own (another node's disk) or the driver's (shared storage); no Ray is started."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from actors import placement
from rl.train.faults import EXIT_BAD_INPUT, RunStopped


class StandInRank:
    """A rank actor whose node sees the driver's files under `mount` (None: the driver's own paths)."""

    def __init__(self, driver_dir: Path, mount: Path | None):
        self.driver_dir, self.mount, self.calls = driver_dir, mount, 0
        self.__ray_call__ = SimpleNamespace(remote=self._call)

    def _call(self, fn, path):
        self.calls += 1
        if self.mount is not None:  # the same path on this node names another disk
            path = str(self.mount / Path(path).relative_to(self.driver_dir))
        return fn(self, path)


@pytest.fixture
def on_node(monkeypatch):
    import ray

    monkeypatch.setattr(ray, "get", lambda refs, timeout=None: refs)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: SimpleNamespace(get_node_id=lambda: "node-a"))


def test_ranks_on_other_nodes_that_cannot_read_the_run_dir_stop_the_job(tmp_path, on_node):
    run = tmp_path / "run"
    run.mkdir()
    other_disk = tmp_path / "node-b-disk"
    other_disk.mkdir()
    ranks = [StandInRank(run, None), StandInRank(run, other_disk)]
    with pytest.raises(RunStopped, match=r"rank 1 on node node-b.*train.run_dir=.*storage every node shares") as e:
        placement.check_shared_storage(str(run), ranks, ["node-a", "node-b"])
    assert e.value.exit_code == EXIT_BAD_INPUT
    assert [r.calls for r in ranks] == [0, 1]  # the driver's own node is not probed
    assert list(run.iterdir()) == []  # the probe file is removed


def test_shared_storage_and_one_node_pass(tmp_path, on_node):
    run = tmp_path / "run"
    run.mkdir()
    shared = [StandInRank(run, None), StandInRank(run, None)]
    placement.check_shared_storage(str(run), shared, ["node-a", "node-b"])
    assert [r.calls for r in shared] == [0, 1] and list(run.iterdir()) == []
    alone = [StandInRank(run, tmp_path / "nowhere")]
    placement.check_shared_storage(str(run), alone, ["node-a"])  # one node: nothing to probe
    assert alone[0].calls == 0
