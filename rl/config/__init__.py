"""One typed config schema for every fbrl command (pretrain/SFT, eval, compare-likelihood, RL train).

Owns: the nested dataclasses below (one per section), loading them from YAML plus dotted `key=value`
overrides (`load_config`), strict validation (unknown key, wrong type, bad choice -> `ConfigError` naming
the full dotted key, the file and line or the override, and what was expected), dumping back to YAML,
and comparing two configs field by field (`diff_configs`, `check_resume`).

schema.py holds the sections (runtime.py those of logging, Ray and faults), loading.py the YAML/override loader
(import them from here), resume.py comparing two configs and the resume rule, secrets.py the
redaction of secret values before a config is written anywhere, bounds.py the declared bounds of single fields
and their validator.

The loader is generic: it reads the dataclasses' annotations, so adding a field is adding one line to a
section. A field's bound is declared on the field (bounds.py); rules that relate fields of one section live in
its `validate()` (it returns `(field, message)` problems), rules across sections in the loader; the loader turns
every problem into an error carrying the key's location. Rules that need other packages (e.g. vLLM
option compatibility, e.g. chunked prefill must stay off) are checked where those packages are used.
The defaults are the embedded CPU default (tiny checkpoint, arithmetic task).

pretrain.py holds the two sections only `fbrl pretrain` reads (`pretrain`, `model.init`; schema.py's `Config`
includes them), serialize.py a config as plain data, dotted keys and YAML text (what `Config.to_dict / flat /
to_yaml` return; the loader's dotted-key helpers).
"""

from rl.config.loading import config_from_dict, load_config, tis_cap_in_force
from rl.config.pretrain import ModelInitConfig, PretrainConfig
from rl.config.resume import RESUME_LOCKED, check_resume, diff_configs
from rl.config.runtime import FaultsConfig, LoggingConfig, RayConfig
from rl.config.schema import (
    AlgoConfig,
    Config,
    ConfigError,
    DataConfig,
    DecodeMode,
    LearnerConfig,
    LikelihoodConfig,
    ModelConfig,
    RewardConfig,
    RewardFnConfig,
    RolloutConfig,
    TrainConfig,
    VllmOptions,
)

__all__ = [
    "config_from_dict",
    "load_config",
    "RESUME_LOCKED",
    "AlgoConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "DecodeMode",
    "FaultsConfig",
    "LearnerConfig",
    "LikelihoodConfig",
    "LoggingConfig",
    "ModelConfig",
    "ModelInitConfig",
    "PretrainConfig",
    "RayConfig",
    "RewardConfig",
    "RewardFnConfig",
    "RolloutConfig",
    "TrainConfig",
    "VllmOptions",
    "check_resume",
    "diff_configs",
    "tis_cap_in_force",
]
