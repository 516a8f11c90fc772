"""An engine is one registry entry (`actors.engines`): registered, it is built by the rollout actors and receives
the transports every engine does (a state dict); a transport is one `TRANSPORTS` entry, naming the engines it
serves when not all. The weight-sync checks follow the entries, with no other edit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from actors import engines
from actors.rollout_fleet import EngineHost
from actors.weight_sync import resolve_transport, transport_problem
from rl.config import load_config
from rl.samples.request import SamplingParams


@pytest.fixture
def new_engine():
    """`test_engine`: the torch engine under another name."""
    built = []

    def build(cfg, index, weight_sync):
        built.append((index, weight_sync))
        return engines.ENGINES["torch"].build(cfg, index, weight_sync)

    engines.register_engine("test_engine")(build)
    try:
        yield built
    finally:
        engines.ENGINES.pop("test_engine")


def test_a_registered_engine_is_built_by_the_rollout_actor_and_generates(new_engine):
    cfg = load_config("configs/tiny.yaml")
    cfg.rollout.engine = "test_engine"
    host = EngineHost(cfg, index=1)
    samples = host.generate([[1, 5, 6, 7]], SamplingParams(n=2, max_tokens=4, seed=0))
    assert new_engine == [(1, "file")]
    assert len(samples) == 2 and all(0 < s.response_len <= 4 for s in samples)


def test_the_transport_checks_follow_the_transport_entries(new_engine):
    cfg = load_config("configs/tiny.yaml", ["rollout.num_gpus_per_engine=1", "learner.num_gpus_per_worker=1"])
    cfg.rollout.engine = "test_engine"
    cfg.rollout.weight_sync = "ray"
    assert transport_problem(cfg, in_process=False) is None  # a state dict: every engine receives it
    cfg.rollout.weight_sync = "nccl"  # vLLM's native transfer serves vLLM engines only
    problem = transport_problem(cfg, in_process=False)
    assert "rollout.weight_sync='nccl'" in problem and "'test_engine'" in problem and "file, ray or auto" in problem
    # auto with GPU engines and learners picks vLLM's transfer only for an engine that can receive it
    cfg.rollout.weight_sync = "auto"
    one_node = SimpleNamespace(learner_nodes=["n0"], rollout_nodes=["n0"])
    assert resolve_transport(cfg, one_node)[0] == "file"
    cfg.rollout.engine = "vllm"
    assert resolve_transport(cfg, one_node)[0] == "nccl"


def test_an_unknown_engine_names_the_valid_ones():
    cfg = load_config("configs/tiny.yaml")
    cfg.rollout.engine = "tourch"
    with pytest.raises(ValueError, match="unknown rollout.engine 'tourch'; valid choices: .*torch.*vllm"):
        engines.build_engine(cfg)


def test_a_new_transport_is_one_entry(new_engine, monkeypatch):
    """A weight transport is one `TRANSPORTS` entry (how it is made, what it needs, the engines it serves): an
    engine it names can be given it, another is refused naming the engine."""
    from actors import weight_sync

    made = []
    pigeon = weight_sync.Transport(lambda cfg: made.append(cfg), engines=("test_engine",))
    monkeypatch.setitem(weight_sync.TRANSPORTS, "test_pigeon", pigeon)
    cfg = load_config("configs/tiny.yaml")
    cfg.rollout.engine, cfg.rollout.weight_sync = "test_engine", "test_pigeon"
    assert transport_problem(cfg, in_process=False) is None
    weight_sync.make_transport(cfg, "test_pigeon")
    assert made == [cfg]
    cfg.rollout.engine = "torch"
    assert "rollout.engine is 'torch'" in transport_problem(cfg, in_process=False)
