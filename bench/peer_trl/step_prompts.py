"""Each training step's prompts as fbrl's loop draws them, with their token counts (for the learner's tokens/s).

    <checkout>/.venv/bin/python step_prompts.py --config CONFIG --out RUN/step_prompts.json [fbrl overrides...]

Replays rl/loop.py's data path without running anything else: `load_task_split(data, "train")` ->
`PromptFitter.fit` (the engine's prompt limit, data.overlong_prompts) -> `PromptSampler(seed=train.seed)`, then
`train.prompts_per_step` rows per step for `train.steps` steps. Writes one entry per step: the prompts' digest
(fbrl's `prompts_digest`, so a run's metrics.jsonl can be matched step by step), each prompt's token count as
fbrl encodes it (`fitter.encode`: chat-templated rows without added special tokens), G, and the step's prompt
tokens over all G samples (what the learner's forward sees besides the responses). Works in fbrl's venv or in
the TRL venv with fbrl's source on PYTHONPATH (tokenizer, config and data code only).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    import rl  # noqa: F401  (AutoConfig must know the FBT configs: prompt_token_limit reads the model's)
    from rl.config import load_config
    from rl.data.loaders import PromptSampler, load_task_split
    from rl.data.prompts import PromptFitter, prompt_token_limit

    cfg = load_config(args.config, args.overrides)
    tok = AutoTokenizer.from_pretrained(cfg.model.tokenizer or cfg.model.path)
    fitter = PromptFitter(tok, prompt_token_limit(cfg), cfg.data.overlong_prompts)
    rows, _ = fitter.fit(load_task_split(cfg.data, "train", tokenizer=tok), "train data")
    sampler = PromptSampler(rows, seed=cfg.train.seed)
    G = cfg.rollout.n_samples_per_prompt
    out = []
    for step in range(1, cfg.train.steps + 1):
        batch = sampler.next(cfg.train.prompts_per_step)
        lens = [len(fitter.encode(r)) for r in batch]
        out.append(
            {
                "step": step,
                "digest": hashlib.sha256("\x00".join(r["prompt"] for r in batch).encode()).hexdigest()[:16],
                "prompt_lens": lens,
                "G": G,
                "prompt_tokens": G * sum(lens),
            }
        )
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(
        f"step_prompts: {len(out)} steps x {cfg.train.prompts_per_step} prompts x G={G}; prompt tokens per step "
        f"{min(s['prompt_tokens'] for s in out)}-{max(s['prompt_tokens'] for s in out)} -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
