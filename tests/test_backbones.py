"""Every supported backbone (Llama, Qwen2, Qwen3, Mistral) becomes an FBT by identity conversion that decodes
exactly like the stock model: through every estimator and decode mode, through the torch engine, and through the
vLLM plugin; a backbone that is not supported is refused by name, listing the supported ones. Tiny random models
built here (no downloads).

Tolerances as in tests/test_identity.py: 1e-5 against the backbone's own log-probs in torch (fp32 rounding of the
identity fusion, measured ≤ 2e-6), 1e-4 through vLLM (its CPU kernels' rounding, as in tests/test_vllm_engine.py),
and the same greedy tokens (the head is scaled up so that no near-tie can flip)."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from rl.backbones import FBT_ARCHITECTURE_OF
from rl.estimators.likelihood import get_estimator
from rl.model import FBT_CLASSES, as_standard_lm, convert_to_fbt
from rl.samples.batch import collate
from rl.samples.request import SamplingParams
from rollout.torch_engine import TorchEngine

TOL, VLLM_TOL = 1e-5, 1e-4
BOS, EOS, V = 1, 2, 97
BACKBONES = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {}),
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": None}),
}


def stock_model(kind: str, hidden: int = 64, seed: int = 0):
    """A random tiny stock model of `kind`; head_dim 32 at hidden 64 (vLLM's CPU attention needs >= 32)."""
    config_cls, model_cls, extra = BACKBONES[kind]
    torch.manual_seed(seed)
    cfg = config_cls(
        vocab_size=V,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1 if hidden == 64 else 2,
        head_dim=hidden // 2,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=0,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        **extra,
    )
    model = model_cls(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(5)  # wider logits: greedy decoding has no near-ties to flip on
    return model


def backbone_logprobs(stock, batch) -> torch.Tensor:
    with torch.no_grad():
        logits = stock(batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    lp = torch.log_softmax(logits, -1)
    pos = batch.response_positions()
    out = torch.gather(lp, 1, pos[..., None].expand(-1, -1, V)).gather(-1, batch.response_ids[..., None])[..., 0]
    return out * batch.response_mask


def test_every_supported_backbone_is_tested_here():
    assert sorted(FBT_CLASSES) == sorted(BACKBONES)
    # the names the checks before a job read without importing the classes
    assert {k: cls.__name__ for k, (_, cls) in FBT_CLASSES.items()} == FBT_ARCHITECTURE_OF


@pytest.mark.parametrize("kind", sorted(BACKBONES))
def test_identity_conversion_is_exact_through_every_estimator_and_the_torch_engine(kind):
    stock = stock_model(kind)
    fbt = convert_to_fbt(stock, "linear_addition", init="identity").eval()
    assert type(fbt).__name__ == f"FBT{type(stock).__name__}"
    prompts = [[BOS, 5, 9, 40], [BOS, 7, 3, 3, 60, 12, 90], [BOS, 11, 4]]
    params = SamplingParams(n=2, temperature=1.0, max_tokens=10, seed=1, decode_mode="soft", record_states=True)
    samples = TorchEngine(fbt, eos_token_ids=()).generate(prompts, params)
    batch = collate(samples, 0, with_states=True)
    ref = backbone_logprobs(stock, batch)
    worst = {}
    with torch.no_grad():
        for mode in ("standard", "soft", "fused"):
            for est in ("exact", "kpass", "replay") if mode != "standard" else ("standard",):
                worst[f"{mode}/{est}"] = float((get_estimator(est)(fbt, batch, mode).logprobs - ref).abs().max())
    assert max(worst.values()) < TOL, worst
    greedy = {m: SamplingParams(temperature=0.0, max_tokens=12, decode_mode=m) for m in ("standard", "soft", "fused")}
    theirs = TorchEngine(as_standard_lm(stock), eos_token_ids=()).generate(prompts, greedy["standard"])
    for mode in ("soft", "fused"):
        ours = TorchEngine(fbt, eos_token_ids=()).generate(prompts, greedy[mode])
        for a, b in zip(ours, theirs):
            assert a.response_ids == b.response_ids, (kind, mode)
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < TOL, (kind, mode)


@pytest.mark.parametrize("kind", ["qwen3", pytest.param("mistral", marks=pytest.mark.slow)])
def test_identity_conversion_in_vllm_equals_the_backbone(tmp_path, kind):
    """The plugin's class for the backbone (FBTQwen3ForCausalLM, FBTMistralForCausalLM) decodes the identity-
    converted checkpoint like the stock model, in soft and fused mode. (Llama and Qwen2: tests/test_identity.py,
    tests/test_vllm_engine.py.)"""
    pytest.importorskip("vllm")
    from rollout.vllm_engine import VLLMEngine

    stock = stock_model(kind, hidden=128)
    fbt_class = f"FBT{type(stock).__name__}"  # (as_standard_lm below changes the stock model's class)
    convert_to_fbt(stock, "linear_addition", init="identity").save_pretrained(tmp_path)
    prompts = [[BOS, 5, 9, 40], [BOS, 7, 3, 3, 60, 12, 90], [BOS] + list(range(10, 30))]
    ref = TorchEngine(as_standard_lm(stock), eos_token_ids=()).generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=16, decode_mode="standard")
    )
    engine = VLLMEngine(str(tmp_path), max_model_len=64, max_num_seqs=8, dtype="float32", seed=0, eos_token_ids=())
    try:
        assert engine.info["model_class"] == fbt_class
        for mode in ("soft", "fused"):
            out = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=16, decode_mode=mode))
            for a, b in zip(out, ref):
                assert a.response_ids == b.response_ids, mode
                assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < VLLM_TOL, mode
    finally:
        engine.close()


def test_an_unsupported_backbone_is_refused_by_name():
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=32, n_layer=1, n_head=2))
    with pytest.raises(ValueError, match=r"model_type 'gpt2' is not a supported backbone; supported: .*'qwen3'"):
        convert_to_fbt(gpt2, "linear_addition", init="identity")
