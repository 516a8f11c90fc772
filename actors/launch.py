"""`fbrl train CONFIG [key=value ...] [--resume RUN_DIR]` — launch a GRPO-style job.

With no `ray.address` a private local Ray is started (dashboard off, loopback only, a token per run); on a cluster
submit with `ray job submit --address ... --working-dir . -- fbrl train configs/<config>.yaml` (docs/CLUSTER.md). `--no-ray` runs the
same loop with in-process workers, for debugging. With no CONFIG the embedded default (configs/tiny.yaml) runs.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "tiny.yaml"


def add_arguments(p) -> None:
    p.add_argument("config", nargs="?", default=None, help="YAML config (default: the embedded tiny job)")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. train.steps=4")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    p.add_argument("--no-ray", action="store_true", help="in-process workers instead of Ray actors")


def _environment(cfg) -> None:
    # Set before anything imports wandb / vllm / ray: these are read at import or process start.
    os.environ.setdefault("WANDB_MODE", cfg.logging.wandb_mode)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def run(args) -> int:
    from rl.config import load_config
    from rl.data.tokenizer import load_tokenizer
    from rl.loop import train
    from rl.run import RunDir

    config_path = args.config or str(DEFAULT_CONFIG)
    if args.config and "=" in args.config and not Path(args.config).exists():  # `fbrl train key=value`
        args.overrides.insert(0, args.config)
        config_path = str(DEFAULT_CONFIG)
    # `run_dir=PATH` is the documented shorthand for `train.run_dir=PATH`
    overrides = [f"train.{o}" if o.startswith("run_dir=") else o for o in args.overrides]
    if args.resume:
        overrides += [f"train.resume={args.resume}", f"train.run_dir={args.resume}"]
    cfg = load_config(config_path, overrides)
    _environment(cfg)
    run_dir = RunDir(cfg.train.run_dir)
    print(f"fbrl train: config {config_path}, run dir {run_dir.path}", flush=True)
    if cfg.train.resume:  # refuse a changed experiment before starting any worker
        run_dir.check_resume_config(cfg)

    from actors.placement import build_workers
    t_start = time.perf_counter()
    rollout, learner, rewards = build_workers(cfg, use_ray=not args.no_ray)
    tokenizer = load_tokenizer(cfg.model.tokenizer or cfg.model.path)
    wandb_run = _wandb(cfg, run_dir)
    bar = _progress(cfg)

    def on_step(metrics):
        if wandb_run is not None:
            wandb_run.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=metrics["step"])
        if bar is not None:
            bar.update(1)

    log = bar.write if bar is not None else print
    try:
        train(cfg, tokenizer, rollout, learner, rewards, run_dir, log=log, progress=on_step)
    finally:
        if bar is not None:
            bar.close()
        if wandb_run is not None:
            wandb_run.finish()
        _shutdown(args.no_ray)
    plots = run_dir.plot()
    evals = [r for r in run_dir.read_metrics() if r.get("eval_accuracy") is not None]
    print(f"\nfinished in {time.perf_counter() - t_start:.0f}s")
    if len(evals) >= 2:
        first, last = evals[0], evals[-1]
        print(f"held-out greedy accuracy: step {first['step']} {first['eval_accuracy']:.3f} -> "
              f"step {last['step']} {last['eval_accuracy']:.3f} "
              f"({100 * (last['eval_accuracy'] - first['eval_accuracy']):+.1f} points)")
    print(f"metrics: {run_dir.path / 'metrics.jsonl'}")
    for p in plots:
        print(f"plot:    {p}")
    return 0


def _wandb(cfg, run_dir):
    if cfg.logging.wandb_mode == "disabled":
        return None
    import wandb
    return wandb.init(project=cfg.logging.wandb_project, entity=cfg.logging.wandb_entity,
                      mode=cfg.logging.wandb_mode, dir=str(run_dir.path), config=cfg.to_dict(),
                      resume="allow" if cfg.train.resume else None, name=run_dir.path.name)


def _progress(cfg):
    if not cfg.logging.progress:
        return None
    from tqdm import tqdm
    return tqdm(total=cfg.train.steps, desc="steps", unit="step", file=sys.stderr, dynamic_ncols=True)


def _shutdown(no_ray: bool) -> None:
    if no_ray:
        return
    import ray
    if ray.is_initialized():
        ray.shutdown()
