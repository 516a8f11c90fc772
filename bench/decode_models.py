"""The models the decode benchmarks run (bench/decode.py, bench/shared_kv_attention.py, tools/gpu/): the tiny
default (its checkpoint when trained, else random weights of its shape) and random FBTs of SmolLM2-135M's shape,
with random prompts; and the FLOP model of one decode token, against which the latent feedback's measured cost is
compared.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from rl.model import convert_to_fbt

REPO = Path(__file__).resolve().parents[1]
TINY_CKPT = REPO / "checkpoints" / "tiny-arith"


@dataclass
class Setup:
    name: str
    model: torch.nn.Module
    prompts: list[list[int]]
    new_tokens: int
    note: str = ""


# ---- models -----------------------------------------------------------------------------------------------
def random_fbt(**shape) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = LlamaConfig(tie_word_embeddings=True, bos_token_id=1, eos_token_id=None, pad_token_id=0, **shape)
    return convert_to_fbt(LlamaForCausalLM(cfg)).eval()


def random_prompts(vocab: int, batch: int, lo: int, hi: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    lens = torch.randint(lo, hi + 1, (batch,), generator=g).tolist()
    return [[1] + torch.randint(4, vocab, (n - 1,), generator=g).tolist() for n in lens]


def tiny_setup() -> Setup:
    if (TINY_CKPT / "config.json").exists():
        model, note = AutoModelForCausalLM.from_pretrained(str(TINY_CKPT), dtype=torch.float32).eval(), str(TINY_CKPT)
    else:
        # the tiny default's shape (rl/config/pretrain.py ModelInitConfig); vocab = the character tokenizer's 101 ids
        model = random_fbt(
            hidden_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            intermediate_size=512,
            vocab_size=101,
            max_position_embeddings=256,
        )
        note = "random weights, tiny-arith shape (checkpoint not found)"
    return Setup("tiny", model, random_prompts(model.config.vocab_size, 64, 8, 24), 64, note)


def smollm_setup() -> Setup:
    model = random_fbt(
        hidden_size=576,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        intermediate_size=1536,
        vocab_size=49152,
        max_position_embeddings=2048,
    )
    return Setup("135m", model, random_prompts(49152, 64, 4, 12), 16, "random weights, SmolLM2-135M shape")


MODELS = {"tiny": tiny_setup, "135m": smollm_setup}


# ---- FLOP model ---------------------------------------------------------------------------------------------
def flops_per_decode_token(cfg, context: float) -> float:
    """Forward FLOPs (2 per multiply-add) of one decode token attending to `context` positions."""
    d, hd = cfg.hidden_size, getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    proj = d * q + 2 * d * kv + q * d + 3 * d * cfg.intermediate_size
    attn = 2 * cfg.num_attention_heads * hd * context  # q·K and p·V
    return 2 * (cfg.num_hidden_layers * (proj + attn) + d * cfg.vocab_size)


def fusion_flops_per_token(cfg) -> float:
    return 2 * 2 * cfg.hidden_size**2  # two d×d matmuls (concat_projection: one d×2d, the same)
