"""`fbrl pretrain CONFIG [key=value ...]`: multi-pass pretraining or SFT (rl/pretrain/trainer.py), and what it
prints at the end: the validation loss per pass, the health signal, where the checkpoint is."""

from __future__ import annotations

from pathlib import Path


def add_arguments(parser) -> None:
    parser.add_argument("config", nargs="?", default=None, help="YAML config (default: built-in defaults)")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. pretrain.steps=100")


def run(args) -> int:
    config, overrides = args.config, list(args.overrides)
    if config is not None and "=" in config and not Path(config).is_file():
        config, overrides = None, [config] + overrides  # `fbrl pretrain key=value ...`: defaults + overrides
    from rl.config import load_config
    from rl.pretrain.trainer import train

    cfg = load_config(config, overrides)
    summary = train(cfg)
    val = summary["final_val_loss_per_pass"]
    print("final validation loss per pass: " + ", ".join(f"pass {i + 1}: {v:.4f}" for i, v in enumerate(val)))
    print(
        f"pass-2 < pass-1 (feedback helps, the paper's health signal): "
        f"{'yes' if summary['pass2_below_pass1'] else 'NO'} "
        f"({val[1] - val[0]:+.4f})"
        if len(val) > 1
        else ""
    )
    if summary["final_val_loss_exact"] is not None:
        print(f"exact recurrence (what soft decoding sees): {summary['final_val_loss_exact']:.4f}")
    print(
        f"checkpoint: {cfg.pretrain.out_dir}  wall time: {summary['wall_time_s']:.0f}s  "
        f"cpu time: {summary['cpu_time_s']:.0f}s ({cfg.pretrain.threads} threads)"
    )
    return 0
