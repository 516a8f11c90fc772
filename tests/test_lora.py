"""LoRA learners (rl/model/lora_policy.py): peft adapters on the backbone, the fusion weights trained in full.

Model: a tiny random FBT Llama in fp32 (d=64, 2 layers) whose fusion value weights are scaled up so feedback
matters, and the torch engine's rollouts in every decode mode.

Tolerances.
- Adapters at peft's init (B = 0): each adapted layer computes W x + B (A x) · scale = W x + 0, and x + 0.0 is x in
  floating point, so the LoRA model's log-probs equal the base model's up to one thing: torch's CPU linear may take
  another kernel for a frozen weight (requires_grad False) on a strided input (the exact recurrence's carried
  state), which rounds differently. Measured: bit-equal in every case but one, which differs by 4.8e-7 = one fp32
  ulp of a log-prob of magnitude 4..8. REF_TOL = 1e-6 (two such ulps); a broken adapter or fusion path moves
  log-probs by > 1e-3. The merged weights at init are W + 0 = W, bit for bit.
- After training (B ≠ 0), the merged model computes (W + B A s) x where the LoRA model computes W x + B (A x) s:
  the same sums in another order, fp32 rounding of O(1e-7) relative per layer: log-probs agree within 1e-5
  (the estimators' TOL in tests/test_likelihood.py), while one step at lr 1e-2 moves them by > 1e-3.
"""

import pytest
import torch

import rl.model  # noqa: F401  (registers the FBT Auto classes)
from rl.config import ConfigError, load_config
from rl.estimators.likelihood import ESTIMATORS, get_estimator
from rl.model import FBTLlamaConfig, FBTLlamaForCausalLM
from rl.model.lora_policy import LoraPolicy, clean_name
from rl.samples.batch import collate
from rl.samples.request import SamplingParams
from rl.train.policy_update import PolicyUpdater, TorchBackend
from rollout.torch_engine import TorchEngine

MODES = ("standard", "soft", "fused")
TOL = 1e-5
REF_TOL = 1e-6


def tiny_model(seed=0):
    torch.manual_seed(seed)
    cfg = FBTLlamaConfig(
        vocab_size=101,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=True,
    )
    model = FBTLlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.fusion.w_u.weight.mul_(4.0)  # strong feedback: a broken fusion path shows in the log-probs
    return model


def lora_cfg(*overrides):
    return load_config(None, ["learner.lora={}", *overrides]).learner.lora


def wrapped(seed=0, *overrides) -> LoraPolicy:
    return LoraPolicy.wrap(tiny_model(seed), lora_cfg(*overrides))


def rollouts(mode, n=5):
    """Engine samples of the base model in `mode` (ragged prompts; two responses cut short), with states."""
    g = torch.Generator().manual_seed(1)
    prompts = [
        [1] + torch.randint(3, 101, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]
    samples = TorchEngine(tiny_model(), eos_token_ids=()).generate(
        prompts, SamplingParams(temperature=1.0, max_tokens=8, seed=3, decode_mode=mode, record_states=True)
    )
    for s, R in zip(samples[:2], (3, 6)):
        s.response_ids, s.logprobs, s.states = s.response_ids[:R], s.logprobs[:R], s.states[:R]
    return samples


def logprobs(model, samples, mode, name):
    with torch.no_grad():
        return get_estimator(name)(model, collate(samples, with_states=True), mode, passes=2).logprobs


# ---- config ---------------------------------------------------------------------------------------------------
def test_config_defaults_and_errors_name_the_key():
    assert load_config(None).learner.lora is None  # off by default: full fine-tuning
    c = lora_cfg()
    assert (c.rank, c.alpha, c.dropout, c.train_fusion) == (16, 32.0, 0.0, True)
    assert c.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    for override, key in (
        ("learner.lora.rank=0", "learner.lora.rank"),
        ("learner.lora.alpha=0", "learner.lora.alpha"),
        ("learner.lora.dropout=1.0", "learner.lora.dropout"),
        ("learner.lora.target_modules=[]", "learner.lora.target_modules"),
        ("learner.lora.target_modules=[fusion]", "learner.lora.target_modules"),
        ("learner.lora.ranks=4", "learner.lora.ranks"),
        ("learner.zero_stage=3", "learner.lora"),
    ):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            lora_cfg(override)
    with pytest.raises(ValueError, match=r"learner\.lora\.target_modules: \['qkv'\]"):
        wrapped(0, "learner.lora.target_modules=[qkv, q_proj]")


# ---- what trains ---------------------------------------------------------------------------------------------
def test_adapters_and_fusion_train_everything_else_is_frozen():
    lora = wrapped()
    trainable = {n for n, p in lora.model.named_parameters() if p.requires_grad}
    assert trainable and all(
        ".lora_A." in n or ".lora_B." in n or n.startswith("fusion.modules_to_save.") for n in trainable
    )
    assert {n for n in trainable if n.startswith("fusion.")} == {
        "fusion.modules_to_save.default.w_u.weight",
        "fusion.modules_to_save.default.w_g.weight",
    }
    # every default target of every layer is adapted
    assert sum(n.endswith("lora_A.default.weight") for n in trainable) == 7 * 2
    # A is drawn from the seed, whatever the process's RNG did before (ranks and rebuilt learners agree)
    model = tiny_model()
    torch.manual_seed(123)
    again = dict(LoraPolicy.wrap(model, lora_cfg()).model.named_parameters())
    assert all(torch.equal(p, again[n]) for n, p in lora.model.named_parameters())
    frozen_fusion = LoraPolicy.wrap(tiny_model(), lora_cfg("learner.lora.train_fusion=false"))
    assert not any(p.requires_grad for n, p in frozen_fusion.model.named_parameters() if "fusion" in n)
    assert clean_name("model.layers.0.mlp.up_proj.base_layer.weight") == "model.layers.0.mlp.up_proj.weight"
    assert clean_name("fusion.original_module.w_u.weight") == "fusion.w_u.weight"
    assert clean_name("model.layers.0.mlp.up_proj.lora_B.default.weight") is None


# ---- B = 0: the LoRA model is the base model -------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_at_init_every_estimator_equals_the_base_model_bit_for_bit(mode):
    base, lora = tiny_model(), wrapped()
    samples = rollouts(mode)
    for name in sorted(ESTIMATORS):
        want, got = logprobs(base, samples, mode, name), logprobs(lora.model, samples, mode, name)
        assert (got - want).abs().max() <= REF_TOL, (mode, name, float((got - want).abs().max()))
        with lora.reference():
            ref = logprobs(lora.model, samples, mode, name)
        assert (ref - want).abs().max() <= REF_TOL, (mode, name, float((ref - want).abs().max()))
    merged, plain = dict(lora.merged_tensors()), dict(base.named_parameters())
    assert list(merged) == list(plain)  # names and order of the base checkpoint
    assert all(torch.equal(merged[k], plain[k].detach()) for k in plain)


# ---- one update ------------------------------------------------------------------------------------------------
def lora_update(lora, samples, mode, estimator="replay", kl=0.0, lr=1e-2):
    cfg = load_config(
        None,
        [f"rollout.decode_mode={mode}", f"likelihood.estimator={estimator}", f"algo.kl_coef={kl}", "learner.lora={}"],
    )
    updater = PolicyUpdater(lora.model, cfg, 0, lora.model if kl else None, lora.reference)
    lora.model.train()
    adv = [1.0, -1.0, 0.5, -0.5, 1.0][: len(samples)]
    metrics = updater.update(samples, adv, TorchBackend(lora.model, lr))
    lora.model.eval()
    return metrics


@pytest.mark.parametrize("estimator", ["replay", "kpass", "exact", "standard"])
def test_after_an_update_the_merged_model_is_the_lora_model(estimator):
    """Every estimator trains the adapters and the fusion; the merged weights (what engines and RUN_DIR/policy
    receive) load into a plain FBT whose log-probs are the LoRA model's; untargeted weights are untouched."""
    mode = "standard" if estimator == "standard" else "soft"
    base, lora, samples = tiny_model(), wrapped(), rollouts(mode)
    lora_update(lora, samples, mode, estimator)
    merged = {k: v.clone() for k, v in lora.merged_tensors()}
    plain = dict(base.named_parameters())
    changed = {k for k in plain if not torch.equal(merged[k], plain[k].detach())}
    assert {k for k in changed if not k.startswith("fusion.")} == {
        f"model.layers.{i}.{m}.weight"
        for i in range(2)
        for m in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        )
    }
    assert (mode == "standard") or {"fusion.w_u.weight", "fusion.w_g.weight"} <= changed
    fresh = tiny_model()
    missing, unexpected = fresh.load_state_dict(merged, strict=False)
    assert missing == ["lm_head.weight"] and not unexpected  # tied to the embedding, stored once
    for name in ("exact", estimator):
        want, got = logprobs(lora.model, samples, mode, name), logprobs(fresh, samples, mode, name)
        assert (got - want).abs().max() < TOL
        assert (got - logprobs(base, samples, mode, name)).abs().max() > 100 * TOL  # the update moved them


def test_reference_is_the_base_model_with_the_adapters_off():
    """KL reference = the same module with the adapters off and the fusion's frozen original: after an update it
    still scores exactly as the starting model, while the policy has moved."""
    base, lora, samples = tiny_model(), wrapped(), rollouts("soft")
    m = lora_update(lora, samples, "soft", "exact", kl=0.1)  # policy and reference both scored exactly
    assert m["kl_loss"] == pytest.approx(0.0, abs=1e-9)  # first step: the policy is the reference
    m = lora_update(lora, samples, "soft", "exact", kl=0.1)
    assert m["kl_loss"] > 1e-6  # the updater scored the reference with the adapters off: the policy has left it
    want = logprobs(base, samples, "soft", "exact")
    with lora.reference():
        ref = logprobs(lora.model, samples, "soft", "exact")
    assert (ref - want).abs().max() <= REF_TOL
    assert (logprobs(lora.model, samples, "soft", "exact") - want).abs().max() > 100 * TOL


def test_adapter_directory_loads_with_peft(tmp_path):
    """The adapters in peft's format rebuild the trained model on the base checkpoint (fusion included)."""
    from peft import PeftModel

    lora, samples = wrapped(), rollouts("soft")
    lora_update(lora, samples, "soft")
    lora.save_adapter(str(tmp_path / "adapter"))
    peft_model = PeftModel.from_pretrained(tiny_model(), str(tmp_path / "adapter"))
    loaded = peft_model.get_base_model().eval()
    got, want = logprobs(loaded, samples, "soft", "exact"), logprobs(lora.model, samples, "soft", "exact")
    assert (got - want).abs().max() <= REF_TOL  # same values; loaded frozen (the kernel note above)
    assert (want - logprobs(tiny_model(), samples, "soft", "exact")).abs().max() > 100 * TOL
    # peft's own merge (docs/LORA.md's recipe) gives the merged tensors the learner exports
    merged, ours = dict(peft_model.merge_and_unload().named_parameters()), dict(lora.merged_tensors())
    assert set(merged) == set(ours) and max(float((merged[k] - ours[k]).abs().max()) for k in ours) < 1e-6


# ---- the DeepSpeed learner rank (ZeRO-2, world size 1) -------------------------------------------------------
LR = 1e-3


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_lora_fbt")
    tiny_model().save_pretrained(str(path))
    return str(path)


def rank_cfg(ckpt, *overrides):
    return load_config(
        None,
        [
            f"model.path={ckpt}",
            "rollout.engine=torch",
            f"learner.lr={LR}",
            "likelihood.estimator=replay",
            "learner.micro_batch_size=3",
            "learner.zero_stage=2",
            "learner.lora={}",
            "learner.lora.rank=4",
            *overrides,
        ],
    )


def synthetic_batch(n=9, seed=0, d=64):
    from rl.samples.batch import Sample

    g = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(n):
        P, R = int(torch.randint(3, 8, (1,), generator=g)), int(torch.randint(1, 10, (1,), generator=g))
        samples.append(
            Sample(
                [1] + torch.randint(4, 100, (P - 1,), generator=g).tolist(),
                torch.randint(4, 100, (R,), generator=g).tolist(),
                (-torch.rand(R, generator=g) * 4).tolist(),
                "stop",
                1,
                states=torch.randn(R, d, generator=g),
                group_id=i // 3,
                sample_index=i % 3,
            )
        )
    return samples, torch.randn(n, generator=g).tolist()


@pytest.mark.parametrize("zero", [2, 0])
def test_deepspeed_lora_rank_equals_torch_adamw_on_the_peft_model(tiny_ckpt, tmp_path, zero):
    """ZeRO-2 over the trainable parameters only, and one ZeRO-0 rank (the layout the project ships: DeepSpeed steps
    `ClippingAdamW`), with the KL reference = adapters off: the same step as plain torch AdamW on the same peft
    model (tolerances of tests/test_actors.py: grad norm rel 1e-5, weights LR/100)."""
    from safetensors.torch import load_file

    from actors.learner_rank import LearnerRank
    from rl.model.files import load_fbt

    cfg = rank_cfg(tiny_ckpt, "algo.kl_coef=0.05", "algo.ppo_epochs=2", f"learner.zero_stage={zero}")
    samples, adv = synthetic_batch()
    ref = LoraPolicy.wrap(load_fbt(tiny_ckpt), cfg.learner.lora, cfg.train.seed)
    ref.model.train()
    ref_m = PolicyUpdater(ref.model, cfg, 0, ref.model, ref.reference).update(samples, adv, TorchBackend(ref.model, LR))
    rank = LearnerRank(cfg)
    assert rank.updater.ref_model is rank.policy  # no second model
    m = rank.update(samples, adv)
    assert m["grad_norm"] == pytest.approx(ref_m["grad_norm"], rel=1e-5) and ref_m["grad_norm"] > 1e-3
    assert m["kl_loss"] == pytest.approx(ref_m["kl_loss"], rel=1e-4, abs=1e-9) and m["kl_loss"] > 0
    want, got = {k: v.clone() for k, v in ref.merged_tensors()}, rank.full_state()
    assert list(got) == list(want)
    assert max(float((got[k] - want[k]).abs().max()) for k in want) < LR / 100
    base = dict(load_fbt(tiny_ckpt).named_parameters())
    assert not torch.equal(got["fusion.w_u.weight"], base["fusion.w_u.weight"].detach())  # trained in full
    assert torch.equal(got["model.norm.weight"], base["model.norm.weight"].detach())  # frozen
    # the export and the checksums carry the merged weights under the checkpoint's names
    exported = load_file(rank.export_weights(str(tmp_path / "w.safetensors")))
    assert set(rank.weight_checksums()) == set(exported) == set(base)
    assert all(torch.equal(exported[k], got[k]) for k in got)
    rank.close()


@pytest.mark.parametrize("zero", [2, 0])
def test_deepspeed_lora_checkpoint_resume_is_exact(tiny_ckpt, tmp_path, zero):
    """Save after step 1, take step 2; a fresh LoRA rank (as a rebuilt learner is) that loads the checkpoint takes
    the identical step 2. The checkpoint's model/ is the merged model, adapter/ the peft adapters."""
    from peft import PeftModel

    from rl.model.files import load_fbt
    from tests.test_actors import step_save_step_resume

    cfg = rank_cfg(tiny_ckpt, f"learner.zero_stage={zero}")
    at_save, want, got = step_save_step_resume(cfg, *synthetic_batch(6, seed=1), tmp_path / "ckpt")
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert any(not torch.equal(want[k], at_save[k]) for k in want)
    saved = dict(load_fbt(str(tmp_path / "ckpt" / "model")).named_parameters())  # a plain, merged FBT
    assert set(saved) == set(at_save) and all(torch.equal(saved[k].detach(), at_save[k]) for k in at_save)
    adapted = PeftModel.from_pretrained(load_fbt(tiny_ckpt), str(tmp_path / "ckpt" / "adapter"))
    merged = dict(LoraPolicy(adapted).merged_tensors())
    assert max(float((merged[k] - at_save[k]).abs().max()) for k in at_save) < 1e-6
    # DeepSpeed's state holds what trains (adapters, fusion) and not a second copy of the frozen base
    from safetensors.torch import load_file

    ds_files = [p for p in (tmp_path / "ckpt" / "deepspeed").rglob("*") if p.is_file()]
    module = [p for p in ds_files if p.name.startswith("mp_rank_")]
    assert len(module) == 1
    held = torch.load(module[0], map_location="cpu", weights_only=False)["module"]
    frozen_kept = sorted(k for k in held if ".lora_" not in k and "modules_to_save" not in k)
    assert held and frozen_kept == ["policy.lm_head.weight"]  # only the tied alias, which DeepSpeed cannot tell
    base_bytes = sum(
        t.numel() * t.element_size() for t in load_file(str(tmp_path / "ckpt" / "model" / "model.safetensors")).values()
    )
    assert sum(p.stat().st_size for p in ds_files) < base_bytes


def test_torch_learner_lora_checkpoint_resume_is_exact(tiny_ckpt, tmp_path):
    """The same for the single-process torch learner: the adapters and Adam's state come back, the base is the
    starting checkpoint's."""
    from actors.local import TorchLearner

    cfg = rank_cfg(tiny_ckpt)
    samples, adv = synthetic_batch(6, seed=2)
    a = TorchLearner(cfg)
    a.update(samples, adv)
    a.save_checkpoint(str(tmp_path / "ckpt"))
    a.update(samples, adv)
    want = a.full_state()
    b = TorchLearner(cfg)
    b.load_checkpoint(str(tmp_path / "ckpt"))
    b.update(samples, adv)
    got = b.full_state()
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert (tmp_path / "ckpt" / "adapter" / "adapter_config.json").is_file()


# ---- fbrl pretrain with the same section -----------------------------------------------------------------------
def test_pretrain_trains_adapters_and_fusion_and_saves_merged_plus_adapter(tmp_path):
    """`fbrl pretrain learner.lora=...`: the saved checkpoint is the merged model (a plain FBT), its adapter/ holds
    peft's files; the embedding and norms are the starting model's, the adapted weights and the fusion moved."""
    import json

    from actors.cli import main
    from rl.model.files import load_fbt

    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(200)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    start = tmp_path / "start"
    tiny_model().save_pretrained(str(start))
    from rl.data.tokenizer import build_tokenizer

    build_tokenizer().save_pretrained(str(start))
    rc = main(
        [
            "pretrain",
            f"model.path={start}",
            "data.task=jsonl",
            f"data.train_path={tmp_path / 'd.jsonl'}",
            f"data.test_path={tmp_path / 'd.jsonl'}",
            "pretrain.steps=6",
            "pretrain.batch_size=8",
            "pretrain.seq_len=16",
            "pretrain.lr=1e-2",
            "pretrain.warmup=0",
            "pretrain.eval_every=6",
            "pretrain.val_batches=1",
            f"pretrain.out_dir={tmp_path / 'ckpt'}",
            "pretrain.threads=1",
            "pretrain.pass_schedule=[[0.5,1],[1.0,2]]",
            "logging.progress=false",
            "learner.lora={rank: 4, alpha: 8}",
        ]
    )
    assert rc == 0
    before, after = dict(tiny_model().named_parameters()), dict(load_fbt(str(tmp_path / "ckpt")).named_parameters())
    assert set(before) == set(after)
    same = {k for k in before if torch.equal(before[k], after[k])}
    assert {"model.embed_tokens.weight", "model.norm.weight"} <= same
    assert "model.layers.0.self_attn.q_proj.weight" not in same and "fusion.w_u.weight" not in same
    assert (tmp_path / "ckpt" / "adapter" / "adapter_model.safetensors").is_file()


# ---- engines receive the merged weights ------------------------------------------------------------------------
ALPHABET = "0123456789+-*/=()?., \\boxed{}Whatisnum\n"


@pytest.fixture(scope="module")
def engine_ckpt(tmp_path_factory):
    """A tiny FBT both engines serve (vLLM's CPU attention wants head_dim 64), with the char tokenizer."""
    from transformers import LlamaConfig

    from rl.data.tokenizer import build_tokenizer
    from rl.model import fbt_config_from

    path = tmp_path_factory.mktemp("tiny_lora_engine")
    tok = build_tokenizer(alphabet=ALPHABET)
    base = LlamaConfig(
        vocab_size=64,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = FBTLlamaForCausalLM(fbt_config_from(base, "gate_product"))
    with torch.no_grad():
        model.fusion.w_u.weight.mul_(4.0)
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return str(path)


@pytest.mark.parametrize("engine", ["torch", "vllm"])
def test_engines_serve_the_base_model_from_a_lora_learner_at_init(engine_ckpt, tmp_path, engine):
    """Adapters at init (B = 0): the merged weights a LoRA learner syncs are the base model's, so the engine's
    checksums are unchanged after the sync, it samples the same tokens with the same log-probs in every decode
    mode, and the learner's exact log-probs match the engine's (the torch engine within the estimators' 1e-5, vLLM
    within tests/test_vllm_engine.py's 1e-4)."""
    from actors.local import LocalLearner, LocalRollout
    from rl.samples.request import SamplingParams as Params

    cfg = rank_cfg(engine_ckpt, f"rollout.engine={engine}", "rollout.vllm.max_num_seqs=8", "likelihood.estimator=exact")
    rollout, learner = LocalRollout(cfg), LocalLearner(cfg, "deepspeed")
    before = rollout.weight_checksums()
    assert learner.weight_checksums() == pytest.approx(before, rel=1e-12)
    prompts = [[1, 5, 6, 7], [1, 8, 9], [1, 10, 11, 12, 13]]
    args = dict(n=2, temperature=1.0, max_tokens=6, stop_token_ids=(), seed=7, record_states=True)
    first = {m: rollout.generate(prompts, Params(decode_mode=m, **args), min_version=0) for m in MODES}
    assert rollout.load_weights(learner.export_weights(str(tmp_path / "w.safetensors")), 1) == [1]
    assert rollout.weight_checksums() == before
    tol = 1e-5 if engine == "torch" else 1e-4
    for mode in MODES:
        again = rollout.generate(prompts, Params(decode_mode=mode, **args), min_version=1)
        assert [s.response_ids for s in again] == [s.response_ids for s in first[mode]]
        assert [s.logprobs for s in again] == [s.logprobs for s in first[mode]]
        batch = collate(again, with_states=True)
        with torch.no_grad():
            lp = get_estimator("exact")(learner.rank.policy, batch, mode).logprobs
        engine_lp = batch.engine_logprobs * batch.response_mask
        assert ((lp - engine_lp) * batch.response_mask).abs().max() < tol, mode
    rollout.close()
    learner.close()


# ---- what leaves a bf16 learner, tied weights, metadata -------------------------------------------------------
def test_bf16_merge_keeps_a_small_update():
    """A bf16 base with adapter entries of ~1e-4 (a few Adam steps): the merge is done and sent in fp32, so it is
    W + B·A·s to fp32 rounding. Merged in bf16 (the old way) about half of the adapted elements came back equal to
    the base weight, and the merge error was ~0.5 of the update."""
    lora = LoraPolicy.wrap(tiny_model().to(torch.bfloat16), lora_cfg())
    with torch.no_grad():
        for name, p in lora.model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(0)) * 1e-4)
    adapted = lora._adapted()
    merged = dict(lora.merged_tensors())
    for name, layer in adapted.items():
        base = layer.get_base_layer().weight.detach().float()
        delta = (layer.lora_B["default"].weight.float() @ layer.lora_A["default"].weight.float()) * layer.scaling[
            "default"
        ]
        got = merged[name]
        assert got.dtype == torch.float32
        assert float((got - base - delta).norm() / delta.norm()) < 1e-3, name
        assert float((got == base).float().mean()) < 0.01, name
    meta = lora.metadata()
    assert meta == [(n, t.dtype, tuple(t.shape)) for n, t in merged.items()]
    assert {n for n, dtype, _ in meta if dtype == torch.float32} == set(adapted)


def test_tied_lm_head_is_refused_by_name():
    with pytest.raises(ValueError, match=r"learner\.lora\.target_modules: 'lm_head' is tied"):
        wrapped(0, "learner.lora.target_modules=[q_proj, lm_head]")


def test_lora_dropout_stays_out_of_the_scoring_passes():
    """With learner.lora.dropout > 0 the behaviour log-probs (old_logp: several updates per batch) and kpass's
    reconstruction passes run without dropout, so they are one value, not a draw: equal to the eval-mode ones."""
    lora = wrapped(0, "learner.lora.dropout=0.5")
    samples = rollouts("soft")
    lora_update(lora, samples, "soft", "exact")  # B != 0: dropout on the adapters' input now changes outputs
    cfg = load_config(None, ["rollout.decode_mode=soft", "learner.lora={dropout: 0.5}", "algo.ppo_epochs=2"])
    updater = PolicyUpdater(lora.model, cfg, 0)
    from rl.train.update_plan import plan_for

    plan = plan_for(samples, cfg, 1)
    adv = torch.zeros(len(samples))
    lora.model.eval()
    want = updater._rank_logprobs(samples, plan, 0, adv, 8, lora.model, updater.estimator, True)
    lora.model.train()
    for _ in range(2):
        got = updater._rank_logprobs(samples, plan, 0, adv, 8, lora.model, updater.estimator, True)
        assert torch.equal(got, want)
    assert lora.model.training  # the mode is restored
    ids = collate(samples).input_ids
    with torch.no_grad():
        lora.model.eval()
        first = lora.model.multipass_forward(ids, 2).hidden[0]
        lora.model.train()
        for _ in range(2):
            assert torch.equal(lora.model.multipass_forward(ids, 2, no_grad_until_last=True).hidden[0], first)
        assert not torch.equal(lora.model.multipass_forward(ids, 2).hidden[0], first)  # dropout is on in training


def test_load_adapter_refuses_an_incomplete_adapter(tmp_path):
    from safetensors.torch import load_file, save_file

    lora = wrapped()
    lora.save_adapter(str(tmp_path / "adapter"))
    other = wrapped()
    other.load_adapter(str(tmp_path / "adapter"))  # complete: loads
    path = tmp_path / "adapter" / "adapter_model.safetensors"
    full = load_file(str(path))
    for dropped in ("fusion", "layers.1.mlp.up_proj.lora_B"):  # peft itself loads a missing adapter silently
        save_file({k: v for k, v in full.items() if dropped not in k}, str(path))
        with pytest.raises(ValueError, match=f"missing .*{dropped}"):
            other.load_adapter(str(tmp_path / "adapter"))
