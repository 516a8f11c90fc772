"""A synthetic GRPO batch and a random SmolLM2-shaped FBT, for timing the learner without an engine or a download.

    python -m bench.group_batch --out-dir runs/smollm_shape [--prompts 4] [--group 4] [--prompt-len 175]
        [--response-min 64] [--response-max 128] [--seed 0]

writes `OUT_DIR/model` (a random-weight Llama of SmolLM2-135M's shape — 30 layers, hidden 576, 9 heads / 3 KV heads,
intermediate 1536, vocab 49152, tied embeddings — converted to an FBT with the identity fusion) and
`OUT_DIR/batch.pt` (`save_samples`: `--prompts` distinct prompts of about `--prompt-len` tokens, each with `--group`
responses of `--response-min`..`--response-max` tokens, recorded states of the model's width, random advantages).
Speed does not depend on the weights or the tokens, so `bench.learner_speed --samples OUT_DIR/batch.pt --override
model.path=OUT_DIR/model` times the learner on the job's shapes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

SMOLLM2_SHAPE = dict(
    num_hidden_layers=30,
    hidden_size=576,
    num_attention_heads=9,
    num_key_value_heads=3,
    intermediate_size=1536,
    vocab_size=49152,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)


def smollm_shaped_fbt(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    from rl.model.conversion import convert_to_fbt

    torch.manual_seed(seed)
    base = LlamaForCausalLM(LlamaConfig(**SMOLLM2_SHAPE))
    return convert_to_fbt(base, "linear_addition", seed=seed, init="identity")


def group_samples(n_prompts, group, prompt_len, response_min, response_max, width, vocab, seed=0):
    from rl.samples.batch import Sample

    g = torch.Generator().manual_seed(seed)
    out = []
    for p in range(n_prompts):
        plen = prompt_len + int(torch.randint(-10, 11, (1,), generator=g))  # prompts of a few different lengths
        prompt = [1] + torch.randint(3, vocab, (plen - 1,), generator=g).tolist()
        for i in range(group):
            R = int(torch.randint(response_min, response_max + 1, (1,), generator=g))
            states = torch.nn.functional.normalize(torch.randn(R, width, generator=g), dim=-1) * width**0.5
            out.append(
                Sample(
                    prompt,
                    torch.randint(3, vocab, (R,), generator=g).tolist(),
                    (-torch.rand(R, generator=g)).tolist(),
                    "stop",
                    0,
                    states=states,
                    group_id=p,
                    sample_index=i,
                )
            )
    adv = torch.randn(len(out), generator=g).tolist()
    return out, adv


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=175)
    ap.add_argument("--response-min", type=int, default=64)
    ap.add_argument("--response-max", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from rl.samples.batch import save_samples

    out = Path(args.out_dir)
    model = smollm_shaped_fbt(args.seed)
    model.save_pretrained(str(out / "model"))
    samples, adv = group_samples(
        args.prompts,
        args.group,
        args.prompt_len,
        args.response_min,
        args.response_max,
        model.config.hidden_size,
        model.config.vocab_size,
        args.seed,
    )
    save_samples(samples, adv, str(out / "batch.pt"))
    tokens = sum(s.prompt_len + s.response_len for s in samples)
    resp = sum(s.response_len for s in samples)
    print(f"group_batch: {out}: {len(samples)} rows, {tokens} tokens ({tokens - resp} prompt + {resp} response)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
