"""`fbrl compare-likelihood`'s comparison at a git revision and in the working tree, side by side, printed as JSON.

    python -m bench.compare_likelihood_speed [--checkpoint DIR] [--before REV] [--n-samples 32] [--max-tokens 128]
                                             [--max-passes 6] [--task arith] [--threads 1]

Rolls out `--n-samples` samples from the checkpoint as the command does (torch engine, soft mode, T = 1, states
recorded), then runs `compare_estimators` of git revision `--before` (loaded from the repository's history; by
default the last one whose soft passes ran over prompt and response, in rows of any length order; `--before
e313d44`: the one that re-ran every estimator to time it) and of the working tree on the same samples. Prints each one's CPU and wall seconds, the ratio, the rollout's time (the same for both: the command's
total is rollout + comparison), and the largest difference between the two reports' numbers other than times.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

from actors.cli.compare import _load, generate_rollouts, task_prompts
from rl.estimators import comparison
from rl.samples.batch import collate

REPO = Path(__file__).resolve().parents[1]
BEFORE = "081e084"  # the last revision whose soft passes ran over prompt and response, rows in any order


def module_at(rev: str, path: str, name: str) -> types.ModuleType:
    """The module `path` as it was at git revision `rev` (imports resolve against the working tree)."""
    try:
        source = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{rev}:{path}"], check=True, capture_output=True, text=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"--before {rev}: cannot read {path} from git ({e}); run from a git checkout") from None
    module = types.ModuleType(name)
    module.__file__ = f"{rev}:{path}"
    sys.modules[name] = module  # dataclasses resolve string annotations through the module's entry
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def largest_difference(a, b, path="") -> tuple[float, str]:
    """The largest |a - b| over the two reports' numbers, times excluded, and where it is."""
    if isinstance(a, dict):
        pairs = [(a[k], b[k], f"{path}.{k}") for k in a if "time" not in k]
    elif isinstance(a, list):
        pairs = [(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b, strict=True))]
    elif isinstance(a, (int, float)) and a is not None and b is not None:
        return abs(float(a) - float(b)), path
    else:
        return (0.0, path) if a == b else (float("inf"), path)
    return max((largest_difference(x, y, p) for x, y, p in pairs), default=(0.0, path))


def timed(fn):
    c, w = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - c, time.perf_counter() - w


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", default=str(REPO / "checkpoints" / "tiny-arith"))
    ap.add_argument("--before", default=BEFORE, help="git revision of the comparison to measure against")
    ap.add_argument("--n-samples", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-passes", type=int, default=6)
    ap.add_argument("--task", default="arith", help="prompt source, as `fbrl compare-likelihood --task`")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    before = module_at(args.before, "rl/estimators/comparison.py", "comparison_before")
    model, tokenizer = _load(args.checkpoint)
    cfg = model.config
    prompts = task_prompts(args.task, args.n_samples, tokenizer, cfg.vocab_size, cfg.bos_token_id, 0)
    samples, roll_cpu, roll_wall = timed(
        lambda: generate_rollouts(model, prompts, "soft", 1.0, args.max_tokens, 0, tokenizer)
    )
    pad = tokenizer.pad_token_id if tokenizer is not None and tokenizer.pad_token_id is not None else 0
    batch = collate(samples, pad_id=pad, with_states=True)
    run = lambda mod: mod.compare_estimators(model, batch, "soft", args.max_passes, 1.0, 8)
    old, old_cpu, old_wall = timed(lambda: run(before))
    new, new_cpu, new_wall = timed(lambda: run(comparison))
    diff, where = largest_difference(old, new)
    result = {
        "command": "python -m bench.compare_likelihood_speed " + " ".join(argv if argv is not None else sys.argv[1:]),
        "checkpoint": args.checkpoint,
        "threads": torch.get_num_threads(),
        "n_samples": len(samples),
        "n_tokens": new["n_tokens"],
        "rollout_s": {"cpu": round(roll_cpu, 1), "wall": round(roll_wall, 1)},
        "comparison_s": {
            "before": {"cpu": round(old_cpu, 1), "wall": round(old_wall, 1)},
            "after": {"cpu": round(new_cpu, 1), "wall": round(new_wall, 1)},
        },
        "speedup_cpu": round(old_cpu / new_cpu, 2),
        "speedup_wall": round(old_wall / new_wall, 2),
        "command_cpu_s_before_after": [round(roll_cpu + old_cpu, 1), round(roll_cpu + new_cpu, 1)],
        "largest_report_difference": {"value": diff, "at": where},
        "time_per_token_ms_before_after": {
            name: [round(o["time_per_token_ms"], 3), round(n["time_per_token_ms"], 3)]
            for name, o, n in [
                *((f"K={o['k']}", o, n) for o, n in zip(old["passes"], new["passes"])),
                ("replay", old["replay"], new["replay"]),
                ("standard", old["standard"], new["standard"]),
                ("exact", old["exact"], new["exact"]),
            ]
        },
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
