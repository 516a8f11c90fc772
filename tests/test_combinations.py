"""Every combination of the settings that interact either passes the load-time checks and resolves (its weight
transport included) or is refused by them, naming both settings. The cross: rollout engine × weight sync
× estimator × decode mode × LoRA × dtype × staleness × GPUs (and colocation) × Ray or in-process (--no-ray).
The rules expected to refuse are stated here once more, independently of the code, so a rule dropped from the
load-time checks (the job would then fail minutes later inside a worker) or a rule added by mistake turns this
red."""

from __future__ import annotations

import itertools

import pytest

from actors.cli.preflight import BadInput, check_combinations
from actors.weight_sync import resolve_transport
from rl.config import load_config

DIMENSIONS = {
    "rollout.engine": ["vllm", "torch"],
    "rollout.weight_sync": ["auto", "file", "ray", "nccl", "ipc", "native_ray"],
    "likelihood.estimator": ["replay", "kpass", "exact", "standard"],
    "rollout.decode_mode": ["standard", "soft", "fused"],
    "learner.lora": [None, "{}"],
    "model.dtype": ["float32", "bfloat16"],
    "train.max_staleness": [0, 1],
    "gpus": ["none", "gpu", "gpu+colocate"],
    "--no-ray": [False, True],
}
GPU_OVERRIDES = {
    "none": [],
    "gpu": ["rollout.num_gpus_per_engine=1", "learner.num_gpus_per_worker=1"],
    "gpu+colocate": ["rollout.num_gpus_per_engine=1", "learner.num_gpus_per_worker=1", "ray.colocate=true"],
}
GPU_KEYS = ("rollout.num_gpus_per_engine", "learner.num_gpus_per_worker", "ray.colocate")


class OnePlacement:
    """Every engine on learner rank 0's node."""

    rollout_nodes = learner_nodes = ["node-a"]


def expected_refusal(c: dict) -> tuple[str, str] | None:
    """The two settings a refusal must name, or None when the combination must be accepted."""
    sync = c["rollout.weight_sync"]
    if c["--no-ray"] and sync not in ("auto", "file"):
        return "rollout.weight_sync", "--no-ray"
    if sync in ("nccl", "ipc", "native_ray") and c["rollout.engine"] != "vllm":
        return "rollout.weight_sync", "rollout.engine"
    if sync in ("nccl", "ipc") and c["gpus"] == "none":
        return "rollout.weight_sync", "num_gpus"
    if sync == "ipc" and c["gpus"] != "gpu+colocate":
        return "rollout.weight_sync", "ray.colocate"
    return None


def overrides_of(c: dict) -> list[str]:
    out = [f"{k}={v}" for k, v in c.items() if k not in ("gpus", "--no-ray") and v is not None]
    return out + GPU_OVERRIDES[c["gpus"]]


def combinations():
    keys = list(DIMENSIONS)
    for values in itertools.product(*DIMENSIONS.values()):
        yield dict(zip(keys, values))


def test_every_combination_is_accepted_and_resolves_or_is_refused_naming_both_settings():
    accepted = refused = 0
    wrong = []
    for c in combinations():
        cfg = load_config(None, overrides_of(c))
        want = expected_refusal(c)
        try:
            check_combinations(cfg, in_process=c["--no-ray"])
        except BadInput as e:
            refused += 1
            if want is None or not all(name in str(e) for name in want):
                wrong.append(f"{c}: refused ({e}); expected {want or 'accepted'}")
            continue
        accepted += 1
        if want is not None:
            wrong.append(f"{c}: accepted; expected a refusal naming {want}")
            continue
        try:  # what the launcher resolves once the actors are placed must not fail now
            resolve_transport(cfg, None if c["--no-ray"] else OnePlacement())
        except ValueError as e:
            wrong.append(f"{c}: accepted at load, then refused when placed: {e}")
    assert not wrong, f"{len(wrong)} combinations:\n" + "\n".join(wrong[:20])
    assert accepted + refused == 6912 and accepted > 3000 and refused > 1000, (accepted, refused)


@pytest.mark.parametrize(
    "overrides, names, accepted",
    [
        (
            ["learner.zero_stage=3", "learner.num_workers=2", "likelihood.estimator=exact"],
            ("likelihood.estimator", "learner.zero_stage 3", "learner.num_workers"),
            ["learner.zero_stage=3", "learner.num_workers=2", "likelihood.estimator=kpass"],
        ),
        (
            ["rollout.vllm.tensor_parallel_size=2"],
            ("rollout.vllm.tensor_parallel_size=2", "rollout.engine vllm"),
            ["rollout.vllm.tensor_parallel_size=2", "rollout.engine=torch"],
        ),
    ],
)
def test_learner_and_engine_layouts_that_cannot_run_are_refused_at_load(overrides, names, accepted):
    """Two rules that a learner rank and the engine factory found only once started (minutes into a job)."""
    with pytest.raises(BadInput) as e:
        check_combinations(load_config(None, overrides))
    assert all(n in str(e.value) for n in names), str(e.value)
    check_combinations(load_config(None, accepted))
