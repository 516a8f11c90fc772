"""Bad input through the real command: how fast `fbrl train` refuses it, and with what message.

    python -m bench.bad_input            # prints the markdown table of docs/RELIABILITY.md
    python -m bench.bad_input --only save_before --only keep_best    # the cases whose name holds a word

Each case runs `fbrl train ...` in a fresh process from a scratch directory and measures the wall time from
process start to its error line, and to its exit (Python's start and the imports included: that is what a user
waits). `fbrl train` starts Ray as soon as its config has loaded, beside the checks: a mistake the config itself
shows exits at once; one found by the later checks (files, tokenizer, data) prints its line at once, then waits
for that Ray to finish starting and stops it. Every case must exit with code 2, print one `fbrl train: error: ...`
line and nothing else, leave no Ray process running and create no run dir.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CASES = [  # (what the user got wrong, overrides; {d} is the scratch directory)
    ("negative step count", ["train.steps=-1"]),
    ("no prompts per step", ["train.prompts_per_step=0"]),
    ("no learner workers", ["learner.num_workers=0"]),
    ("misspelt key", ["train.stpes=3"]),
    ("missing checkpoint", ["model.path={d}/no-such-checkpoint"]),
    ("missing reward file", ["reward.fns=[{{fn: {d}/missing.py:score}}]"]),
    ("missing reward function", ["reward.fns=[{{fn: {d}/my_rewards.py:scor}}]"]),
    ("missing reward module", ["reward.fns=[{{fn: my_pkg.rewards:score}}]"]),
    ("missing data file", ["data.task=jsonl", "data.train_path={d}/missing.jsonl"]),
    ("data row without the prompt field", ["data.task=jsonl", "data.train_path={d}/nofield.jsonl"]),
    ("tokenizer bigger than the model's vocabulary", ["model.tokenizer={d}/bigtok"]),
    (
        "over-long prompt with data.overlong_prompts=error",
        ["data.task=jsonl", "data.train_path={d}/long.jsonl", "data.overlong_prompts=error"],
    ),
    ("max_tokens beyond the context", ["rollout.max_tokens=300"]),
    ("new run into a used run dir", ["train.run_dir={d}/used"]),
    ("--resume of a missing run dir", ["--resume", "{d}/missing-run"]),
    ("train.keep_best on a metric no row has", ["train.keep_best={{metric: eval/accuracy, n: 2}}"]),
    ("train.save_before unreadable", ["train.save_before=soon"]),
    ("train.save_before already past", ["train.save_before=2020-01-01T00:00:00Z"]),
    (
        "--resume of a 2-rank ZeRO-2 run with 1 learner rank",
        ["--resume", "{d}/two-ranks", "learner.num_workers=1"],
    ),
    ("empty data file", ["data.task=jsonl", "data.train_path={d}/empty.jsonl", "train.eval_every=0"]),
    ("corrupt parquet file", ["data.task=parquet", "data.train_path={d}/corrupt.parquet", "train.eval_every=0"]),
    ("--resume with a larger rollout.max_tokens", ["--resume", "{d}/one-step", "rollout.max_tokens=213"]),
]


class _TwoRanks:
    """What 2 DeepSpeed ZeRO-2 ranks write into a checkpoint: one optimizer partition each."""

    def save_checkpoint(self, directory):
        state = Path(directory) / "deepspeed" / "state"
        state.mkdir(parents=True)
        for name in ("mp_rank_00_model_states.pt", *(f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1))):
            (state / name).write_bytes(b"")


def make_inputs(d: Path) -> None:
    from rl.data.jsonl import write_jsonl
    from rl.data.tokenizer import ALPHABET, build_tokenizer

    (d / "my_rewards.py").write_text(
        "def score(prompts, completions, answers, **kw):\n    return [0.0] * len(completions)\n"
    )
    write_jsonl([{"prompt": "Q: 1+1=?", "answer": "2"}, {"question": "Q: 2+2=?", "answer": "4"}], d / "nofield.jsonl")
    write_jsonl(
        [{"prompt": "Q: 1+1=?", "answer": "2"}, {"prompt": "Q: " + "1+" * 200 + "1=?", "answer": "201"}],
        d / "long.jsonl",
    )
    build_tokenizer(alphabet=ALPHABET + "äöü").save_pretrained(str(d / "bigtok"))
    (d / "used").mkdir()
    (d / "used" / "metrics.jsonl").write_text('{"step": 1}\n')
    from rl.config import load_config
    from rl.train.run_dir import RunDir

    run = RunDir(str(d / "two-ranks"))
    run.write_config(load_config(None, ["learner.num_workers=2", "learner.zero_stage=2"]))
    run.save_checkpoint(1, _TwoRanks(), {"version": 1})
    (d / "empty.jsonl").write_text("")
    (d / "corrupt.parquet").write_bytes(b"PAR1 not really a parquet file PAR1")
    one_step(d / "one-step")


def one_step(path: Path) -> None:
    """A run of the default job with one checkpoint, its sampler over the rows that job keeps."""
    import json

    from rl.config import load_config
    from rl.data.loaders import load_task_split
    from rl.data.prompts import PromptFitter, prompt_token_limit
    from rl.data.tokenizer import load_tokenizer
    from rl.train.run_dir import RunDir

    cfg = load_config(None, [f"train.run_dir={path}"])
    fitter = PromptFitter(load_tokenizer(cfg.model.path), prompt_token_limit(cfg), cfg.data.overlong_prompts)
    rows, _ = fitter.fit(load_task_split(cfg.data, "train"), "train")
    RunDir(str(path)).write_config(cfg)
    ckpt = path / "checkpoints" / "step_000001"
    (ckpt / "learner").mkdir(parents=True)
    sampler = {"seed": cfg.train.seed, "epoch": 0, "pos": 4, "num_rows": len(rows), "shuffle": True}
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": 1, "version": 2, "sampler": sampler}))
    (path / "checkpoints" / "latest").write_text(ckpt.name)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", action="append", default=[], help="run the cases whose name holds this word")
    only = parser.parse_args(argv).only
    env = dict(
        os.environ,
        WANDB_MODE="disabled",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=str(ROOT),
    )
    failures = 0
    # Ray's files under a directory of this run's (short: its socket paths live there), so that a Ray process left
    # behind is recognisable by its command line
    ray_tmp = tempfile.mkdtemp(prefix="fbrl-bad-", dir="/tmp")
    env["RAY_TMPDIR"] = ray_tmp
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        make_inputs(d)
        print("| input | message (`fbrl train: error: ...`) | seconds until the error | until exit |")
        print("|---|---|---|---|")
        t0 = time.monotonic()  # the floor: starting Python and importing what `fbrl train` needs before any check
        subprocess.run([sys.executable, "-c", "import rl.config, transformers"], cwd=d, env=env, check=True)
        print(
            f"| (baseline: `python -c 'import rl.config, transformers'`, no check at all) | - | "
            f"{time.monotonic() - t0:.1f} | - |",
            flush=True,
        )
        for what, overrides in CASES:
            if only and not any(word in what for word in only):
                continue
            argv = [o.format(d=d) for o in overrides]
            if "--resume" not in argv and not any(a.startswith("train.run_dir=") for a in argv):
                argv.append(f"train.run_dir={d}/run")
            line_s, seconds, code, out, err = run_case(argv, d, env)
            message = err.strip().splitlines()[-1] if err.strip() else "(nothing on stderr)"
            ok = (
                code == 2
                and message.startswith("fbrl train: error: ")
                and len(err.strip().splitlines()) == 1
                and out == ""
                and not (d / "run").exists()
                and not ray_processes(ray_tmp)
            )
            failures += not ok
            shown = message.removeprefix("fbrl train: error: ").replace(tmp, "…").replace("|", "\\|")
            print(
                f"| {what} | {shown[:260]} | {line_s:.1f} | {seconds:.1f}{'' if ok else ' **(not refused as required)**'} |",
                flush=True,
            )
    shutil.rmtree(ray_tmp, ignore_errors=True)
    return 1 if failures else 0


def run_case(argv: list[str], cwd: Path, env: dict) -> tuple[float, float, int, str, str]:
    """`fbrl train ARGV`: (seconds until its first line on stderr, seconds until it exited, exit code, stdout,
    stderr)."""
    t0 = time.monotonic()
    p = subprocess.Popen(
        [sys.executable, "-m", "actors.cli", "train", *argv],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = p.stderr.readline()
    line_s = time.monotonic() - t0
    out, rest = p.communicate(timeout=600)
    return line_s, time.monotonic() - t0, p.returncode, out, first + rest


def ray_processes(ray_tmp: str, wait_s: float = 10.0) -> list[str]:
    """Command lines of the processes still alive, `wait_s` seconds at most after the driver exited, of a Ray whose
    files are under `ray_tmp` (Linux)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if ray_tmp in cmd:
                found.append(cmd)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
