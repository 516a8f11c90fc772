"""The health check between steps: `RolloutFleet.check_health` pings every engine while the fleet is idle and
replaces a dead one (its ping raises `ActorDiedError`) or a wedged one (no answer within
`faults.engine_ping_timeout_s`) through the fleet's own replacement path, before the next request reaches it;
the loop calls it after each step's weight sync, and a producer thread before each batch after its first. Stand-ins replace the
actors and `ray.get` / `kill` are patched: no Ray cluster is started."""

from __future__ import annotations

import pytest
from ray.exceptions import ActorDiedError, GetTimeoutError

from actors.rollout_fleet import RolloutFleet
from actors.supervision import Supervisor
from rl.config import FaultsConfig, config_from_dict
from rl.train.faults import FaultLog, RunStopped
from tests.test_loop_filters import RecordingLearner, Script, ScriptedRewards, ScriptedRollout


class Engine:
    """A stand-in actor handle: `state` "ok" (answers), "dead" (every call raises `ActorDiedError`) or "wedged"
    (no call ever returns). `calls` records the methods called on it."""

    def __init__(self, name: str, state: str = "ok"):
        self.name, self.state, self.calls, self.loaded = name, state, [], None

    def __getattr__(self, method):
        if method.startswith("_"):
            raise AttributeError(method)
        engine = self

        class Method:
            @staticmethod
            def remote(*args):
                engine.calls.append(method)
                return (engine, method, args)

        return Method()


def fake_get(ref, timeout=None):
    """`ray.get` over stand-in calls: a wedged engine times out (or would wait for ever: a test's error)."""
    engine, method, args = ref
    if engine.state == "dead":
        raise ActorDiedError()
    if engine.state == "wedged":
        if timeout is None:
            raise AssertionError(f"ray.get without a timeout on wedged {engine.name} would wait for ever")
        raise GetTimeoutError(f"Get timed out: {engine.name}")
    if method == "load_weights":
        engine.loaded = args
        return args[1]
    return 0


def fake_wait(refs, num_returns=1, timeout=None):
    """`ray.wait` over stand-in calls: a wedged engine's call is never ready."""
    ready = [r for r in refs if r[0].state != "wedged"]
    return ready, [r for r in refs if r[0].state == "wedged"]


@pytest.fixture
def patched(monkeypatch):
    """Stand-ins for `ray.get`, `ray.wait` and `kill` (each would start a local Ray on a stand-in); returns the
    kill list."""
    import ray

    import actors.rollout_fleet as rollout_mod

    killed: list[str] = []
    monkeypatch.setattr(ray, "get", fake_get)
    monkeypatch.setattr(ray, "wait", fake_wait)
    monkeypatch.setattr(rollout_mod, "kill", lambda actor: killed.append(actor.name))
    return killed


def fleet_of(states: list[str], ping_timeout_s: float = 60.0, max_restarts: int = 20):
    """A supervised fleet over stand-in engines in `states`, its last sync (weights "w.safetensors", version 3)."""
    lines: list[str] = []
    fcfg = FaultsConfig(engine_ping_timeout_s=ping_timeout_s, max_rollout_restarts=max_restarts)
    engines = [Engine(f"engine-{k}", s) for k, s in enumerate(states)]
    made: list[Engine] = []

    def make_actor(k):
        made.append(Engine(f"new-{k}"))
        return made[-1]

    fleet = RolloutFleet(engines, make_actor=make_actor, supervisor=Supervisor(fcfg, FaultLog(lines.append)))
    fleet.last_sync = ("w.safetensors", 3)
    return fleet, engines, made, lines


@pytest.mark.parametrize(
    "state, verb, cause",
    [("dead", "died", "The actor died"), ("wedged", "hung", "no answer to a ping within 60 s")],
)
def test_a_dead_or_wedged_engine_is_replaced_by_the_health_check(patched, state, verb, cause):
    fleet, engines, made, lines = fleet_of(["ok", state, "ok"])
    assert fleet.check_health() == [1]
    assert fleet.actors == [engines[0], made[0], engines[2]] and made[0].name == "new-1"
    assert made[0].loaded == ("w.safetensors", 3)  # the replacement holds the last sync before any request
    assert patched == ["engine-1"]  # killed first: a wedged engine must not keep its GPU
    assert fleet.supervisor.restarts["rollout"] == 1
    assert len(lines) == 1 and f"rollout actor 1 {verb} during the health check between steps ({cause}" in lines[0]
    assert "replacing it (1 of at most 20)" in lines[0]
    assert fleet.check_health() == [] and len(lines) == 1  # the new fleet is healthy


def test_a_healthy_fleet_is_left_alone(patched):
    fleet, engines, made, lines = fleet_of(["ok", "ok"])
    assert fleet.check_health() == []
    assert fleet.actors == engines and made == [] and patched == [] and lines == []
    assert [e.calls for e in engines] == [["version"], ["version"]]  # one ping each, nothing else


def test_timeout_0_sends_no_ping(patched):
    fleet, engines, made, lines = fleet_of(["dead", "wedged"], ping_timeout_s=0)
    assert fleet.check_health() == []
    assert [e.calls for e in engines] == [[], []] and made == [] and patched == []


def test_past_the_restart_bound_the_check_stops_the_job(patched):
    fleet, _, made, _ = fleet_of(["wedged"], max_restarts=0)
    with pytest.raises(RunStopped, match=r"rollout actor 0 hung during the health check .*max_rollout_restarts=0"):
        fleet.check_health()
    assert made == [] and patched == ["engine-0"]


def test_a_started_native_transfer_refuses_the_replacement(patched):
    """vLLM's native transfer cannot take a new engine once set up: the check stops the job, as a death in a call."""
    from actors.weight_sync import NativeSync

    fleet, _, made, _ = fleet_of(["ok", "dead"])
    fleet.transport = NativeSync("native_ray", 2**20)
    fleet.transport.started = True
    with pytest.raises(RunStopped, match=r"rollout actor 1 died during the health check .*weight_sync=native_ray"):
        fleet.check_health()
    assert made == [] and patched == ["engine-1"] and fleet.supervisor.restarts["rollout"] == 0


class CheckedRollout(ScriptedRollout):
    """The loop's calls on its rollout workers, in order."""

    def __init__(self, script):
        super().__init__(script)
        self.events: list[str] = []

    def generate(self, prompts, params, min_version):
        self.events.append("generate")
        return super().generate(prompts, params, min_version)

    def sync_weights(self, learner, version, weights_path):
        self.events.append("sync")
        return super().sync_weights(learner, version, weights_path)

    def check_health(self):
        self.events.append("check")
        return []


@pytest.mark.parametrize("background", [False, True])
def test_the_loop_checks_the_engines_after_each_sync_when_they_idle(tmp_path, background):
    """Synchronous batches: after every step's sync, before the next request. With a producer thread the engines
    may be busy at that point, so the producer checks them itself, right before each batch after its first."""
    from rl.data.tokenizer import build_tokenizer
    from rl.loop import train
    from rl.train.run_dir import RunDir

    table = [[(1.0, 3, False), (0.0, 3, False)]]  # signal in every step: each step updates and syncs
    cfg = config_from_dict(
        {
            "data": {"task": "arith", "difficulty": [1], "num_train": 64},
            "rollout": {"engine": "torch", "n_samples_per_prompt": 2, "max_tokens": 8},
            "train": {"steps": 2, "prompts_per_step": 1, "eval_every": 0, "checkpoint_every": 0},
            "logging": {"wandb_mode": "disabled", "progress": False},
        }
    )
    script = Script(table)
    rollout = CheckedRollout(script)
    train(
        cfg,
        build_tokenizer(),
        rollout,
        RecordingLearner(),
        ScriptedRewards(script),
        RunDir(str(tmp_path / "run")),
        log=lambda *_: None,
        background_rollouts=background,
    )
    if background:
        checks = [i for i, e in enumerate(rollout.events) if e == "check"]
        assert len(checks) == 1 and rollout.events[checks[0] + 1] == "generate", rollout.events
    else:
        assert rollout.events == ["sync", "generate", "sync", "check", "generate", "sync", "check"]
