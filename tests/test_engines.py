"""An engine is one registry entry (`actors.engines`): registered with the transports it can receive, it is built
by the rollout actors' `make_engine` and the weight-sync checks follow its capabilities, with no other edit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from actors import engines
from actors.rollout_fleet import EngineHost
from actors.weight_sync import resolve_transport, transport_problem
from rl.config import load_config
from rl.samples.request import SamplingParams


@pytest.fixture
def file_only_engine():
    """`test_file_only`: the torch engine under another name, receiving weights by file only."""
    built = []

    def build(cfg, index, weight_sync):
        built.append((index, weight_sync))
        return engines.ENGINES["torch"].build(cfg, index, weight_sync)

    engines.register_engine("test_file_only", transports=("file",))(build)
    try:
        yield built
    finally:
        engines.ENGINES.pop("test_file_only")


def test_a_registered_engine_is_built_by_the_rollout_actor_and_generates(file_only_engine):
    cfg = load_config("configs/tiny.yaml")
    cfg.rollout.engine = "test_file_only"
    host = EngineHost(cfg, index=1)
    samples = host.generate([[1, 5, 6, 7]], SamplingParams(n=2, max_tokens=4, seed=0))
    assert file_only_engine == [(1, "file")]
    assert len(samples) == 2 and all(0 < s.response_len <= 4 for s in samples)


def test_the_transport_checks_follow_the_engine_entry(file_only_engine):
    cfg = load_config("configs/tiny.yaml", ["rollout.num_gpus_per_engine=1", "learner.num_gpus_per_worker=1"])
    cfg.rollout.engine = "test_file_only"
    cfg.rollout.weight_sync = "ray"
    problem = transport_problem(cfg, in_process=False)
    assert "rollout.weight_sync='ray'" in problem and "'test_file_only'" in problem and "file or auto" in problem
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


def test_a_new_transport_is_one_entry(file_only_engine, monkeypatch):
    """A weight transport is one `TRANSPORTS` entry (how it is made, what it needs); an engine that lists it can
    be given it, one that does not is refused naming the engine."""
    from actors import weight_sync

    made = []
    monkeypatch.setitem(weight_sync.TRANSPORTS, "test_pigeon", weight_sync.Transport(lambda cfg: made.append(cfg)))
    monkeypatch.setitem(
        engines.ENGINES,
        "test_file_only",
        engines.EngineKind("test_file_only", lambda *a: None, ("file", "test_pigeon")),
    )
    cfg = load_config("configs/tiny.yaml")
    cfg.rollout.engine, cfg.rollout.weight_sync = "test_file_only", "test_pigeon"
    assert transport_problem(cfg, in_process=False) is None
    weight_sync.make_transport(cfg, "test_pigeon")
    assert made == [cfg]
    cfg.rollout.engine = "torch"
    assert "rollout.engine is 'torch'" in transport_problem(cfg, in_process=False)
