"""Identity conversion (`convert_to_fbt(..., init="identity")`, `fbrl convert --init identity`): a stock
checkpoint becomes an FBT that decodes exactly like its backbone in every mode, and one update grows the latent
channel. Also the latent-channel metrics (rl/report/latent_metrics.py) at and away from the identity point.

The backbone is a random tiny Llama with the default initializer_range 0.02, so its embeddings' RMS is ~0.02: the
case where the fusion's RMS epsilons matter most (mean square 4e-4 against eps 1e-6).

Tolerance (fp32): with the identity epsilon (1e-12) the fused input is the embedding up to a few ulp (the three
RMS scalings are ~1 ± 1e-7 each), so the log-probs agree with the backbone's to rounding, measured ≤ 2e-6 here
(the exact recurrence reorders attention into L single-token steps: 1e-6-level differences on its own, as in
tests/test_model.py). TOL = 1e-5 keeps margin; the uncompensated epsilon (1e-6) gives ~5e-4 here, 50x over it.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import rl.model  # noqa: F401  (registers the Auto classes)
from rl.estimators.likelihood import get_estimator
from rl.model import IDENTITY_RMS_EPS, convert_to_fbt, identity_init_fusion
from rl.report.latent_metrics import latent_metrics, weight_norms
from rl.samples.batch import collate
from rl.samples.request import SamplingParams
from rollout.torch_engine import TorchEngine

TOL = 1e-5
BOS, EOS, V = 1, 2, 97
MODES = ("standard", "soft", "fused")


def stock_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=V,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=0,
        initializer_range=0.02,
    )
    return LlamaForCausalLM(cfg).eval()


def rollout_batch(model, n_prompts=3, new_tokens=10, seed=0):
    """Samples drawn from `model` by the torch engine in soft mode (states recorded), collated for the learner."""
    g = torch.Generator().manual_seed(seed)
    prompts = [[BOS] + torch.randint(3, V, (int(k),), generator=g).tolist() for k in (4, 7, 11)[:n_prompts]]
    params = SamplingParams(
        n=2, temperature=1.0, max_tokens=new_tokens, seed=seed, decode_mode="soft", record_states=True
    )
    samples = TorchEngine(model, eos_token_ids=()).generate(prompts, params)
    return samples, collate(samples, 0, with_states=True)


def stock_logprobs(stock, batch) -> torch.Tensor:
    with torch.no_grad():
        logits = stock(batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    lp = torch.log_softmax(logits, -1)
    pos = batch.response_positions()
    out = torch.gather(lp, 1, pos[..., None].expand(-1, -1, V)).gather(-1, batch.response_ids[..., None])[..., 0]
    return out * batch.response_mask


@pytest.fixture(scope="module")
def stock():
    return stock_llama()


@pytest.mark.parametrize("fusion_mode", ["linear_addition", "concat_projection"])
def test_identity_conversion_equals_backbone_in_every_decode_mode(stock, fusion_mode):
    fbt = convert_to_fbt(stock, fusion_mode, init="identity").eval()
    assert fbt.config.fbt_rms_eps == IDENTITY_RMS_EPS
    _, batch = rollout_batch(fbt)
    ref = stock_logprobs(stock, batch)
    worst = {}
    with torch.no_grad():
        for mode in MODES:
            for est in ("exact", "kpass", "replay") if mode != "standard" else ("standard",):
                lp = get_estimator(est)(fbt, batch, mode).logprobs
                worst[f"{mode}/{est}"] = float((lp - ref).abs().max())
    assert max(worst.values()) < TOL, worst


@pytest.mark.parametrize("mode", MODES)
def test_identity_conversion_decodes_like_the_backbone_in_the_engine(stock, mode):
    """The torch engine (token-side fusion tables, KV cache) samples the same tokens with the same log-probs."""
    fbt = convert_to_fbt(stock, "linear_addition", init="identity").eval()
    prompts = [[BOS, 5, 9, 40], [BOS, 7, 3, 3, 60, 12, 90]]
    params = SamplingParams(n=3, temperature=1.0, max_tokens=12, seed=3, decode_mode=mode)
    ours = TorchEngine(fbt, eos_token_ids=()).generate(prompts, params)
    params_std = SamplingParams(n=3, temperature=1.0, max_tokens=12, seed=3, decode_mode="standard")
    from rl.model import as_standard_lm

    theirs = TorchEngine(as_standard_lm(stock_llama()), eos_token_ids=()).generate(prompts, params_std)
    for a, b in zip(ours, theirs):
        assert a.response_ids == b.response_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < TOL


def test_default_epsilon_makes_the_identity_inexact_and_the_compensation_removes_it(stock):
    """The measurement behind IDENTITY_RMS_EPS: with the fusion's ordinary eps (1e-6) the fused input is
    e / sqrt(ms/(ms+eps) + eps) ≈ e·(1 + eps/(2 ms)), ~0.1% too large at RMS 0.02."""
    plain = convert_to_fbt(stock, "linear_addition", init="identity", fbt_rms_eps=1e-6).eval()
    exact = convert_to_fbt(stock, "linear_addition", init="identity").eval()
    _, batch = rollout_batch(exact)
    ref = stock_logprobs(stock, batch)
    with torch.no_grad():
        err_plain = float((get_estimator("exact")(plain, batch, "soft").logprobs - ref).abs().max())
        err_exact = float((get_estimator("exact")(exact, batch, "soft").logprobs - ref).abs().max())
        e = stock.model.embed_tokens.weight[1:]  # row 0 is the (zero) padding embedding
        ratio = (plain.fuse(torch.randn(V - 1, 64), e).norm(dim=-1) / e.norm(dim=-1)).mean()
    assert err_plain > 10 * TOL > 10 * err_exact, (err_plain, err_exact)
    assert 1.0005 < float(ratio) < 1.01  # the fused vector is longer than the embedding by eps/(2 ms)


def test_gate_product_has_no_identity_point(stock):
    with pytest.raises(ValueError, match="gate_product.*no identity point"):
        convert_to_fbt(stock, "gate_product", init="identity")
    fbt = convert_to_fbt(stock, "gate_product")
    with pytest.raises(ValueError, match="no identity point"):
        identity_init_fusion(fbt)


def test_one_sft_step_grows_the_latent_channel(stock):
    fbt = convert_to_fbt(stock, "linear_addition", init="identity")
    ids = torch.randint(3, V, (4, 16), generator=torch.Generator().manual_seed(0))
    ids[:, 0] = BOS
    out = fbt.multipass_forward(ids, 2)
    assert float((out.hidden[0] - out.hidden[1]).abs().max()) < TOL  # pass 2 == pass 1 at the identity point
    logits = fbt.logits_from_hidden(out.hidden[-1])
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
    loss.backward()
    grad = fbt.fusion.w_u.weight.grad
    assert grad is not None and float(grad.norm()) > 1e-6  # W_U = 0, but its gradient is not
    torch.optim.SGD(fbt.parameters(), lr=1.0).step()
    assert float(fbt.fusion.w_u.weight.norm()) > 0
    with torch.no_grad():  # feedback now changes the forward pass
        one, two = fbt.multipass_forward(ids, 2).hidden
    assert float((one - two).abs().max()) > 1e-4


def test_one_rl_step_grows_the_latent_channel_and_the_metrics_see_it(stock):
    from rl.config import Config
    from rl.train.policy_update import PolicyUpdater, TorchBackend

    fbt = convert_to_fbt(stock, "linear_addition", init="identity")
    samples, batch = rollout_batch(fbt.eval())
    before = latent_metrics(fbt, batch, "soft")
    assert before["w_state_norm"] == 0.0 and before["state_share"] == 0.0
    assert before["policy_shift"] < TOL and before["w_token_dev"] == 0.0
    cfg = Config()
    cfg.likelihood.estimator, cfg.rollout.max_tokens = "replay", 10
    updater = PolicyUpdater(fbt.train(), cfg, pad_id=0)
    adv = torch.linspace(-1, 1, len(samples)).tolist()
    updater.update(samples, adv, TorchBackend(fbt, lr=1e-2))
    fbt.eval()
    _, batch2 = rollout_batch(fbt, seed=1)
    after = latent_metrics(fbt, batch2, "soft")
    assert after["w_state_norm"] > 0 and after["state_share"] > 0, after
    assert after["policy_shift"] > 1e-4, after
    assert set(weight_norms(fbt)) == {"w_state_norm", "w_token_dev"}


def test_fbrl_convert_identity_and_eval_before_and_after(tmp_path):
    """`fbrl convert --init identity`, then `fbrl eval` on the stock checkpoint (standard) and on the converted one
    (every mode) give the same greedy results; a stock checkpoint refuses feedback modes with a clear error."""
    import json

    from actors.cli import main as fbrl
    from rl.data.tokenizer import build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    stock_dir, fbt_dir = tmp_path / "stock", tmp_path / "fbt"
    LlamaForCausalLM(cfg).save_pretrained(stock_dir)
    tok.save_pretrained(stock_dir)
    assert fbrl(["convert", str(stock_dir), str(fbt_dir), "--init", "identity"]) == 0
    assert json.loads((fbt_dir / "config.json").read_text())["fbt_fusion_mode"] == "linear_addition"
    common = [
        "--task",
        "word_problems",
        "--n",
        "6",
        "--max-tokens",
        "6",
        "--samples",
        "0",
        "--scorer",
        "plain",
        "--threads",
        "1",
    ]
    assert (
        fbrl(
            [
                "eval",
                "--checkpoint",
                str(stock_dir),
                "--decode-mode",
                "standard",
                *common,
                "--json",
                str(tmp_path / "stock.json"),
            ]
        )
        == 0
    )
    assert (
        fbrl(
            [
                "eval",
                "--checkpoint",
                str(fbt_dir),
                "--decode-mode",
                "standard",
                "soft",
                "fused",
                *common,
                "--json",
                str(tmp_path / "fbt.json"),
            ]
        )
        == 0
    )
    before = json.loads((tmp_path / "stock.json").read_text())["modes"]["standard"]
    after = json.loads((tmp_path / "fbt.json").read_text())
    for mode in MODES:
        assert after["modes"][mode]["accuracy"] == before["accuracy"]
        assert after["modes"][mode]["mean_length"] == before["mean_length"]
    assert all(p["a_only"] == p["b_only"] == 0 for p in after["paired"])
    with pytest.raises(SystemExit, match="not an FBT checkpoint"):
        fbrl(["eval", "--checkpoint", str(stock_dir), "--decode-mode", "soft", *common])
    with pytest.raises(SystemExit, match="no identity point"):
        fbrl(["convert", str(stock_dir), str(tmp_path / "gp"), "--init", "identity", "--fusion-mode", "gate_product"])


def test_run_dir_policy_is_a_loadable_save_pretrained_dir(stock, tmp_path):
    """RUN_DIR/policy/ from the learner's exported weights file: AutoModelForCausalLM loads the new weights."""
    from transformers import AutoModelForCausalLM

    from rl.data.tokenizer import build_tokenizer
    from rl.model.files import write_safetensors_atomic
    from rl.train.run_dir import RunDir

    start = tmp_path / "start"
    fbt = convert_to_fbt(stock, "linear_addition", init="identity")
    fbt.save_pretrained(start)
    build_tokenizer().save_pretrained(start)
    run = RunDir(str(tmp_path / "run"))
    for scale in (0.5, 0.25):  # the second export replaces the first
        with torch.no_grad():
            fbt.fusion.w_u.weight.fill_(scale)
        weights = write_safetensors_atomic(
            {k: v.detach() for k, v in fbt.named_parameters()}, str(run.path / "weights" / "policy.safetensors")
        )
        policy = run.export_policy(weights, start)
    loaded = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32).eval()
    assert torch.equal(loaded.fusion.w_u.weight, torch.full_like(loaded.fusion.w_u.weight, 0.25))
    ids = torch.tensor([[BOS, 5, 6, 7]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, fbt.eval()(ids).logits)
    assert (policy / "tokenizer.json").is_file() and not list(run.path.glob(".policy*"))


def test_latent_plot_has_a_panel_per_logged_metric(tmp_path):
    from rl.report.latent_metrics import plot_latent

    rows = [
        {"step": s, "learner/latent/w_state_norm": 0.01 * s, "learner/latent/policy_shift": 1e-3 * s}
        for s in range(1, 5)
    ]
    assert plot_latent(rows, tmp_path / "latent.png") and (tmp_path / "latent.png").stat().st_size > 1000
    assert not plot_latent([{"step": 1, "reward_mean": 0.5}], tmp_path / "none.png")


def test_identity_conversion_in_vllm_equals_the_backbone(tmp_path):
    """The vLLM plugin (token-side fusion tables with the checkpoint's epsilon) decodes an identity-converted
    model like the backbone: same greedy tokens, log-probs within vLLM's kernel rounding (1e-4, as in
    tests/test_vllm_engine.py), in soft and fused mode. head_dim 64: the CPU attention kernel needs it."""
    pytest.importorskip("vllm")
    from rl.model import as_standard_lm
    from rollout.vllm_engine import VLLMEngine

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=V,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=0,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    stock = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        stock.lm_head.weight.mul_(5)  # wider logits: no near-ties for greedy decoding to flip on
    convert_to_fbt(stock, "linear_addition", init="identity").save_pretrained(tmp_path)
    prompts = [[BOS, 5, 9, 40], [BOS, 7, 3, 3, 60, 12, 90], [BOS] + list(range(10, 30))]
    ref = TorchEngine(as_standard_lm(stock), eos_token_ids=()).generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=16, decode_mode="standard")
    )
    engine = VLLMEngine(str(tmp_path), max_model_len=64, max_num_seqs=8, dtype="float32", seed=0, eos_token_ids=())
    try:
        for mode in ("soft", "fused"):
            out = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=16, decode_mode=mode))
            for a, b in zip(out, ref):
                assert a.response_ids == b.response_ids, mode
                assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4, mode
    finally:
        engine.close()
