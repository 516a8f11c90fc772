"""Checks of a training job's inputs that run before any worker or engine starts, so bad input fails in seconds
(`fbrl train` starts Ray beside them once the config has loaded, and stops it when they refuse the job).

`check_job(cfg)` raises `BadInput` (an `rl.errors.InputError`, as config, data and reward errors are) with one
message naming what is wrong; `fbrl train` prints it without a traceback and exits with code 2. It checks:

- the checkpoint (`model.path`): a local directory holding a config.json of an FBT model — "not found" is said
  as such, never as a failed Hugging Face hub download;
- the tokenizer (`model.tokenizer`, else the checkpoint's): it loads, has an EOS token, and every id it can
  produce has a row in the model's embedding (`vocab_size`), else the first id without one is named;
- the rewards (`reward.fns`): built-in names, user `path/to/file.py:fn` (relative to the working directory) and
  `package.module:fn` load and take (prompts, completions, answers, **row_fields);
- combinations that cannot work (`check_combinations`): a weight transport the engines, GPUs, colocation or
  --no-ray rule out, a vLLM tensor-parallel engine, the exact estimator across ZeRO-3 ranks, one sample per
  prompt with a group-relative advantage;
- the data (`data`): files exist and parse, hold rows, rows have the prompt and answer fields, and prompts longer
  than the engine allows are counted (or stop the job here, `data.overlong_prompts: error`); on `--resume`, as
  many training rows remain as the checkpoint's sampler drew from (a changed prompt limit is named).

The run directory's rules (a new run into a non-empty directory, `--resume` of a missing one) are
`rl.train.run_dir.RunDir`'s.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from rl.errors import InputError


class BadInput(InputError):
    """A job input that cannot work; the message names it."""


def check_checkpoint(path: str | None, key: str = "model.path", allow_stock: bool = False) -> dict:
    """The checkpoint's config.json as a dict; `BadInput` unless `path` is a local FBT checkpoint directory (or,
    with `allow_stock`, a stock checkpoint of a supported backbone, which the job converts when it starts)."""
    if not path:
        raise BadInput(f"{key}: required (a save_pretrained directory of an FBT checkpoint)")
    p = Path(path).expanduser()
    if not p.exists():
        raise BadInput(
            f"{key}: checkpoint not found: {p.resolve()} (a local directory is expected; relative paths "
            f"are taken from the working directory, {Path.cwd()})"
        )
    if not p.is_dir() or not (p / "config.json").is_file():
        raise BadInput(f"{key}: {p} is not a checkpoint directory (no config.json in it)")
    try:
        config = json.loads((p / "config.json").read_text())
    except json.JSONDecodeError as e:
        raise BadInput(f"{key}: {p / 'config.json'} is not valid JSON (line {e.lineno}: {e.msg})") from None
    from rl.backbones import FBT_ARCHITECTURE_OF, stock_backbone

    arch = (config.get("architectures") or [""])[0]
    if arch not in FBT_ARCHITECTURE_OF.values() and not (allow_stock and stock_backbone(config)):
        backbones = list(FBT_ARCHITECTURE_OF)
        stock = f"a stock {' / '.join(backbones)} checkpoint (converted when the job starts) or " if allow_stock else ""
        raise BadInput(
            f"{key}: {p} holds a {arch or 'model without architectures'} checkpoint (model_type "
            f"{config.get('model_type')!r}); expected {stock}an FBT one ({' / '.join(FBT_ARCHITECTURE_OF.values())}); "
            f"supported backbones: {', '.join(backbones)}"
        )
    if not any(p.glob("*.safetensors")):
        raise BadInput(f"{key}: {p} has no *.safetensors weights (only safetensors are loaded)")
    return config


def check_tokenizer(cfg, model_config: dict):
    """The job's tokenizer, loaded; `BadInput` when it cannot serve the model."""
    path = cfg.model.tokenizer or cfg.model.path
    key = "model.tokenizer" if cfg.model.tokenizer else "model.path"
    p = Path(path).expanduser()
    if not p.is_dir():
        raise BadInput(f"{key}: tokenizer directory not found: {p.resolve()}")
    if not any((p / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise BadInput(f"{key}: no tokenizer files in {p} (tokenizer.json / tokenizer_config.json)")
    from rl.data.tokenizer import load_tokenizer

    try:
        tok = load_tokenizer(str(p))
    except Exception as e:
        raise BadInput(f"{key}: the tokenizer in {p} does not load: {type(e).__name__}: {str(e)[:300]}") from None
    if tok.eos_token_id is None:
        raise BadInput(f"{key}: the tokenizer in {p} has no EOS token (a response could never end)")
    vocab = int(model_config.get("vocab_size") or 0)
    ids = {name: i for name, i in tok.get_vocab().items()}
    too_big = sorted((i, name) for name, i in ids.items() if i >= vocab)
    if too_big:
        i, name = too_big[0]
        raise BadInput(
            f"{key}: tokenizer/model vocabulary mismatch: the tokenizer in {p} has ids up to "
            f"{max(ids.values())} but the model ({cfg.model.path}) has vocab_size={vocab}; token id "
            f"{i} ({name!r}) and {len(too_big) - 1} more have no embedding"
        )
    return tok


def check_rewards(cfg, base_dir: str | None = None, python_fns: dict | None = None) -> None:
    """Every reward of `reward.fns` resolves (user files and modules are imported here, in the driver;
    `python:NAME` entries are the functions handed to `actors.api.train`)."""
    from rewards.loader import BUILTINS, RewardLoadError, load_reward_fn

    for i, entry in enumerate(cfg.reward.fns):
        if entry.fn in BUILTINS:
            continue
        if ":" not in entry.fn:
            raise BadInput(
                f"reward.fns[{i}].fn: unknown built-in reward {entry.fn!r} (built-ins: "
                f"{', '.join(BUILTINS)}; a user reward is 'path/to/file.py:fn' or 'package.module:fn')"
            )
        try:
            load_reward_fn(entry.fn, base_dir, entry.convention, python_fns)
        except RewardLoadError as e:
            raise BadInput(f"reward.fns[{i}].fn: {e}") from None
    check = cfg.reward.accuracy.strip()  # 'auto', 'none', an entry of fns, or a reward spec of its own
    named = {e.fn for e in cfg.reward.fns} | {e.name for e in cfg.reward.fns if e.name}
    if ":" in check and check not in named:  # a spec of its own (entries are also named by their metrics name)
        try:
            load_reward_fn(check, base_dir)
        except RewardLoadError as e:
            raise BadInput(
                f"reward.accuracy: {check!r} is not 'auto', 'none' or a reward of reward.fns, and does "
                f"not load as a reward: {e}"
            ) from None


def check_data(cfg, tokenizer, model_config: dict):
    """The train and eval rows load (`rl.train.job.JobData`: the job trains on these, they are not loaded again)."""
    from types import SimpleNamespace

    from rl.data.jsonl import DataError
    from rl.train.job_data import JobData

    try:
        data = JobData.load(cfg, tokenizer, SimpleNamespace(**model_config))
    except DataError as e:
        raise BadInput(str(e)) from None
    for rows, split in ((data.train_rows, "train"), (data.eval_rows, "test")):
        if not rows and (split == "train" or cfg.train.eval_every > 0):  # (no eval: its rows are never loaded)
            path = getattr(cfg.data, f"{split}_path") or cfg.data.train_path  # (one Hub dataset serves both)
            where = f"data.{split}_path: {path}" if not _generated(cfg) else "data"
            raise BadInput(f"{where}: no rows (an empty {'training' if split == 'train' else 'eval'} set)")
    return data


def _generated(cfg) -> bool:
    from rl.data.tasks import TASKS

    return TASKS[cfg.data.task].generated


def check_resume_data(cfg, data, model_config: dict) -> None:
    """On `--resume`: the training rows as fitted now are the rows the checkpoint's sampler drew from (their count),
    else the prompts would differ from the run's; a changed prompt limit (`rollout.max_tokens`, the engine's context,
    `data.max_prompt_tokens`) is the usual cause and is named, with the limits then and now."""
    from types import SimpleNamespace

    from rl.config import load_config
    from rl.data.prompts import prompt_token_limit
    from rl.train.run_dir import RunDir

    checkpoint = RunDir(cfg.train.resume).latest_checkpoint() if cfg.train.resume else None
    if checkpoint is None:
        return
    sampler = json.loads((checkpoint / "trainer_state.json").read_text()).get("sampler") or {}
    then, now = sampler.get("num_rows"), len(data.train_rows)
    if then is None or then == now:
        return
    run_cfg = load_config(Path(cfg.train.resume) / "config.yaml")
    config = SimpleNamespace(**model_config)
    limits = (prompt_token_limit(run_cfg, config), prompt_token_limit(cfg, config))
    why = (
        f"the prompt limit changed from {limits[0]} to {limits[1]} tokens (rollout.max_tokens "
        f"{run_cfg.rollout.max_tokens} -> {cfg.rollout.max_tokens}, data.max_prompt_tokens "
        f"{run_cfg.data.max_prompt_tokens} -> {cfg.data.max_prompt_tokens}): resume with the run's values"
        if limits[0] != limits[1]
        else "the data changed: resume with the data the run started with"
    )
    raise BadInput(
        f"--resume {cfg.train.resume}: {checkpoint.name} drew its prompts from {then} training rows, and {now} "
        f"remain now after the prompts over the limit are dropped; {why}"
    )


def check_combinations(cfg, in_process: bool = False) -> None:
    """Settings that are each valid but cannot work together, refused naming both keys (`in_process`: --no-ray).
    Every rule a worker would otherwise find only once it runs lives here (tests/test_combinations.py walks the
    cross of the settings that interact)."""
    from actors.weight_sync import transport_problem

    r, learner = cfg.rollout, cfg.learner
    problem = transport_problem(cfg, in_process)
    if problem:
        raise BadInput(problem)
    if r.engine == "vllm" and r.vllm.tensor_parallel_size != 1:
        raise BadInput(
            f"rollout.vllm.tensor_parallel_size={r.vllm.tensor_parallel_size} with rollout.engine vllm: the rollout "
            f"actor runs vLLM in-process (uni executor), which serves one device; use more engines "
            f"(rollout.num_engines) instead"
        )
    if learner.zero_stage == 3 and learner.num_workers > 1 and cfg.likelihood.estimator == "exact" and not in_process:
        # ZeRO-3 gathers each module's parameters collectively at every call, so all ranks must make the same
        # module calls; the exact recurrence makes one call per position of each rank's own longest row.
        raise BadInput(
            "likelihood.estimator 'exact' cannot run under learner.zero_stage 3 with several learner workers "
            "(learner.num_workers > 1: ranks would make different numbers of collective parameter gathers); use "
            "learner.zero_stage 1-2, one worker, or the kpass / replay estimators"
        )
    fused = [
        k
        for k, v in (("rollout.decode_mode", [r.decode_mode]), ("train.eval_decode_modes", cfg.train.eval_decode_modes))
        if "fused" in v
    ]
    if cfg.env is not None and fused:
        raise BadInput(
            f"env (multi-turn rollouts) with {fused[0]} fused: a later turn resumes its sequence with the recorded "
            f"states fused where the decode fused them, which is defined for soft and standard decoding; use soft"
        )
    if r.n_samples_per_prompt < 2:
        raise BadInput(
            f"rollout.n_samples_per_prompt={r.n_samples_per_prompt}: algo.adv_estimator={cfg.algo.adv_estimator} "
            f"compares the samples of a prompt with each other, so one sample gives every advantage 0 and no "
            f"step would train; use 2 or more"
        )


def check_kv_cache(cfg, model_config: dict) -> None:
    """A vLLM engine on CPU refuses a KV cache that cannot hold `max_num_seqs` full-length sequences (decoding could
    preempt and lose latent states): found here, naming the keys and a size that works, instead of in the engine
    actor after Ray started."""
    from types import SimpleNamespace

    from rl.data.prompts import vllm_max_model_len
    from rollout.vllm_env import kv_sequences_fit

    r, v = cfg.rollout, cfg.rollout.vllm
    if r.engine != "vllm" or r.num_gpus_per_engine > 0:
        return
    config = SimpleNamespace(**model_config)
    length = vllm_max_model_len(cfg, config)
    fits = kv_sequences_fit(config, length, v.kv_cache_gib, cfg.model.dtype)
    if fits < v.max_num_seqs:
        enough = math.ceil(v.kv_cache_gib * v.max_num_seqs / fits * 1.05 * 8) / 8  # 5 % over the pages, in GiB/8
        raise BadInput(
            f"rollout.vllm.kv_cache_gib={v.kv_cache_gib:g} holds {fits:.1f} sequences of rollout.vllm.max_model_len="
            f"{length} tokens{'' if v.max_model_len else ' (the model context, at most 2048)'}, fewer than "
            f"rollout.vllm.max_num_seqs={v.max_num_seqs} (the engine refuses a cache that could preempt): set "
            f"kv_cache_gib to {enough:g}, or lower max_model_len (the longest prompt plus rollout.max_tokens is "
            f"enough) or max_num_seqs"
        )


def check_deadline(cfg) -> None:
    """A `train.save_before` time that has already passed (a resumed run's own config may hold one) is refused
    now, naming the key, instead of stopping the job after its first step."""
    import time

    from rl.train.deadline import deadline_problem

    problem = deadline_problem(cfg.train.save_before, time.time())
    if problem:
        raise BadInput(f"train.save_before: {problem}")


def check_job(cfg, base_dir: str | None = None, in_process: bool = False, log=print, python_fns: dict | None = None):
    """All of the above; returns (the tokenizer, `cfg` with `reward.accuracy: auto` resolved to none when the data
    has no answers to check against and no reward needs them, the data as loaded). `in_process`: --no-ray."""
    check_combinations(cfg, in_process)
    check_deadline(cfg)
    model_config = check_checkpoint(cfg.model.path, allow_stock=not cfg.train.resume)
    tokenizer = check_tokenizer(cfg, model_config)
    check_kv_cache(cfg, model_config)
    check_rewards(cfg, base_dir, python_fns)
    data = check_data(cfg, tokenizer, model_config)
    check_resume_data(cfg, data, model_config)
    answers = sum(r.get("answer") is not None for r in data.train_rows)
    if answers == 0 and cfg.reward.accuracy.strip() == "auto":
        log("reward.accuracy: auto -> none: the training rows carry no answer to check correctness against")
        cfg = dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, accuracy="none"))
    return tokenizer, cfg, data
