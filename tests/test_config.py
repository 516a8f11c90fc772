"""rl.config: strict typed loading from YAML + dotted overrides, error messages, dump/round trip, diffs."""

import dataclasses
import re
import textwrap
import typing

import pytest

from rl.config import Config, ConfigError, check_resume, config_from_dict, diff_configs, load_config


def write(tmp_path, text, name="x.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_defaults_load_and_validate():
    cfg = load_config(None)
    assert isinstance(cfg, Config)
    assert cfg.likelihood.estimator == "replay" and cfg.rollout.vllm.enable_prefix_caching is True
    assert cfg.pretrain.pass_schedule == [(0.75, 1), (0.97, 2), (1.0, 3)]


def test_file_and_overrides(tmp_path):
    p = write(
        tmp_path,
        """
        learner:
          lr: 1.0e-5
        rollout:
          decode_mode: soft
    """,
    )
    cfg = load_config(
        p,
        [
            "learner.lr=1e-6",
            "rollout.decode_mode=fused",
            "data.difficulty=[1,2]",
            "train.run_dir=runs/a",
            "algo.tis_cap=2",
            "model.init={hidden_size: 128}",
            "reward.fns=[{fn: my/file.py:fn, weight: 0.5}]",
            "train.resume=",
        ],
    )
    assert cfg.learner.lr == 1e-6 and isinstance(cfg.learner.lr, float)  # YAML 1.1 would say '1e-6'
    assert cfg.rollout.decode_mode == "fused"
    assert cfg.data.difficulty == [1, 2]
    assert cfg.train.run_dir == "runs/a" and cfg.train.resume is None
    assert cfg.algo.tis_cap == 2.0 and isinstance(cfg.algo.tis_cap, float)
    assert cfg.model.init.hidden_size == 128 and cfg.model.init.num_layers == 2
    assert cfg.reward.fns[0].fn == "my/file.py:fn" and cfg.reward.fns[0].weight == 0.5
    assert cfg.reward.entries() == [
        {"fn": "my/file.py:fn", "weight": 0.5, "name": "", "options": {}, "convention": "auto"}
    ]
    assert load_config(None).reward.entries()[0]["fn"] == "math"


@pytest.mark.parametrize(
    "text, expect",
    [
        ("bogus: 1\n", ["bogus: unknown key", "x.yaml line 1"]),
        ("train:\n  steps: 3\n  stpes: 4\n", ["train.stpes: unknown key", "did you mean 'steps'", "line 3"]),
        ("rollout:\n  vllm:\n    kv_cache: 2\n", ["rollout.vllm.kv_cache: unknown key", "line 3"]),
        ("learner:\n  zero_stage: 1\n  lr: abc\n", ["learner.lr: expected float, got 'abc'", "x.yaml line 3"]),
        ("train:\n  steps: true\n", ["train.steps: expected int, got True", "line 2"]),
        (
            "rollout:\n  decode_mode: sotf\n",
            ["rollout.decode_mode: expected one of 'standard', 'soft', 'fused', got 'sotf'", "did you mean 'soft'"],
        ),
        ("reward:\n  fns:\n    - fn: a.py:f\n    - weight: 2\n", ["reward.fns[1].fn: required", "line 4"]),
        ("reward:\n  fns:\n    - fn: a.py:f\n      wieght: 2\n", ["reward.fns[0].wieght: unknown key", "line 4"]),
        ("reward:\n  fns:\n    - fn: my reward\n", ["reward.fns[0].fn: expected a built-in reward name", "line 3"]),
        ("pretrain:\n  pass_schedule: [[0.5, 1], [0.9, 2]]\n", ["pretrain.pass_schedule: fractions", "line 2"]),
        ("pretrain:\n  pass_schedule: [[0.5, 1, 3]]\n", ["pretrain.pass_schedule[0]: expected [float, int]"]),
        ("train:\n  steps: 1\n  steps: 2\n", ["train.steps: duplicate key", "line 3"]),
        ("train: 5\n", ["train: expected a mapping", "line 1"]),
        ("train: [\n", ["invalid YAML", "x.yaml"]),
    ],
)
def test_file_errors_name_key_file_and_line(tmp_path, text, expect):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    for piece in expect:
        assert piece in str(e.value), str(e.value)


@pytest.mark.parametrize(
    "override, expect",
    [
        ("learner.lr=abc", "learner.lr: expected float, got 'abc' (override 'learner.lr=abc')"),
        ("rollout.decode_mode=hard", "rollout.decode_mode: expected one of"),
        ("likelihood.estimator=kpas", "did you mean 'kpass'"),
        ("trian.steps=3", "trian: unknown key"),
        ("train.steps.x=1", "train.steps: expected int"),
        ("train.steps", "expected dotted.key=value"),
        ("learner.zero_stage=4", "learner.zero_stage: expected 0, 1, 2 or 3, got 4"),
        ("rollout.top_p=0", "rollout.top_p: expected a value in (0, 1]"),
        ("model.path=3", "model.path: expected str or null, got 3"),
    ],
)
def test_override_errors(override, expect):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert expect in str(e.value), str(e.value)


def test_errors_are_value_errors():
    assert issubclass(ConfigError, ValueError)


def test_configs_saved_by_earlier_versions_load(tmp_path):
    """Earlier versions wrote `eval:` and `compare:` sections (never read) into every saved config: a run directory
    or checkpoint with one still loads, and the sections are not part of the config; below the top level the names
    are unknown keys as any other."""
    old = tmp_path / "config.yaml"
    old.write_text("train:\n  steps: 3\neval:\n  n: 500\n  split: test\ncompare:\n  max_passes: 6\n")
    cfg = load_config(old)
    assert cfg.train.steps == 3 and "eval" not in cfg.to_dict() and "compare" not in cfg.to_dict()
    assert "eval:" not in cfg.to_yaml()
    with pytest.raises(ConfigError, match="train.eval: unknown key"):
        load_config(None, ["train.eval=1"])


def test_round_trip_through_yaml(tmp_path):
    cfg = load_config(
        None,
        [
            "learner.lr=3e-6",
            "pretrain.pass_schedule=[[0.5,1],[1.0,2]]",
            "reward.fns=[{fn: a.py:f, weight: 2, options: {box: last}}]",
            "model.init={}",
        ],
    )
    path = tmp_path / "dump.yaml"
    path.write_text(cfg.to_yaml())
    again = load_config(path)
    assert again == cfg
    assert again.to_dict() == cfg.to_dict()
    assert "pass_schedule: [[0.5, 1], [1.0, 2]]" in path.read_text()
    assert config_from_dict(cfg.to_dict()) == cfg


def test_diff_and_resume_check():
    a = load_config(None)
    b = load_config(None, ["likelihood.estimator=kpass", "learner.lr=1e-7", "data.seed=3"])
    d = diff_configs(a, b)
    assert d == {"likelihood.estimator": ("replay", "kpass"), "learner.lr": (1e-5, 1e-7), "data.seed": (0, 3)}
    assert diff_configs(a, b, ["learner"]) == {"learner.lr": (1e-5, 1e-7)}
    check_resume(a, load_config(None, ["learner.lr=1e-7", "train.steps=99"]))  # unlocked fields may change
    with pytest.raises(ConfigError) as e:
        check_resume(a, b)
    assert "likelihood.estimator: 'replay' -> 'kpass'" in str(e.value) and "data.seed" in str(e.value)
    assert "learner.lr" not in str(e.value)


def test_every_section_rule_runs():
    """A section's own rules and its fields' declared bounds both run (a section with two `validate` methods once
    silently lost the first: RewardConfig's accuracy rule never ran). `accuracy` is a rule of `validate()`,
    `timeout_s` and `num_workers` are declared bounds."""
    from rl.config.loading import section_problems
    from rl.config.schema import RewardConfig

    problems = dict(section_problems(RewardConfig(accuracy="  ", timeout_s=0, num_workers=0)))
    assert set(problems) == {"accuracy", "timeout_s", "num_workers"}, problems
    assert problems["timeout_s"] == "must be > 0, got 0" and problems["num_workers"] == "must be >= 1, got 0"


def test_every_declared_bound_is_checked_at_load():
    """Each field with a declared bound, set just outside it on each side it has, is refused at load with its
    dotted key. Covers every section, the optional ones (learner.lora, model.init) switched on, so a bound declared
    on a field is a bound enforced."""
    from rl.config.bounds import declared_bounds
    from rl.config.loading import _hints
    from rl.config.schema import Config

    def sections(cls, prefix):
        for name, tp in _hints(cls).items():
            if typing.get_origin(tp) is list:
                continue  # reward.fns: a list of sections, not one
            inner = [t for t in typing.get_args(tp) or (tp,) if dataclasses.is_dataclass(t)]
            if inner:
                yield from sections(inner[0], f"{prefix}{name}.")
        yield prefix, cls

    switch_on = {"learner.lora.": ["learner.lora={}"], "model.init.": ["model.path=null", "model.init={}"]}
    checked = set()
    for prefix, cls in sections(Config, ""):
        for name, (bound, _) in declared_bounds(cls).items():
            key = f"{prefix}{name}"
            sides = []
            if bound.low is not None:
                sides.append(("low", bound.low if bound.low_open else bound.low - 1))
            if bound.high is not None:
                sides.append(("high", bound.high if bound.high_open else bound.high + 1))
            for side, outside in sides:
                with pytest.raises(ConfigError, match=re.escape(key)):
                    load_config(None, [*switch_on.get(prefix, []), f"{key}={outside}"])
                checked.add((key, side))
    assert len(checked) >= 60, len(checked)
    assert {("learner.lora.rank", "low"), ("learner.lora.dropout", "high"), ("algo.eps_low", "low")} <= checked
    assert sum(side == "high" for _, side in checked) >= 10


def test_an_offpolicy_correction_is_on_whenever_samples_can_be_stale():
    """`algo.tis_cap: auto` (the default): token TIS at 2.0 from max_staleness 1, off at 0; a set number or null
    stays as set; config.yaml gets the value in force."""
    from rl.train.policy_update import is_correction_mode

    for s, cap in ((0, None), (1, 2.0), (2, 2.0)):
        cfg = load_config(None, [f"train.max_staleness={s}"])
        assert cfg.algo.tis_cap == cap and is_correction_mode(cfg.algo) == (None if cap is None else "truncate")
        assert cfg.to_dict()["algo"]["tis_cap"] == cap
    assert load_config(None, ["train.max_staleness=1", "algo.tis_cap=null"]).algo.tis_cap is None
    assert load_config(None, ["algo.tis_cap=3.0"]).algo.tis_cap == 3.0
    with pytest.raises(ConfigError, match="tis_cap"):
        load_config(None, ["algo.tis_cap=-1"])


def test_a_config_built_in_code_resolves_auto_tis_as_a_loaded_one():
    """The library use: `Config()` keeps `tis_cap: auto`; the trainer still truncates at the cap from staleness 1."""
    from rl.config import RolloutConfig, TrainConfig
    from rl.config.schema import AUTO_TIS_CAP
    from rl.train.policy_update import PolicyUpdater

    model = __import__("torch").nn.Linear(2, 2)
    for s, mode in ((0, None), (1, "truncate"), (2, "truncate")):
        cfg = Config(train=TrainConfig(max_staleness=s), rollout=RolloutConfig())
        assert cfg.algo.tis_cap == "auto"
        loss = PolicyUpdater(model, cfg, 0).loss_cfg
        assert loss.is_mode == mode and (mode is None or loss.is_cap == AUTO_TIS_CAP), s


def test_resume_of_an_async_run_locks_the_checkpoint_schedule():
    """At max_staleness >= 1 the checkpoint schedule decides which weights make a batch (a batch never crosses a
    checkpoint), so changing train.checkpoint_every on resume is refused, naming it; at s = 0 it is not."""
    a = load_config(None, ["train.max_staleness=1", "train.checkpoint_every=2"])
    with pytest.raises(ConfigError, match=r"train.checkpoint_every: 2 -> 4"):
        check_resume(a, load_config(None, ["train.max_staleness=1", "train.checkpoint_every=4"]))
    check_resume(load_config(None, ["train.checkpoint_every=2"]), load_config(None, ["train.checkpoint_every=4"]))
