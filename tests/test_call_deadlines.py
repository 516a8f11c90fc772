"""An actor that hangs but stays alive: its call passes the deadline (`faults.call_timeout_s`), the actor is killed
and replaced, and the call issued again with the same seeds; while the step waits, a line says what it waits on.
Between calls, the fleet's health check finds a dead or stuck engine with a short ping instead.
Stub rollout actors on a real local Ray stand in for engines: the hang is the point, not the model."""

from __future__ import annotations

import time

import pytest

from actors.rollout_fleet import RolloutFleet
from actors.supervision import Supervisor, actor_class
from rl.config import FaultsConfig
from rl.samples.batch import Sample
from rl.samples.request import SamplingParams
from rl.train.faults import FaultLog, RunStopped


def stub_engine_class():
    """A rollout actor whose samples are a function of the request's seeds; `hang_on_call=c` makes its c-th
    `generate_packed` sleep far past any deadline (alive, not dead: what a stuck engine looks like)."""

    class StubEngine:
        def __init__(self, hang_on_call: int | None = None, hang_in_init: bool = False):
            self.hang_on_call, self.calls = hang_on_call, 0
            if hang_in_init:  # an engine that never finishes building itself
                time.sleep(3600)

        def generate_packed(self, prompts, params, min_version=None):
            self.calls += 1
            if self.calls == self.hang_on_call:
                time.sleep(3600)
            samples = [
                Sample(p, [params.seed + g * params.n + i], [0.0], "stop", 0, group_id=g, sample_index=i)
                for g, p in enumerate(prompts)
                for i in range(params.n)
            ]
            return samples, None

        def load_weights(self, weights, version):
            return version

        def version(self):
            return 0

    return actor_class(StubEngine)


@pytest.fixture(scope="module")
def ray_session():
    import ray

    from actors.placement import start_local_ray

    start_local_ray(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def fleet_of(engines: list, fcfg: FaultsConfig, lines: list[str], **replacement):
    """A supervised fleet over `engines`, once their processes are up (as `build_workers` waits for them): a
    deadline counts from a call's submission, and an actor's start on a loaded machine takes seconds."""
    import ray

    ray.get([e.version.remote() for e in engines])
    engine = stub_engine_class()
    supervisor = Supervisor(fcfg, FaultLog(lines.append))
    made = lambda k: engine.remote(**replacement)  # noqa: E731
    return RolloutFleet(engines, make_actor=made, supervisor=supervisor), supervisor


def test_a_hung_engine_is_replaced_after_the_deadline_with_the_same_seeds(ray_session):
    engine = stub_engine_class()
    lines: list[str] = []
    fcfg = FaultsConfig(call_timeout_s=4.0, call_timeout_per_sample_s=0.0, waiting_log_s=1.0)
    fleet, supervisor = fleet_of([engine.remote(), engine.remote(hang_on_call=2)], fcfg, lines)
    prompts = [[1, 2], [3], [4, 5], [6]]
    params = SamplingParams(n=2, seed=100)
    first = fleet.generate(prompts, params, 0)
    assert not supervisor.faults.counts  # the first calls returned in time
    t0 = time.monotonic()
    second = fleet.generate(prompts, params, 0)  # engine 1's 2nd call hangs
    waited = time.monotonic() - t0
    assert 4.0 <= waited < 30.0
    key = [(s.group_id, s.sample_index, s.response_ids) for s in first]
    assert [(s.group_id, s.sample_index, s.response_ids) for s in second] == key  # the same seeds, the same samples
    assert sorted(r[2][0] for r in key) == list(range(100, 108))  # 8 samples, each its own seed
    assert supervisor.faults.counts == {"rollout_restarts": 1, "rollout_timeouts": 1}
    assert any(x.startswith("still waiting on rollout actor 1 (generate) for ") for x in lines), lines
    assert any("rollout actor 1 hung during generate (no result after" in x for x in lines), lines
    assert fleet.generate(prompts, params, 0)[0].response_ids == first[0].response_ids  # the replacement serves


def test_a_hang_past_the_restart_bound_stops_the_job(ray_session):
    """Stopped with the hung engine killed first: it does not outlive the job's stop."""
    import ray

    engine = stub_engine_class()
    lines: list[str] = []
    fcfg = FaultsConfig(call_timeout_s=2.0, call_timeout_per_sample_s=0.0, max_rollout_restarts=0)
    hung = engine.remote(hang_on_call=1)
    fleet, _ = fleet_of([hung], fcfg, lines)
    with pytest.raises(RunStopped, match=r"rollout actor 0 hung during generate .*max_rollout_restarts=0"):
        fleet.generate([[1]], SamplingParams(n=1, seed=0), 0)
    with pytest.raises(ray.exceptions.RayActorError):  # killed before the stop (alive, the call would queue)
        ray.get(hung.version.remote(), timeout=30)


def test_a_replacement_that_never_starts_stops_the_job_at_the_deadline(ray_session, monkeypatch):
    """Engine 0 hangs in `generate`; its replacement never finishes starting. The wait for it has the call's
    deadline (plus a grace for a process to start, 2 s here) and its waiting lines too: the job stops naming the
    new actor, which is killed first."""
    import ray

    import actors.supervision

    monkeypatch.setattr(actors.supervision, "START_GRACE_S", 2.0)
    engine = stub_engine_class()
    lines: list[str] = []
    fcfg = FaultsConfig(call_timeout_s=3.0, call_timeout_per_sample_s=0.0, waiting_log_s=1.0)
    fleet, supervisor = fleet_of([engine.remote(hang_on_call=1)], fcfg, lines, hang_in_init=True)
    t0 = time.monotonic()
    with pytest.raises(RunStopped, match=r"the new rollout actor 0 did not start: no answer after [56] s") as stop:
        fleet.generate([[1]], SamplingParams(n=1, seed=0), 0)
    assert 8.0 <= time.monotonic() - t0 < 30.0  # the hung call's deadline (3 s), then the start's (3 + 2 s)
    assert "faults.call_timeout_s" in str(stop.value) and "--resume" in str(stop.value)
    assert supervisor.faults.counts == {"rollout_restarts": 1, "rollout_timeouts": 1}
    assert any(x.startswith("still waiting on the new rollout actor 0 to start") for x in lines), lines
    with pytest.raises(ray.exceptions.RayActorError):  # killed before the stop
        ray.get(fleet.actors[0].version.remote(), timeout=30)


def test_no_deadline_when_it_is_off():
    assert Supervisor(FaultsConfig(call_timeout_s=0)).watch("generate", str, 64).deadline_s is None
    watch = Supervisor(FaultsConfig(call_timeout_s=600, call_timeout_per_sample_s=2)).watch("update", str, 64)
    assert watch.deadline_s == 728


@pytest.mark.slow
def test_the_health_check_replaces_a_killed_and_a_wedged_engine_between_calls(ray_session):
    """Between calls: engine 1's process is gone, engine 2 is stuck in a call made outside the fleet (alive, not
    answering). One health check replaces both with the last sync loaded, within the ping deadline, and leaves the
    healthy engine 0 alone; the next request is served without waiting on any call's deadline."""
    import ray

    engine = stub_engine_class()
    lines: list[str] = []
    fcfg = FaultsConfig(engine_ping_timeout_s=3.0, call_timeout_s=600.0)
    healthy, killed, wedged = engine.remote(), engine.remote(), engine.remote(hang_on_call=1)
    fleet, supervisor = fleet_of([healthy, killed, wedged], fcfg, lines)
    assert fleet.load_weights("weights.safetensors", 2) == [2, 2, 2] and fleet.check_health() == []
    wedged.generate_packed.remote([[1]], SamplingParams(n=1, seed=0))  # sleeps an hour
    ray.kill(killed, no_restart=True)
    t0 = time.monotonic()
    assert fleet.check_health() == [1, 2]
    assert time.monotonic() - t0 < 60.0  # two new processes started (37 s at load 4 on 2 cores); a deadline is 600 s
    assert fleet.actors[0] is healthy and killed not in fleet.actors and wedged not in fleet.actors
    assert supervisor.faults.counts == {"rollout_restarts": 2, "rollout_timeouts": 1}
    assert any("rollout actor 1 died during the health check between steps" in x for x in lines), lines
    assert any(
        "rollout actor 2 hung during the health check between steps (no answer to a ping within 3 s" in x for x in lines
    ), lines
    t0 = time.monotonic()
    samples = fleet.generate([[1], [2], [3]], SamplingParams(n=1, seed=7), 0)
    assert [s.response_ids for s in samples] == [[7], [8], [9]] and time.monotonic() - t0 < 30.0
    with pytest.raises(ray.exceptions.RayActorError):  # the wedged engine was killed, not left behind
        ray.get(wedged.version.remote(), timeout=30)
