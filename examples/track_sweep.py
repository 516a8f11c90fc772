"""Pilot sweep on the state-tracking tasks: can a tiny FBT learn a running state, and does it beat the same model
run as a standard transformer? Teacher-forced answer-token accuracy by chain length, in one process.

    python -m examples.track_sweep '[{"task": "cups", "mode": "exact", "lengths": [1, 8], "d": 128, "lr": 0.002,
                                   "steps": 3000}, {"task": "cups", "mode": "plain", "lengths": [1, 8], ...}]'

Each spec trains a fresh Llama-backbone model (`layers` x `d`, head_dim 64, 1 thread, batch 32, AdamW, linear
warm-up 50 steps then constant lr) on `task`'s train split with chain lengths `lengths[0]..lengths[1]`:
- mode `exact`: the FBT's exact recurrence with feedback on the response (`rl.pretrain.trainer.exact_loss`, BPTT), i.e.
  what soft decoding computes; evaluated the same way;
- mode `plain`: one pass without feedback (`multipass_loss` with K = 1): a standard transformer of the same size.
Every `every` steps it prints the last batch loss and, per chain length in `eval_lengths`, the fraction of 200
val problems whose answer token is the argmax given the (teacher-forced) echo. That isolates the state from
decoding: the echo is given, only the final `=cup` needs the state. `init: "irnn"` starts a linear_addition
fusion with W_U = I, W_T = wt * I (the state carried as is); the default is the model's random init.

This is the quick probe behind docs/BENCHMARKS.md's state-tracking section (the full pipeline is `fbrl pretrain`
+ `fbrl eval --baseline`); it is not part of the package.
"""

from __future__ import annotations

import json
import random
import sys
import time

import torch

import rl.pretrain.trainer as P
from rl.config import load_config
from rl.data import track


def run(
    task,
    mode,
    lengths,
    fusion="linear_addition",
    layers=2,
    d=64,
    steps=600,
    lr=3e-3,
    seed=0,
    eval_lengths=(3, 4, 6, 8, 10, 12),
    every=500,
    init="random",
    wt=1.0,
):
    if mode not in ("exact", "plain"):
        raise ValueError(f"mode: expected 'exact' or 'plain', got {mode!r}")
    cfg = load_config(
        None,
        [
            "model.path=null",
            f"model.fusion_mode={fusion}",
            f"pretrain.seed={seed}",
            f"model.init={{backbone: llama, hidden_size: {d}, num_layers: {layers}, "
            f"num_heads: {d // 64}, num_kv_heads: {d // 64}, intermediate_size: {3 * d}}}",
        ],
    )
    model, tok = P.load_model_and_tokenizer(cfg)
    if init == "irnn":
        with torch.no_grad():
            model.fusion.w_u.weight.copy_(torch.eye(d))
            model.fusion.w_t.weight.copy_(wt * torch.eye(d))
    lo, hi = lengths
    enc = P.encode_rows(track.generate(task, "train", 40000, lengths=tuple(range(lo, hi + 1))), tok, 96, "response")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    rng = random.Random(seed)

    def answer_accuracy(length: int, n: int = 200) -> float:
        rows = track.generate(task, "val", n, lengths=(length,), unique=False)
        ids, am, lm = P.collate_documents(P.encode_rows(rows, tok, 96, "response"), 0)
        with torch.no_grad():
            if mode == "exact":
                h = model.recurrent_forward(ids, feedback_mask=model.feedback_mask(ids, am) & lm.bool())
            else:
                h = model.multipass_forward(ids, 1, attention_mask=am).last_hidden
        # the row ends `=<cup><eos>`: the cup sits at len-2, predicted from the state at len-3
        lens, ar = am.sum(1), torch.arange(len(rows))
        return (model.logits_from_hidden(h[ar, lens - 3]).argmax(-1) == ids[ar, lens - 2]).float().mean().item()

    t0 = time.process_time()
    print(f"== {task} {fusion} L{layers} d{d} lr{lr} {mode} lengths {lo}..{hi} init {init} wt {wt}", flush=True)
    for step in range(steps):
        batch = P.collate_documents([enc[rng.randrange(len(enc))] for _ in range(32)], 0)
        for g in opt.param_groups:
            g["lr"] = lr * min(1, (step + 1) / 50)
        loss = (P.exact_loss(model, *batch, "response") if mode == "exact" else P.multipass_loss(model, *batch, 1))[0]
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % every == 0 or step + 1 == steps:
            accs = {k: round(answer_accuracy(k), 2) for k in eval_lengths}
            print(step + 1, f"loss {loss.item():.3f}", accs, f"cpu {time.process_time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    for spec in json.loads(sys.argv[1]):
        run(**spec)
