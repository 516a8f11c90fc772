"""What run_trl.py measures of TRL's run with fbrl's own code: the held-out greedy eval (`greedy_eval`, scored by
fbrl's math reward as fbrl's eval scores it) and the step-1 gradient check (`check_gradient`: fbrl's learner on
TRL's own samples, from the same starting weights, against TRL's gradient).

run_trl.py imports this module after torch (its thread settings come first).
"""

from __future__ import annotations

import time

import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from rl.data import arith
from rl.data.loaders import reward_columns


# ---- held-out greedy eval (rl/loop.py `evaluate`: every eval row, greedy, max_tokens, stop at EOS)
@torch.no_grad()
def greedy_eval(m, eval_rows, fitter, tok, scorer, cfg, batch_size: int = 0) -> dict:
    """`m`'s greedy accuracy on `eval_rows` (transformers `generate`, do_sample=False, max_new_tokens =
    rollout.max_tokens, stop at EOS), scored by `scorer` (fbrl's math reward); `batch_size` rows at a time (0: all
    at once, like fbrl's loop eval)."""
    t0 = time.perf_counter()
    eos_ids = {tok.eos_token_id}
    was_training = m.training
    m.eval()
    gen = GenerationConfig(
        do_sample=False,
        max_new_tokens=cfg.rollout.max_tokens,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
    )
    bs = batch_size or len(eval_rows)
    texts, reasons, lengths = [], [], []
    for i in range(0, len(eval_rows), bs):
        ids = [fitter.encode(r) for r in eval_rows[i : i + bs]]
        P = max(map(len, ids))
        inp = torch.tensor([[tok.pad_token_id] * (P - len(x)) + x for x in ids])
        am = torch.tensor([[0] * (P - len(x)) + [1] * len(x) for x in ids])
        out = m.generate(input_ids=inp, attention_mask=am, generation_config=gen)[:, P:].tolist()
        for row in out:
            cut = next((j + 1 for j, t in enumerate(row) if t in eos_ids), None)
            resp = row[:cut] if cut else row[: cfg.rollout.max_tokens]
            reasons.append("stop" if cut else "length")
            lengths.append(len(resp))
            texts.append(tok.decode(resp, skip_special_tokens=True))
    golds = [r["answer"] for r in eval_rows]
    scores = scorer([r["prompt"] for r in eval_rows], texts, golds, finish_reasons=reasons, **reward_columns(eval_rows))
    correct = [s >= 1.0 for s in scores]
    agree = None
    if cfg.data.task == "arith":
        # fbrl's strict math reward and the task's own rule (rl/data/arith.py `score`) must agree row by row
        own = [arith.score(t, g) >= 1.0 and rs != "length" for t, g, rs in zip(texts, golds, reasons)]
        agree = sum(a == b for a, b in zip(correct, own))
    m.train(was_training)
    return {
        "accuracy": sum(correct) / len(correct),
        "n": len(correct),
        "mean_len": sum(lengths) / len(lengths),
        "truncated": reasons.count("length") / len(reasons),
        "scorer_agreement": agree,
        "time_s": time.perf_counter() - t0,
    }


def eval_agreement(ev) -> str:
    """How far the eval's two scorers agree, for the eval line."""
    if ev["scorer_agreement"] is None:  # word problems: the math reward is the task's check (no second rule)
        return "the math reward is the task's check"
    return f"fbrl math vs arith.score agree on {ev['scorer_agreement']}/{ev['n']}"


# ---- the step-1 gradient check
class GradientCapture:  # rl.train.policy_update.Backend that keeps the accumulated gradient instead of stepping
    world_size = 1

    def __init__(self, m):
        self.m, self.g = m, None

    def backward(self, loss):
        loss.backward()

    def step(self):
        self.g = (
            torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in self.m.parameters()])
            .detach()
            .clone()
        )
        self.m.zero_grad(set_to_none=True)
        return float(self.g.norm())


def check_gradient(trl_grad: dict, model_dir: str, first_batch: dict, tok, chat: bool, cfg) -> dict:
    """fbrl's learner (rl.train.policy_update.PolicyUpdater, standard estimator, its advantages and loss aggregation) on TRL's
    step-1 samples (`first_batch`), from the same starting weights (`model_dir`): its gradient should be TRL's
    (`trl_grad["g"]`, before clipping; cosine ~1, norm ratio ~1). Prints the comparison and returns its figures
    (nothing when no TRL gradient was captured)."""
    if "g" not in trl_grad:
        print("trl gradient check: skipped (no gradient clipping, so no pre-clip gradient was captured)")
        return {}
    from rl import algos
    from rl.samples.batch import Sample
    from rl.train.policy_update import PolicyUpdater

    G = cfg.rollout.n_samples_per_prompt
    fresh = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    fb = first_batch
    ids = [tok.encode(p, add_special_tokens=not chat) for p in fb["prompts"]]  # fbrl's encode_prompt
    samples = [
        Sample(p, c, [0.0] * len(c), rs, 0, group_id=i // G, sample_index=i % G, decode_mode="standard")
        for i, (p, c, rs) in enumerate(zip(ids, fb["completion_ids"], fb["reasons"]))
    ]
    adv = algos.compute_advantages(
        torch.tensor(fb["scores"]),
        torch.tensor([s.group_id for s in samples]),
        cfg.algo.adv_estimator,
        cfg.algo.adv_eps,
    )
    backend = GradientCapture(fresh)
    PolicyUpdater(fresh, cfg, pad_id=tok.pad_token_id).update(samples, adv.tolist(), backend)
    g_trl, g_fbrl = trl_grad["g"].double(), backend.g.double()
    cos = float(torch.dot(g_trl, g_fbrl) / (g_trl.norm() * g_fbrl.norm()))
    check = dict(
        cosine=cos,
        norm_trl=float(g_trl.norm()),
        norm_fbrl=float(g_fbrl.norm()),
        max_abs_diff=float((g_trl - g_fbrl).abs().max()),
        rows=len(samples),
    )
    print(
        f"trl gradient check (step 1, TRL's {len(samples)} samples): fbrl learner vs TRL GRPOTrainer "
        f"gradient cosine {cos:.6f}, norm {check['norm_fbrl']:.5f} vs {check['norm_trl']:.5f}"
        f" (ratio {check['norm_fbrl'] / check['norm_trl']:.5f}), max |diff| "
        f"{check['max_abs_diff']:.2e}",
        flush=True,
    )
    return check
