"""Bad input refused before any worker or engine starts, run-directory rules, secrets and untrusted files, and the
pieces of fault handling that need no Ray (prompt fitting, stop rules, a skipped non-finite step, absurd rewards).
The faults injected into real jobs are in tests/test_faults.py; docs/RELIABILITY.md has the tables."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from conftest import ROOT

from bench.bad_input import ray_processes

CONFIG = ROOT / "configs" / "tiny.yaml"
ENV = dict(WANDB_MODE="offline", VLLM_ENABLE_V1_MULTIPROCESSING="0", TOKENIZERS_PARALLELISM="false")
MY_REWARDS = "def zero(prompts, completions, answers, **fields):\n    return [0.0] * len(completions)\n"


def write_task_with_long_prompt(path: Path, n: int) -> None:
    """n arithmetic rows with one prompt longer than the engine's context at row n // 2."""
    from rl.data import arith
    from rl.data.jsonl import write_jsonl

    rows = [
        {"prompt": r["prompt"], "answer": r["answer"]} for r in arith.generate("train", n, seed=0, difficulties=(1, 2))
    ]
    long = {"prompt": f"Q: {'1+' * 200}1=? Put the answer in \\boxed{{}}.\nA:", "answer": "201"}
    write_jsonl(rows[: n // 2] + [long] + rows[n // 2 :], path)


# ---- bad input: refused before any worker or engine starts --------------------------------------------------------
def prepare(*argv: str, cwd: Path | None = None):
    """`fbrl train ARGV`'s checks (actors.cli.launch.prepare), in this process."""
    import argparse

    from actors.cli.launch import add_arguments
    from actors.cli.launch import prepare as launch_prepare

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(list(argv))
    return launch_prepare(args)


@pytest.fixture
def inputs(tmp_path):
    """Files for the bad-input cases: a reward file, data sets, a tokenizer bigger than the model's vocabulary."""
    from rl.data.jsonl import write_jsonl
    from rl.data.tokenizer import ALPHABET, build_tokenizer

    (tmp_path / "my_rewards.py").write_text(MY_REWARDS)
    write_jsonl(
        [{"prompt": "Q: 1+1=?", "answer": "2"}, {"question": "Q: 2+2=?", "answer": "4"}], tmp_path / "nofield.jsonl"
    )
    write_task_with_long_prompt(tmp_path / "long.jsonl", 10)
    write_jsonl([{"prompt": "Q: 1+1=?", "answer": "2"}], tmp_path / "short.jsonl")
    (tmp_path / "latin1.jsonl").write_bytes(
        b'{"prompt": "Q: 1+1=?", "answer": "2"}\n{"prompt": "Q: caf\xe9", "answer": "4"}\n'
    )
    build_tokenizer(alphabet=ALPHABET + "äöü").save_pretrained(str(tmp_path / "bigtok"))
    return tmp_path


BAD_INPUT = [  # (overrides, a piece of the message); {d} is the inputs directory
    (["train.steps=-1"], "train.steps: must be >= 1, got -1"),
    (["train.prompts_per_step=0"], "train.prompts_per_step: must be >= 1, got 0"),
    (["learner.num_workers=0"], "learner.num_workers: must be >= 1, got 0"),
    (["learner.lr=0"], "learner.lr: must be > 0"),
    (["model.path={d}/no-such-checkpoint"], "model.path: checkpoint not found"),
    (["model.path={d}"], "is not a checkpoint directory (no config.json"),
    (["reward.fns=[{{fn: {d}/missing.py:f}}]"], "reward file not found"),
    (["reward.fns=[{{fn: {d}/my_rewards.py:nope}}]"], "has no function 'nope'"),
    (["reward.fns=[{{fn: mathh}}]"], "unknown built-in reward 'mathh'"),
    (["data.task=jsonl", "data.train_path={d}/missing.jsonl"], "data.train_path: {d}/missing.jsonl: no such file"),
    (["data.task=jsonl", "data.train_path={d}/nofield.jsonl"], "nofield.jsonl:2: missing field 'prompt'"),
    (
        ["data.task=jsonl", "data.train_path={d}/latin1.jsonl"],
        "{d}/latin1.jsonl:2: not UTF-8 (byte 0xe9 at column 19)",
    ),
    (["algo.adv_eps=0"], "algo.adv_eps: must be > 0"),
    (
        ["rollout.engine=vllm", "rollout.vllm.kv_cache_gib=0.01"],
        "rollout.vllm.kv_cache_gib=0.01 holds 9.1 sequences of rollout.vllm.max_model_len=256 tokens",
    ),
    (["model.tokenizer={d}/bigtok"], "vocabulary mismatch"),
    (
        ["data.task=jsonl", "data.train_path={d}/long.jsonl", "data.overlong_prompts=error"],
        "row 5 (from 0) has a prompt of 438 tokens, more than the limit of 208",
    ),
    (
        ["data.task=jsonl", "data.train_path={d}/short.jsonl", "data.max_prompt_tokens=3"],
        "every one of the 1 prompts is longer than the limit of 3",
    ),
    (["rollout.max_tokens=300"], "rollout.max_tokens=300 leaves no room for a prompt"),
    (
        ["rollout.weight_sync=native_ray"],
        "rollout.weight_sync='native_ray' drives vLLM's native weight transfer, but rollout.engine is 'torch'",
    ),
    (["rollout.n_samples_per_prompt=1"], "rollout.n_samples_per_prompt=1: algo.adv_estimator=grpo compares"),
]


@pytest.mark.parametrize("overrides, message", BAD_INPUT, ids=[m[:40] for _, m in BAD_INPUT])
def test_bad_input_is_refused_before_anything_starts(inputs, overrides, message):
    import ray

    d = str(inputs)
    with pytest.raises(ValueError) as e:
        prepare(*[o.format(d=d) for o in overrides], f"train.run_dir={inputs / 'run'}")
    assert message.format(d=d) in str(e.value), str(e.value)
    assert not ray.is_initialized() and not (inputs / "run").exists()  # nothing started, nothing created


def fake_checkpoint(run: Path, step: int = 1) -> None:
    """What makes a checkpoint complete for resume (its trainer state and learner directory), contents aside."""
    ckpt = run / "checkpoints" / f"step_{step:06d}"
    (ckpt / "learner").mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": step}))
    (run / "checkpoints" / "latest").write_text(ckpt.name)


def test_run_dir_rules(tmp_path):
    """A new run into a used run dir is refused (or replaced with --overwrite); --resume of a missing dir creates
    nothing; --resume takes the run's own config.yaml plus the overrides it allows, and refuses locked ones."""
    from rl.config import ConfigError
    from rl.train.run_dir import RunDirError

    run = tmp_path / "run"
    cfg, _, run_dir, _, _ = prepare("train.checkpoint_every=7", "train.steps=3", f"train.run_dir={run}")
    run_dir.write_config(cfg)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(RunDirError, match="is not empty .*--resume"):
        prepare(f"train.run_dir={run}")
    with pytest.raises(RunDirError, match="no complete checkpoint"):
        prepare("--resume", str(run))
    fake_checkpoint(run)
    cfg, path, _, _, _ = prepare("--resume", str(run), "train.steps=9")
    assert path == str(run / "config.yaml")
    assert cfg.train.checkpoint_every == 7 and cfg.train.steps == 9 and cfg.train.resume == str(run)
    with pytest.raises(ConfigError, match="cannot resume.*likelihood.estimator"):
        prepare("--resume", str(run), "likelihood.estimator=kpass")
    with pytest.raises(RunDirError, match="no such run directory"):
        prepare("--resume", str(tmp_path / "missing"))
    assert not (tmp_path / "missing").exists()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match="does not look like an fbrl run directory"):
        prepare(f"train.run_dir={tmp_path / 'other'}", "--overwrite")
    assert (tmp_path / "other" / "notes.txt").exists()
    prepare(f"train.run_dir={run}", "--overwrite")
    assert sorted(os.listdir(run)) == [".lock", "checkpoints"]


def test_embedded_default_from_another_directory(tmp_path, monkeypatch):
    """`fbrl train` from any directory: the embedded default's checkpoint resolves from the package."""
    monkeypatch.chdir(tmp_path)
    cfg, path, _, tokenizer, _ = prepare(f"train.run_dir={tmp_path / 'run'}")
    assert Path(cfg.model.path).is_absolute() and Path(cfg.model.path).is_dir()
    assert cfg.model.path == str(ROOT / "checkpoints" / "tiny-arith-mixed") and len(tokenizer) == 101
    # a relative path in an override keeps its usual meaning: the working directory
    with pytest.raises(ValueError, match=f"checkpoint not found: {tmp_path}/checkpoints/tiny-arith"):
        prepare("model.path=checkpoints/tiny-arith", f"train.run_dir={tmp_path / 'run2'}")


def test_secrets_are_not_saved_and_resume_asks_for_them(tmp_path):
    from rl.config import ConfigError, load_config
    from rl.train.run_dir import RunDir

    secret = uuid.uuid4().hex
    cfg = load_config(CONFIG, [f"reward.fns=[{{fn: math}}, {{fn: x.py:f, options: {{api_key: {secret}}}}}]"])
    run = RunDir(str(tmp_path / "run"))
    run.write_config(cfg)
    text = (tmp_path / "run" / "config.yaml").read_text()
    assert secret not in text and "api_key: <redacted>" in text
    fake_checkpoint(tmp_path / "run")
    with pytest.raises(ConfigError, match=r"reward.fns\[1\].options.api_key: secret values are never saved"):
        prepare("--resume", str(tmp_path / "run"))


def test_cli_bad_input_exit_code_and_time(tmp_path):
    """Through the real command: one line on stderr, no traceback, exit code 2, no Ray, in seconds."""
    env = dict(os.environ, **ENV, PYTHONPATH=str(ROOT))
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "actors.cli", "train", "train.steps=0", f"train.run_dir={tmp_path}/r"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    seconds = time.monotonic() - t0
    assert p.returncode == 2 and p.stderr.strip() == (
        "fbrl train: error: train.steps: must be >= 1, got 0 (override 'train.steps=0')"
    ), p.stderr
    assert "Traceback" not in p.stderr and "Ray" not in p.stdout + p.stderr and not (tmp_path / "r").exists()
    assert seconds < 60, seconds  # imports only (torch); start-up of Ray + engines is what is avoided


def test_cli_input_refused_while_ray_starts_leaves_nothing(tmp_path):
    """A bad input the checks find after the config loaded (a reward file that is not there): Ray is already
    starting beside those checks, and the refusal is still its one line, exit code 2, no run directory, and none of
    that Ray's processes left running."""
    ray_tmp = Path(tempfile.mkdtemp(prefix="fbrl-", dir="/tmp"))  # short: Ray's socket paths live under it
    env = dict(os.environ, **ENV, PYTHONPATH=str(ROOT), RAY_TMPDIR=str(ray_tmp))
    argv = ["train", "reward.fns=[{fn: missing.py:score}]", f"train.run_dir={tmp_path}/r"]
    try:
        p = subprocess.run(
            [sys.executable, "-m", "actors.cli", *argv],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert p.returncode == 2 and p.stdout == "", (p.returncode, p.stdout)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("fbrl train: error: ") and "reward file not found" in lines[0]
        assert not (tmp_path / "r").exists()
        assert list(ray_tmp.glob("ray/session_*")), "Ray was not started beside the checks"
        left = ray_processes(str(ray_tmp))
        assert not left, [cmd[:120] for cmd in left]
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_untrusted_files_load_without_pickle_or_remote_code():
    """torch.load only with weights_only=True; no trust_remote_code=True anywhere in the package."""
    offenders = []
    for path in [
        *ROOT.glob("rl/**/*.py"),
        *ROOT.glob("actors/**/*.py"),
        *ROOT.glob("rollout/**/*.py"),
        *ROOT.glob("rewards/**/*.py"),
        *ROOT.glob("scripts/*.py"),
        *ROOT.glob("bench/*.py"),
        *ROOT.glob("tools/**/*.py"),
        *ROOT.glob("examples/*.py"),
    ]:
        text = path.read_text()
        for m in re.finditer(r"torch\.load\(([^()]|\([^()]*\))*\)", text):
            if "weights_only=True" not in m.group(0):
                offenders.append(f"{path}: {m.group(0)[:80]}")
        if re.search(r"trust_remote_code\s*=\s*True", text):
            offenders.append(f"{path}: trust_remote_code=True")
    assert not offenders, offenders


# ---- the pieces, without Ray --------------------------------------------------------------------------------------
def test_prompt_fitter_drops_truncates_or_refuses():
    from rl.data.jsonl import DataError
    from rl.data.prompts import PromptFitter
    from rl.data.tokenizer import build_tokenizer

    tok = build_tokenizer()
    rows = [{"prompt": "12345"}, {"prompt": "1234567890abc"}, {"prompt": "abc"}]  # 6, 14, 4 tokens with BOS
    kept, over = PromptFitter(tok, 8, "drop").fit(rows, "data")
    assert over == 1 and [r["prompt"] for r in kept] == ["12345", "abc"]
    left = PromptFitter(tok, 8, "truncate_left")
    assert left.fit(rows, "data") == (rows, 1)
    long, short = {"prompt": "1234567890abc"}, {"prompt": "12345"}
    assert (
        left.encode(long) == [tok.bos_token_id] + tok.encode("7890abc", add_special_tokens=False)
        and len(left.encode(long)) == 8
        and left.encode(short) == tok.encode("12345")
    )
    assert PromptFitter(tok, 8, "truncate_right").encode(long) == tok.encode("1234567")
    # a chat-templated prompt already holds its special tokens (rl.data.loaders.encode_prompt): no BOS is added,
    # and its length is counted the same way
    templated = {"prompt": "1234567", "chat_templated": True}
    assert PromptFitter(tok, 7, "drop").encode(templated) == tok.encode("1234567", add_special_tokens=False)
    assert PromptFitter(tok, 7, "drop").fit([templated, {"prompt": "1234567"}], "data") == ([templated], 1)
    with pytest.raises(DataError, match=r"data: row 1 \(from 0\) has a prompt of 14 tokens"):
        PromptFitter(tok, 8, "error").fit(rows, "data")


def test_run_guard_stops_on_persistent_faults_only():
    from rl.config import FaultsConfig
    from rl.train.faults import FaultLog, RunGuard, RunStopped

    lines = []
    guard = RunGuard(
        FaultsConfig(max_nonfinite_steps=2, reward_error_share=0.5, reward_error_steps=3), FaultLog(lines.append)
    )
    ok = {"rewards/math/errors": 0.0, "rewards/math/timeouts": 0.0}
    half = {"rewards/math/errors": 8.0, "rewards/math/timeouts": 8.0}  # exactly the share: not over it
    most = {"rewards/judge/errors": 20.0, "rewards/judge/timeouts": 5.0}
    guard.check(1, True, ok, 32)
    guard.check(2, False, half, 32)  # a finite step resets the non-finite run
    guard.check(3, True, most, 32)
    with pytest.raises(RunStopped, match=r"not finite in 2 steps in a row \(steps 3-4"):
        guard.check(4, True, most, 32)
    guard = RunGuard(FaultsConfig(reward_error_share=0.5, reward_error_steps=3), FaultLog(lines.append))
    guard.check(1, False, most, 32)
    guard.check(2, False, most, 32)
    guard.check(3, False, ok, 32)  # one good step resets it
    guard.check(4, False, most, 32)
    guard.check(5, False, most, 32)
    with pytest.raises(RunStopped, match=r"reward 'judge' failed .* on 78% of the rows at step 6.*steps 4-6"):
        guard.check(6, False, most, 32)
    assert sum(x.startswith("fault: step") for x in lines) == 3  # one line per non-finite step


def test_run_guard_stops_when_every_update_is_partly_nonfinite():
    """An update with a non-finite optimizer step among applied ones is a new version, not a skip; a run of them
    still reaches faults.max_nonfinite_steps (before, each one reset the run and the job ran on forever)."""
    from rl.config import FaultsConfig
    from rl.train.faults import FaultLog, RunGuard, RunStopped

    guard = RunGuard(FaultsConfig(max_nonfinite_steps=3), FaultLog(lambda _: None))
    guard.check(1, False, {}, 8, partly=True)
    guard.check(2, False, {}, 8)  # a clean update resets the run
    guard.check(3, False, {}, 8, partly=True)
    guard.check(4, True, {}, 8)
    with pytest.raises(RunStopped, match=r"not finite in 3 steps in a row \(steps 3-5.*steps 3, 5 were skipped only"):
        guard.check(5, False, {}, 8, partly=True)


def test_run_guard_stops_after_steps_without_signal():
    """`nonfinite=None` is a step the learner skipped for want of signal; faults.max_no_signal_steps of them in a
    row stop the job, a trained step in between resets the count, and 0 turns the rule off."""
    from rl.config import FaultsConfig
    from rl.train.faults import FaultLog, RunGuard, RunStopped

    guard = RunGuard(FaultsConfig(max_no_signal_steps=3), FaultLog(lambda _: None))
    for step, nonfinite in [(1, None), (2, None), (3, False), (4, None), (5, None)]:
        guard.check(step, nonfinite, {}, 8)
    with pytest.raises(RunStopped, match=r"no reward signal in 3 steps in a row \(steps 4-6; faults.max_no_signal"):
        guard.check(6, None, {}, 8)
    off = RunGuard(FaultsConfig(max_no_signal_steps=0), FaultLog(lambda _: None))
    for step in range(1, 30):
        off.check(step, None, {}, 8)


def test_torch_backend_skips_a_nonfinite_step():
    import torch

    from rl.train.policy_update import TorchBackend

    model = torch.nn.Linear(3, 1)
    backend = TorchBackend(model, lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    backend.backward(model(torch.ones(1, 3)).sum() * float("nan"))
    norm = backend.step()
    assert norm != norm  # NaN, reported
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert not backend.optimizer.state and all(p.grad is None for p in model.parameters())
    backend.backward(model(torch.ones(1, 3)).sum())
    assert backend.step() == pytest.approx(2.0) and not torch.equal(before[0], model.weight)


def test_absurd_or_nonfinite_reward_counts_as_an_error():
    from rewards.base import RewardSet

    def scaled(prompts, completions, answers):
        return [1e9, float("inf"), 1.0]

    result = RewardSet([scaled], timeout_s=None)(["p"] * 3, ["c"] * 3, ["a"] * 3)
    assert result.rewards == [0.0, 0.0, 1.0] and result.metrics["rewards/scaled/errors"] == 2.0
    assert "absurd" in result.errors[0]
