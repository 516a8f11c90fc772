"""Write a checkpoint's card (README.md) from what `fbrl pretrain` and `fbrl eval` left behind.

    .venv/bin/python scripts/make_card.py checkpoints/tiny-arith eval.json [--note "measured on ..."]

Reads `<ckpt>/training_summary.json` and `<ckpt>/pretrain_config.yaml` (written by `fbrl pretrain`) and an
`fbrl eval --json` file, and writes `<ckpt>/README.md`: config used, git commit, training time, per-pass
validation loss (with the pass-2 < pass-1 check), and the eval table for every decode mode evaluated.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

INTRO = (
    "A Llama-backbone full-bandwidth transformer (gate_product fusion, head_dim 64) trained from scratch with "
    "the multi-pass objective `L_1 + mean(L_2..L_K)` by `fbrl pretrain`. It half-solves the task on purpose: "
    "RL needs headroom. Load it with `AutoModelForCausalLM.from_pretrained` after `import rl.model`; the char-level "
    "tokenizer is saved alongside."
)


COMMAND = "fbrl pretrain configs/tiny_pretrain.yaml"


def card(ckpt: Path, ev: dict, note: str = "", intro: str = INTRO, command: str = COMMAND) -> str:
    s = json.loads((ckpt / "training_summary.json").read_text())
    cfg_text = (ckpt / "pretrain_config.yaml").read_text()
    size_mb = sum(f.stat().st_size for f in ckpt.iterdir() if f.is_file()) / 1e6
    val = s["final_val_loss_per_pass"]
    meta = ev["meta"]
    ks = list(next(iter(ev["modes"].values()))["pass_at_k"])
    lines = [
        f"# {ckpt.name}: tiny FBT model for the arithmetic task",
        "",
        intro,
        "",
        "## Training",
        "",
        f"- command: `{command}` (full config below)",
        f"- git commit of the code: `{s.get('git_commit')}`",
        f"- wall time: {s['wall_time_s'] / 60:.1f} min with {s['threads']} torch thread(s), "
        f"{s['steps_done']} steps, steps per K: {s['steps_per_k']}" + (f" — {note}" if note else ""),
        f"- size on disk: {size_mb:.1f} MB",
        "",
        "Validation loss per pass (response tokens, K passes, no jitter), through training:",
        "",
        "| step | " + " | ".join(f"pass {i + 1}" for i in range(len(val))) + " |",
        "|---|" + "---|" * len(val),
    ]
    for h in s["val_history"]:
        lines.append(f"| {h['step']} | " + " | ".join(f"{v:.4f}" for v in h["val"]) + " |")
    lines += [
        "",
        f"Final: pass-2 < pass-1 (the paper's health signal): **{'yes' if val[1] < val[0] else 'NO'}** "
        f"({val[1]:.4f} vs {val[0]:.4f}).",
        "",
        "## Evaluation",
        "",
        f"`fbrl eval --checkpoint {ckpt} --task arith --split {meta.get('split', 'test')} --n {meta['n']} "
        f"--decode-mode {' '.join(ev['modes'])} --samples {meta['samples']}` "
        f"(difficulty {meta.get('difficulty')}, temperature {meta['temperature']}, max_tokens "
        f"{meta['max_tokens']}, scorer `{meta['scorer']}`):",
        "",
        "| decode mode | greedy acc | sampled acc | "
        + " | ".join(f"pass@{k}" for k in ks)
        + " | mean len (greedy / sampled) | truncated (greedy / sampled) |",
        "|---|---|---|" + "---|" * len(ks) + "---|---|",
    ]
    for mode, m in ev["modes"].items():
        lines.append(
            f"| {mode} | {m['accuracy']['greedy']:.3f} | {m['accuracy']['sampled']:.3f} | "
            + " | ".join(f"{m['pass_at_k'][k]:.3f}" for k in ks)
            + f" | {m['mean_length']['greedy']:.1f} / {m['mean_length']['sampled']:.1f}"
            + f" | {m['truncation_rate']['greedy']:.3f} / {m['truncation_rate']['sampled']:.3f} |"
        )
    if ev.get("paired"):
        lines += ["", "Paired comparison (McNemar exact; a_only = problems only the first mode solves):", ""]
        for p in ev["paired"]:
            lines.append(
                f"- {p['a']} vs {p['b']} ({p['which']}): {p['a_only']} vs {p['b_only']}, p = {p['p_value']:.3g}"
            )
    lines += ["", "## Config used", "", "```yaml", cfg_text.rstrip(), "```", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("eval_json")
    ap.add_argument("--note", default="", help="appended to the wall-time line (e.g. machine load)")
    ap.add_argument("--intro", default=INTRO, help="the card's opening paragraph (what the model is)")
    ap.add_argument("--command", default=COMMAND, help="how it was trained")
    args = ap.parse_args(argv)
    ckpt = Path(args.checkpoint)
    (ckpt / "README.md").write_text(
        card(ckpt, json.loads(Path(args.eval_json).read_text()), args.note, args.intro, args.command)
    )
    print(f"wrote {ckpt / 'README.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
