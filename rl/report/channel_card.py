"""Does the latent channel carry information? Measured on held-out text, and written as a checkpoint's card.

`channel_report(model, rows, tokenizer)` teacher-forces each row's prompt (plain) and solution (fed back: what
`soft` decoding computes) and compares, per response token:

- the exact recurrence (`recurrent_forward`, the ground truth of soft decoding) against pass 1 (the standard
  forward, feedback off): the loss difference with a 95 % bootstrap interval over rows, and `policy_shift`, the
  mean |log p_exact(y) − log p_pass1(y)|: how much feeding the state back moves next-token log-probs;
- the same states fed back in a shuffled order within each row (`state_information`): the loss this adds is
  what a state says about its own position, beyond what any state of the row would do to the input;
- K parallel passes for K = 1..8 (K-pass reconstruction): each K's loss (stability: passes 3..8 should stay
  near pass 2) and its log-prob error against the exact recurrence (K = 1 is pass 1: the error of ignoring the
  channel);
- the fusion's weights and the state's share of the fused input (rl/report/latent_metrics.py).

`write_card(checkpoint, rows_path)` adds `card.md`, `card.json` and `card_val_loss.png` (the per-pass validation
curves of its continued training: pass 1 solid, later passes dashed) to a checkpoint written by `fbrl pretrain`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
import torch.nn.functional as F

MAX_PASSES = 8


def _batches(rows, tokenizer, batch_size: int, seq_len: int):
    from rl.pretrain.trainer import collate_documents, encode_rows

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    enc = encode_rows(rows, tokenizer, seq_len, "response")
    for i in range(0, len(enc), batch_size):
        yield collate_documents(enc[i : i + batch_size], pad)


def _token_logprobs(model, hidden, input_ids, target_mask):
    logits = model.logits_from_hidden(hidden[:, :-1][target_mask]).float()
    return torch.log_softmax(logits, -1).gather(-1, input_ids[:, 1:][target_mask][:, None])[:, 0]


def bootstrap_mean_ci(num: list[float], den: list[float], n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % interval of sum(num)/sum(den) resampling rows (a row's tokens move together)."""
    rng, n, stats = random.Random(seed), len(num), []
    for _ in range(n_boot):
        idx = [rng.randrange(n) for _ in range(n)]
        stats.append(sum(num[i] for i in idx) / max(sum(den[i] for i in idx), 1e-12))
    stats.sort()
    return stats[int(0.025 * n_boot)], stats[int(0.975 * n_boot) - 1]


@torch.no_grad()
def channel_report(model, rows: list[dict], tokenizer, batch_size: int = 8, seq_len: int = 256) -> dict:
    """Every measurement of the module docstring on `rows` (prompt + solution rows, chats rendered)."""
    from rl.report.latent_metrics import _fusion_terms, weight_norms

    model.eval()
    per_row = {"tokens": [], "nll_pass": [[] for _ in range(MAX_PASSES)], "nll_exact": [], "shift": [], "nll_perm": []}
    gen = torch.Generator().manual_seed(0)
    err = [[] for _ in range(MAX_PASSES)]
    share = []
    for input_ids, attention, loss_mask in _batches(rows, tokenizer, batch_size, seq_len):
        fb = model.feedback_mask(input_ids, attention) & loss_mask.bool()
        target = loss_mask[:, 1:].bool()
        row_of = torch.arange(len(input_ids))[:, None].expand_as(target)[target]
        passes = model.multipass_forward(input_ids, MAX_PASSES, attention_mask=attention, feedback_mask=fb).hidden
        exact_h = model.recurrent_forward(input_ids, feedback_mask=fb)
        lp_exact = _token_logprobs(model, exact_h, input_ids, target)
        lp = [_token_logprobs(model, h, input_ids, target) for h in passes]
        carried = F.pad(exact_h[:, :-1], (0, 0, 1, 0))
        # control: each row's own states fed to its positions in a shuffled order (same states, wrong position)
        permuted = carried.clone()
        for b in range(len(input_ids)):
            pos = fb[b].nonzero()[:, 0]
            permuted[b, pos] = carried[b, pos[torch.randperm(len(pos), generator=gen)]]
        perm_h = model.multipass_forward(input_ids, 1, attention, fixed_carried=permuted, fixed_mask=fb).hidden[0]
        lp_perm = _token_logprobs(model, perm_h, input_ids, target)
        share.append(_fusion_terms(model, carried[fb], model.embed(input_ids)[fb]).get("state_share", float("nan")))
        for b in range(len(input_ids)):
            sel = row_of == b
            per_row["tokens"].append(int(sel.sum()))
            per_row["nll_exact"].append(float(-lp_exact[sel].sum()))
            per_row["nll_perm"].append(float(-lp_perm[sel].sum()))
            per_row["shift"].append(float((lp_exact[sel] - lp[0][sel]).abs().sum()))
            for k in range(MAX_PASSES):
                per_row["nll_pass"][k].append(float(-lp[k][sel].sum()))
        for k in range(MAX_PASSES):
            err[k].append((lp[k] - lp_exact).abs())
    tokens = per_row["tokens"]
    n_tok = sum(tokens)
    diff = [e - p for e, p in zip(per_row["nll_exact"], per_row["nll_pass"][0])]
    diff2 = [p2 - p1 for p2, p1 in zip(per_row["nll_pass"][1], per_row["nll_pass"][0])]
    info = [p - e for p, e in zip(per_row["nll_perm"], per_row["nll_exact"])]
    pass_loss = [sum(v) / n_tok for v in per_row["nll_pass"]]
    return {
        "rows": len(tokens),
        "tokens": n_tok,
        "loss_pass": pass_loss,
        "loss_exact": sum(per_row["nll_exact"]) / n_tok,
        "exact_minus_pass1": sum(diff) / n_tok,
        "exact_minus_pass1_ci95": bootstrap_mean_ci(diff, tokens),
        "pass2_minus_pass1": sum(diff2) / n_tok,
        "pass2_minus_pass1_ci95": bootstrap_mean_ci(diff2, tokens),
        "policy_shift": sum(per_row["shift"]) / n_tok,
        # what the state says about its own position: loss with the row's states shuffled minus the true order
        "state_information": sum(info) / n_tok,
        "state_information_ci95": bootstrap_mean_ci(info, tokens),
        "kpass_logprob_error": [float(torch.cat(e).mean()) for e in err],
        "max_rel_dev_pass3_8": max(abs(v - pass_loss[1]) / pass_loss[1] for v in pass_loss[2:]),
        "state_share": sum(share) / len(share),
        **weight_norms(model),
    }


def format_channel_card(r: dict, title: str = "") -> str:
    lo, hi = r["exact_minus_pass1_ci95"]
    lo2, hi2 = r["pass2_minus_pass1_ci95"]
    err = r["kpass_logprob_error"]
    lines = [
        f"{title}held-out rows {r['rows']}, response tokens {r['tokens']} (prompt plain, response fed back: soft)",
        f"- loss per token: pass 1 (standard) {r['loss_pass'][0]:.4f}, pass 2 {r['loss_pass'][1]:.4f}, "
        f"exact recurrence {r['loss_exact']:.4f}",
        f"- pass 2 − pass 1: {r['pass2_minus_pass1']:+.4f} nats/token (95 % CI {lo2:+.4f} … {hi2:+.4f})",
        f"- exact − pass 1: {r['exact_minus_pass1']:+.4f} nats/token (95 % CI {lo:+.4f} … {hi:+.4f})",
        f"- policy shift |log p_exact − log p_pass1|: {r['policy_shift']:.4f} nats/token",
        f"- information in the state (loss with each row's states fed in shuffled order − exact): "
        f"{r['state_information']:+.4f} nats/token (95 % CI {r['state_information_ci95'][0]:+.4f} … "
        f"{r['state_information_ci95'][1]:+.4f})",
        f"- state share of the fused input: {r['state_share']:.3f}; ‖W_U‖ {r.get('w_state_norm', 0):.3f}",
        f"- passes 3–{MAX_PASSES} vs pass 2: at most {100 * r['max_rel_dev_pass3_8']:.2f} % apart",
        "",
        "| K | " + " | ".join(str(k + 1) for k in range(len(err))) + " |",
        "|---|" + "---|" * len(err),
        "| loss | " + " | ".join(f"{v:.4f}" for v in r["loss_pass"]) + " |",
        "| mean abs log-prob error vs exact | " + " | ".join(f"{v:.2e}" for v in err) + " |",
        "",
        f"K=1 error / K=3 error: {err[0] / max(err[2], 1e-30):.1f}x",
    ]
    return "\n".join(lines)


def plot_val_curves(history: list[dict], out: Path, baseline: list[dict] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    steps = [h["step"] for h in history]
    n_pass = min(len(h["val"]) for h in history)
    for k in range(n_pass):
        ax.plot(steps, [h["val"][k] for h in history], "-" if k == 0 else "--", label=f"pass {k + 1}")
    if baseline:
        ax.plot([h["step"] for h in baseline], [h["val"][0] for h in baseline], ":", color="k", label="standard run")
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (nats/token)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def measure_checkpoint(checkpoint: str | Path, rows_path: str | Path, n_rows: int = 128) -> dict:
    """`channel_report` of a saved FBT on the first `n_rows` rows of a JSONL file (prompt or messages + solution)."""
    from transformers import AutoTokenizer

    from rl.data.loaders import load_jsonl, render_prompts
    from rl.model.files import load_fbt

    model = load_fbt(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    return channel_report(model, render_prompts(load_jsonl(rows_path)[:n_rows], tokenizer), tokenizer)


def write_card(checkpoint: str | Path, rows_path: str | Path, n_rows: int = 128, log=print) -> Path:
    """card.md / card.json / card_val_loss.png in `checkpoint` (from its training summary and `rows_path`)."""
    from rl.atomic_files import write_text

    ckpt = Path(checkpoint)
    log(f"card: measuring the channel on {n_rows} held-out rows of {rows_path}")
    report = measure_checkpoint(ckpt, rows_path, n_rows)
    summary = json.loads((ckpt / "training_summary.json").read_text())
    base = ckpt.parent / "std-trained" / "training_summary.json"
    base_hist = json.loads(base.read_text())["val_history"] if base.is_file() else None
    plot_val_curves(summary["val_history"], ckpt / "card_val_loss.png", base_hist)
    write_text(ckpt / "card.json", json.dumps(report, indent=1))
    text = (
        f"# {ckpt.name}: the latent channel\n\n"
        f"Continued training: {summary['steps_done']} steps, {summary['wall_time_s']:.0f} s, steps per K "
        f"{summary['steps_per_k']}; final validation loss per pass "
        + ", ".join(f"{v:.4f}" for v in summary["final_val_loss_per_pass"])
        + "\n\n![validation loss per pass](card_val_loss.png)\n\n"
        + format_channel_card(report)
        + "\n"
    )
    write_text(ckpt / "card.md", text)
    return ckpt / "card.md"
