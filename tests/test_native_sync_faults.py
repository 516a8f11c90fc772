"""A rollout engine lost under vLLM's native weight transfer (nccl, ipc, native_ray): once the transfer group is
set up (the first sync), a replacement engine cannot join it and there is no last sync to replay (the native
transports never go through the fleet's `load_weights`), so the job stops with a clear `RunStopped` instead of
replacing the engine (which would come back at version 0, the initial checkpoint's weights) or rebuilding a
healthy learner group (rank 0's call on the dead engine reaches the driver as RayTaskError(ActorDiedError), an
actor death of rank 0 itself). Fakes stand in for the actors: no Ray cluster is started."""

import pytest
from ray.exceptions import ActorDiedError

from actors.rollout_fleet import RolloutFleet
from actors.supervision import Supervisor
from actors.weight_sync import NativeSync, make_transport
from rl.config import load_config
from rl.train.faults import FaultLog, RunStopped


class FakeLearner:
    def __init__(self):
        self.calls = []

    def start_native_sync(self, backend, client, init):
        self.calls.append("start_native_sync")

    def native_send(self):
        self.calls.append("native_send")


class FakeFleet:
    """The parts of RolloutFleet a native push uses; `dead` makes `versions()` fail as Ray does for a dead actor."""

    def __init__(self, dead=False):
        self.actors, self.dead, self.tagged = ["engine-0", "engine-1"], dead, []

    def versions(self):
        if self.dead:
            raise ActorDiedError()
        return [len(self.tagged)] * len(self.actors)

    def set_weight_version(self, version):
        self.tagged.append(version)
        return [version] * len(self.actors)


def _fleet(transport):
    cfg = load_config(None)
    made = []
    fleet = RolloutFleet(
        ["engine-0", "engine-1"],
        make_actor=lambda k: made.append(k) or f"new-{k}",
        supervisor=Supervisor(cfg.faults, FaultLog(log=lambda *_: None)),
        transport=transport,
    )
    return fleet, made


@pytest.mark.parametrize("backend", ["nccl", "ipc", "native_ray"])
def test_a_lost_engine_stops_the_job_once_the_transfer_group_exists(backend, monkeypatch):
    import actors.rollout_fleet as rollout_mod

    killed = []
    monkeypatch.setattr(rollout_mod, "kill", killed.append)  # ray.kill on a fake would start a local Ray
    transport = make_transport(load_config(None), backend)
    assert isinstance(transport, NativeSync) and transport.replaceable  # before the first sync: replaceable
    learner, fleet = FakeLearner(), FakeFleet()
    assert transport.push(learner, fleet, 1, "unused") == [1, 1]
    assert learner.calls == ["start_native_sync", "native_send"] and not transport.replaceable

    real, made = _fleet(transport)
    with pytest.raises(RunStopped, match=rf"rollout actor 1 died during generate .*weight_sync={backend}.*--resume"):
        real._replace(1, "generate", ActorDiedError())
    assert made == [] and real.supervisor.restarts["rollout"] == 0  # not replaced, not counted as a restart
    assert killed == ["engine-1"]  # the lost engine is ended all the same: it must not outlive the stop


def test_a_push_checks_the_engines_before_rank_0_sends():
    transport, learner = NativeSync("nccl", 2**20), FakeLearner()
    transport.push(learner, FakeFleet(), 1, "unused")
    with pytest.raises(RunStopped, match=r"rollout engine died before the weight sync to version 2.*--resume"):
        transport.push(learner, FakeFleet(dead=True), 2, "unused")
    assert learner.calls == ["start_native_sync", "native_send"]  # rank 0 never called the dead engine


def test_file_ray_and_unstarted_native_transports_still_replace(monkeypatch):
    """The refusal is for a started native transfer only: the others reach the supervisor and make a new actor."""
    import ray

    import actors.rollout_fleet as rollout_mod

    monkeypatch.setattr(rollout_mod, "kill", lambda actor: None)
    monkeypatch.setattr(ray, "get", lambda ref: ref)
    monkeypatch.setattr(ray, "wait", lambda refs, **_: (list(refs), []))  # the new actor's first call: answered

    class Handle(str):
        class _Version:
            @staticmethod
            def remote():
                return 0

        version = _Version()

    cfg = load_config(None)
    for name in ("file", "ray", "native_ray"):
        transport = make_transport(cfg, name)
        fleet, made = _fleet(transport)
        fleet.make_actor = lambda k, made=made: made.append(k) or Handle(f"new-{k}")
        fleet._replace(0, "generate", ActorDiedError())
        assert made == [0] and fleet.supervisor.restarts["rollout"] == 1, name


def test_an_engine_dying_during_the_transfer_is_not_a_learner_death(monkeypatch):
    """Rank 0's client turns the engine's death into EngineLost (not a RayActorError, which the learner group would
    take for rank 0's own death and rebuild the group), and the push stops the job with it."""
    import ray
    from ray.exceptions import RayActorError

    from actors.weight_sync import EngineFleetClient, EngineLost

    class Dead:
        class _Method:
            @staticmethod
            def remote(*args):
                return "ref"

        start_weight_update = init_weight_transfer_engine = _Method()

    def get(refs):
        raise ActorDiedError()

    monkeypatch.setattr(ray, "get", get)
    client = EngineFleetClient([Dead(), Dead()])
    for call in (client.start_weight_update, lambda: client.init_weight_transfer_engine({})):
        with pytest.raises(EngineLost, match="died during the native weight transfer") as e:
            call()
        assert not isinstance(e.value, RayActorError)

    class LosingLearner(FakeLearner):
        def native_send(self):
            raise EngineLost("a rollout engine died during the native weight transfer (start_weight_update: x)")

    transport = NativeSync("native_ray", 2**20)
    transport.started = True
    with pytest.raises(RunStopped, match=r"died during the native weight transfer .*version 3.*--resume"):
        transport.push(LosingLearner(), FakeFleet(), 3, "unused")


@pytest.mark.parametrize("backend", ["nccl", "ipc"])
def test_after_a_learner_rebuild_nccl_and_ipc_fall_back_to_the_ray_transport(backend):
    """A rebuilt learner group (its `generation` counts up) has a new rank 0, which an NCCL / IPC transfer group
    set up with the old one cannot take: the pushes from then on go through Ray's object store (the buckets rank 0
    exports, loaded by every engine through `load_weights`), the job says so once, and a dead engine may be
    replaced again (the fallback's replacements reload the last sync). native_ray sets its transfer up again."""
    lines = []
    transport = NativeSync(backend, 2**20, log=lines.append)

    class RebuiltLearner(FakeLearner):
        generation = 0

        def export_buckets(self, bucket_bytes):
            self.calls.append(f"export_buckets({bucket_bytes})")
            return ["bucket-ref"]

    class LoadingFleet(FakeFleet):
        def load_weights(self, weights, version):
            self.loaded = (weights.refs, version)
            return [version] * len(self.actors)

    learner, fleet = RebuiltLearner(), LoadingFleet()
    transport.push(learner, fleet, 1, "unused")
    assert learner.calls == ["start_native_sync", "native_send"] and not transport.replaceable
    learner.generation = 1  # the group was rebuilt
    assert transport.push(learner, fleet, 2, "unused") == [2, 2]
    assert learner.calls[2:] == [f"export_buckets({2**20})"] and fleet.loaded == (["bucket-ref"], 2)
    assert transport.replaceable and len(lines) == 1
    assert f"rollout.weight_sync={backend}'s transfer group cannot take its new rank 0" in lines[0]
    assert "rollout.weight_sync: ray" in lines[0] and "--resume" in lines[0]
    transport.push(learner, fleet, 3, "unused")  # and for the rest of the job, without a second line
    assert learner.calls[3:] == [f"export_buckets({2**20})"] and len(lines) == 1

    again = NativeSync("native_ray", 2**20, log=lines.append)
    learner = RebuiltLearner()
    again.push(learner, fleet, 1, "unused")
    learner.generation = 1
    again.push(learner, fleet, 2, "unused")
    assert learner.calls == ["start_native_sync", "native_send", "start_native_sync", "native_send"]
