"""A config key that names a registry entry offers exactly the registry's names.

The schema spells its choices as `Literal`s (the loader's errors list them, `did you mean` reads them), while the
code that acts on a name looks it up in a registry. Each such key is tied to its registry here, so a new entry that
is not named in the schema, or a schema name with nothing behind it, fails; and every other `Literal` of the schema
is listed as a plain option set, so a new copy of a registry cannot slip in untied.
"""

from __future__ import annotations

import dataclasses
import typing

import pytest
import torch

from rl import algos
from rl.algos.mismatch import IS_LEVELS, IS_MODES
from rl.config import Config, load_config
from rl.decode_modes import DECODE_MODES
from rl.estimators.likelihood import ESTIMATORS, needs_recorded_states
from rl.samples.states import CONFIG_NAMES


def _registries() -> dict[str, set[str]]:
    """{dotted key: the names its registry holds (plus the key's own `auto`, where it has one)}."""
    from actors.engines import ENGINES
    from actors.weight_sync import TRANSPORTS
    from rewards.conventions import CONVENTIONS
    from rl.model import FUSION_INITS, FUSION_MODES

    return {
        "algo.adv_estimator": set(algos.ADVANTAGE_ESTIMATORS),
        "algo.policy_loss": {"auto", *algos.POLICY_LOSSES},
        "algo.loss_agg": set(algos.LOSS_AGG_MODES),
        "algo.kl_estimator": set(algos.KL_ESTIMATORS),
        "algo.tis_mode": set(IS_MODES),
        "algo.tis_level": set(IS_LEVELS),
        "likelihood.estimator": set(ESTIMATORS),
        "rollout.decode_mode": set(DECODE_MODES),
        "train.eval_decode_modes": set(DECODE_MODES),
        "rollout.record_states_dtype": {"auto", *CONFIG_NAMES},
        "model.fusion_mode": set(FUSION_MODES),
        "model.convert_init": set(FUSION_INITS),
        "reward.fns.convention": set(CONVENTIONS),
        "rollout.engine": set(ENGINES),
        "rollout.weight_sync": {"auto", *TRANSPORTS},
    }


# Literal keys whose choices are options of the key itself, not names of a registry.
PLAIN_OPTIONS = {
    "model.dtype",
    "data.numbers",
    "data.chat_template",
    "data.overlong_prompts",
    "learner.dist_backend",
    "logging.report_to",
    "logging.wandb_mode",
    "ray.placement",
    "pretrain.lr_schedule",
    "pretrain.schedule",
    "pretrain.fusion_init",
    "pretrain.loss_on",
    "pretrain.feedback_on",
    "model.init.backbone",
    "likelihood.ref_estimator",  # a subset of the estimators: tested below
    "algo.tis_cap",  # a number, `auto` or null
    "train.keep_best.mode",  # max or min: which way a metric is better
}


def _literal_keys(cls=Config, prefix="") -> dict[str, tuple]:
    """{dotted key: its Literal's choices} over the whole schema (inside lists and optionals too; `reward.fns`'s
    entries as `reward.fns.KEY`)."""
    out = {}
    for name, tp in typing.get_type_hints(cls).items():
        key = f"{prefix}{name}"
        stack, choices = [tp], []
        while stack:
            t = stack.pop()
            if dataclasses.is_dataclass(t):  # a section, or the entries of a list (reward.fns)
                out.update(_literal_keys(t, key + "."))
            elif typing.get_origin(t) is typing.Literal:
                choices += typing.get_args(t)
            else:
                stack += typing.get_args(t)
        if choices:
            out[key] = tuple(choices)
    return out


def test_every_literal_key_is_tied_to_a_registry_or_declared_plain():
    keys = set(_literal_keys())
    registries = set(_registries())
    assert not registries - keys, f"tied keys the schema no longer has as a Literal: {sorted(registries - keys)}"
    assert not PLAIN_OPTIONS - keys, f"plain keys the schema no longer has: {sorted(PLAIN_OPTIONS - keys)}"
    untied = keys - registries - PLAIN_OPTIONS
    assert not untied, f"Literal keys neither tied to a registry here nor declared plain options: {sorted(untied)}"


@pytest.mark.parametrize("key", sorted(_registries()))
def test_config_choices_are_the_registry_names(key):
    assert set(_literal_keys()[key]) == _registries()[key], key


def test_reference_estimators_read_no_recorded_states():
    """The reference model has no recorded states of its own: its choices are estimators that need none."""
    choices = _literal_keys()["likelihood.ref_estimator"]
    assert set(choices) <= set(ESTIMATORS)
    assert not [c for c in choices if needs_recorded_states(c)]


def test_a_registered_policy_loss_selected_in_the_config_reaches_compute_policy_loss(monkeypatch):
    """`algo.policy_loss` names the loss the update computes: a loss registered here and selected in the config
    is the one `compute_policy_loss` calls; `auto` keeps the built-in choice (reinforce for one update)."""
    from rl.train.policy_update import policy_loss_config

    calls = []

    def doubled_reinforce(logp, old_logp, advantages, cfg):
        calls.append(logp.shape)
        loss, flags = algos.POLICY_LOSSES["reinforce"](logp, old_logp, advantages, cfg)
        return 2 * loss, flags

    monkeypatch.setitem(algos.POLICY_LOSSES, "test_doubled", doubled_reinforce)
    cfg = load_config("configs/tiny.yaml")
    assert policy_loss_config(cfg.algo, 8).loss_type == "reinforce"
    cfg.algo.policy_loss = "test_doubled"
    loss_cfg = policy_loss_config(cfg.algo, 8)
    logp, mask = torch.full((2, 3), -1.0), torch.ones(2, 3)
    adv = torch.tensor([1.0, -0.5])
    loss, _ = algos.compute_policy_loss(logp, None, adv, mask, loss_cfg)
    plain, _ = algos.compute_policy_loss(logp, None, adv, mask, policy_loss_config(load_config().algo, 8))
    assert calls == [(2, 3)]
    torch.testing.assert_close(loss, 2 * plain)


def test_policy_loss_ppo_is_selectable_and_reinforce_refuses_a_dual_clip():
    from rl.config import ConfigError
    from rl.train.policy_update import policy_loss_config

    assert policy_loss_config(load_config(None, ["algo.policy_loss=ppo"]).algo, 8).loss_type == "ppo"
    with pytest.raises(ConfigError, match="algo.policy_loss"):
        load_config(None, ["algo.policy_loss=reinforce", "algo.clip_ratio_c=3.0"])


def test_every_transport_serves_only_registered_engines():
    from actors.engines import ENGINES
    from actors.weight_sync import TRANSPORTS, engine_transports

    for name, transport in TRANSPORTS.items():
        assert transport.engines is None or set(transport.engines) <= set(ENGINES), name
    for name in ENGINES:  # a state dict reaches every engine
        assert {"file", "ray"} <= set(engine_transports(name)), name
