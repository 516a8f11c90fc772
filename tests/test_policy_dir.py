"""RUN_DIR/policy/ taken away as the README shows: `AutoModelForCausalLM` / `AutoTokenizer` load it, a chat prompt
is rendered with its template, and `VLLMEngine` decodes it in soft mode — with the trained weights, not the
starting checkpoint's (greedy tokens equal to the torch engine's on the loaded model, different from the start's).

The policy is written the way a run writes it: the learner's weights file (`write_safetensors_atomic`) exported by
`RunDir.export_policy` beside the starting checkpoint's config and tokenizer (the committed tiny checkpoint, given
a ChatML template as SmolLM2's). The real model's command is in the README ("Take the policy away").
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import TINY_ARITH

import rl.model  # noqa: F401  (registers fbt_llama with the Auto classes)

TINY_ARITH = TINY_ARITH
CHATML = (
    "{% for m in messages %}<bos>{{ m['role'] }}\n{{ m['content'] }}<eos>\n{% endfor %}"
    "{% if add_generation_prompt %}<bos>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> tuple[Path, Path]:
    """(the starting checkpoint, RUN_DIR/policy after one "update" that moved every weight)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl.decode_modes import rl_modes
    from rl.model.files import write_safetensors_atomic
    from rl.train.run_dir import RunDir

    tmp = tmp_path_factory.mktemp("policy")
    start = tmp / "start"
    shutil.copytree(TINY_ARITH, start)
    tok = AutoTokenizer.from_pretrained(start)
    tok.chat_template = CHATML
    tok.save_pretrained(start)
    model = AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))  # the trained weights: every greedy continuation changes
    # named_parameters: a tied head is one tensor, as the learner exports it
    weights = write_safetensors_atomic(
        {k: v.detach().contiguous() for k, v in model.named_parameters()},
        str(tmp / "run" / "weights" / "policy.safetensors"),
    )
    run = RunDir(str(tmp / "run"))
    return start, run.export_policy(weights, start, None, rl_modes(str(start), "soft"))


def test_policy_loads_and_decodes_with_vllm_as_the_readme_shows(policy):
    pytest.importorskip("vllm")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl.samples.request import SamplingParams
    from rollout.torch_engine import TorchEngine
    from rollout.vllm_engine import VLLMEngine

    start, path = policy
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    assert type(model).__name__ == "FBTLlamaForCausalLM" and tok.chat_template == CHATML

    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "12+34="}], tokenize=False, add_generation_prompt=True
    )
    ids = tok.encode(prompt, add_special_tokens=False)
    params = SamplingParams(temperature=0, max_tokens=16, decode_mode="soft")
    engine = VLLMEngine(str(path), decode_mode="soft", max_model_len=128, max_num_seqs=4, dtype="float32")
    try:
        [out] = engine.generate([ids], params)
    finally:
        engine.close()
    assert out.response_ids and isinstance(tok.decode(out.response_ids, skip_special_tokens=True), str)
    [ref] = TorchEngine(model).generate([ids], params)
    assert out.response_ids == ref.response_ids  # vLLM decodes the exported weights...
    start_model = AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32).eval()
    [before] = TorchEngine(start_model).generate([ids], params)
    assert before.response_ids != out.response_ids  # ...not the starting checkpoint's


def test_streamed_safetensors_equal_safetensors_own_and_refuse_a_lying_header(tmp_path):
    """A LoRA learner's export is written one tensor at a time (rl/model/files.py) so a sync holds one merged
    layer, not the whole model: the file must read back as safetensors writes it, for every dtype and shape, and a
    tensor that differs from the header (or a header entry never written) leaves no file behind."""
    from safetensors.torch import load_file

    from rl.model.files import stream_safetensors_atomic

    g = torch.Generator().manual_seed(0)
    named = [
        ("a.weight", torch.randn(3, 5, generator=g)),
        ("b.bf16", torch.randn(7, generator=g).bfloat16()),
        ("c.ids", torch.arange(6, dtype=torch.int64).reshape(2, 3)),
        ("d.scalar", torch.tensor(2.5)),
        ("e.mask", torch.tensor([True, False, True])),
        ("f.view", torch.randn(4, 6, generator=g).t()),  # not contiguous
    ]
    meta = [(n, t.dtype, tuple(t.shape)) for n, t in named]
    path = stream_safetensors_atomic(meta, iter(named), str(tmp_path / "w.safetensors"))
    back = load_file(path)
    assert list(back) == [n for n, _ in named] or set(back) == {n for n, _ in named}
    assert all(torch.equal(back[n], t) and back[n].dtype == t.dtype for n, t in named)
    bad = [(n, t.float() if n == "b.bf16" else t) for n, t in named]
    with pytest.raises(ValueError, match="tensor b.bf16 torch.float32 .* does not match the header"):
        stream_safetensors_atomic(meta, iter(bad), str(tmp_path / "x.safetensors"))
    with pytest.raises(ValueError, match=r"tensors \['f.view'\] of the header were never written"):
        stream_safetensors_atomic(meta, iter(named[:-1]), str(tmp_path / "x.safetensors"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.safetensors"]
