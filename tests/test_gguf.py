"""`fbrl convert` from a GGUF file (llama.cpp's format).

A tiny random Llama and a tiny byte-level BPE tokenizer are written as an F32 GGUF file, the way llama.cpp's
converter lays them out (its q/k row permutation included). `--to hf` must give back the original weights bit
for bit, the same logits, no `quantization_config`, and the tokenizer; the default `--to fbt` must write an FBT
checkpoint; a missing file must be a clean error naming it. Needs the `gguf` extra; nothing is downloaded.
"""

import json

import pytest
import torch

gguf = pytest.importorskip("gguf")
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.convert_slow_tokenizer import bytes_to_unicode  # noqa: E402

from actors.cli import main  # noqa: E402

MERGES = ["h e", "l l", "he ll", "Ġ w", "o r", "Ġw or"]
EOS = "<|endoftext|>"


def tokens():
    """Every byte's symbol, then each merge's result, then one control token (the EOS)."""
    return list(bytes_to_unicode().values()) + [m.replace(" ", "") for m in MERGES] + [EOS]


def permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's q/k permutation (convert_hf_to_gguf.py, LlamaModel.permute); the loader undoes it."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model: LlamaForCausalLM, path) -> None:
    c = model.config
    vocab = tokens()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(len(vocab))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(vocab)
    w.add_token_types([1] * (len(vocab) - 1) + [3])  # 1 normal, 3 control
    w.add_token_merges(MERGES)
    w.add_eos_token_id(len(vocab) - 1)
    names = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    per_layer = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    for i in range(c.num_hidden_layers):
        names.update({f"model.layers.{i}.{hf}": f"blk.{i}.{g}" for hf, g in per_layer.items()})
    for key, t in model.state_dict().items():
        if key.endswith("q_proj.weight"):
            t = permute(t, c.num_attention_heads)
        elif key.endswith("k_proj.weight"):
            t = permute(t, c.num_key_value_heads)
        w.add_tensor(names[key.removesuffix(".weight")] + ".weight", t.contiguous().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture
def gguf_file(tmp_path):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokens()),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=2.0**-20,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    path = tmp_path / "tiny.gguf"
    write_gguf(model, path)
    return model, path


def test_gguf_to_hf_round_trips_weights_logits_and_tokenizer(gguf_file, tmp_path):
    model, path = gguf_file
    out = tmp_path / "hf"
    assert main(["convert", str(path), str(out), "--to", "hf"]) == 0
    back = AutoModelForCausalLM.from_pretrained(out, use_safetensors=True).eval()
    assert getattr(back.config, "quantization_config", None) is None
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    want, got = model.state_dict(), back.state_dict()
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key
    ids = torch.tensor([[1, 5, 100, len(tokens()) - 1, 42]])
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, model(ids).logits, atol=1e-5, rtol=0)
    text = "hello world"
    from_gguf = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    saved = AutoTokenizer.from_pretrained(out)
    assert saved(text)["input_ids"] == from_gguf(text)["input_ids"]
    assert len(saved(text)["input_ids"]) < len(text)  # the merges were applied


def test_gguf_to_fbt(gguf_file, tmp_path):
    _, path = gguf_file
    out = tmp_path / "fbt"
    assert main(["convert", str(path), str(out), "--init", "identity"]) == 0
    assert json.loads((out / "config.json").read_text())["model_type"].startswith("fbt_")


def test_missing_gguf_is_a_clean_error(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(SystemExit) as e:
        main(["convert", str(missing), str(tmp_path / "out"), "--to", "hf"])
    assert str(missing) in str(e.value.code)


def test_a_file_that_is_not_gguf_is_a_clean_error(tmp_path):
    bogus = tmp_path / "weights.gguf"
    bogus.write_bytes(b"PK\x03\x04 not a gguf file")
    with pytest.raises(SystemExit) as e:
        main(["convert", str(bogus), str(tmp_path / "out"), "--to", "hf"])
    assert str(bogus) in str(e.value.code) and "GGUF" in str(e.value.code)
