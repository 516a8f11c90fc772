"""Rollout throughput per engine on a job's own prompts, against the plain paths: printed and written as JSON.

    python -m bench.rollout_speed [--config configs/tiny.yaml] [--hf PLAIN_LLAMA_DIR] [--threads 1,2]
                                  [--rows vllm_standard,vllm_soft,vllm_stock,torch_standard,torch_soft,hf_generate]
                                  [--reps 5] [--out FILE] [key=value ...]

One rollout request of the job (`train.prompts_per_step` prompts of the config's task, as the loop draws them,
`rollout.n_samples_per_prompt` samples each, sampled at `rollout.temperature`), with every sample made exactly
`rollout.max_tokens` tokens long (no stop token), so every row does the same work, timed by each path:

- `vllm_standard`, `vllm_soft`: fbrl's vLLM engine (rollout/vllm_engine.py: the FBT plugin, per-request decode
  mode, log-probs under the contract), as the rollout actor builds it (`actors.rollout_fleet.make_engine`);
- `vllm_stock`: stock vLLM (`vllm.LLM`, no fbrl code, the same engine options where they exist: in-process,
  eager, no prefix caching, the same KV cache) on the plain Llama the FBT is in standard mode (`--hf`, else the
  FBT's backbone exported to a temporary directory), with the same sampled-token log-probs requested;
- `torch_standard`, `torch_soft`: fbrl's torch engine (rollout/torch_engine.py);
- `hf_generate`: Hugging Face `generate` on the plain Llama, sampling, `output_scores` off (no log-probs).

Per thread count (`--threads`, torch's intra-op pool, set before each row's run), rows are timed interleaved
(the order rotates every repetition) and each reports its median wall seconds and tokens/s (response tokens /
wall seconds), its median CPU seconds, and the plugin's ratios: `vllm_standard / vllm_stock` (what the plugin
costs a model that does not use feedback) and `vllm_soft / vllm_standard` (what feedback costs). Run it on a
quiet machine: wall time measures the neighbours as much as the engines.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

ROWS = ("vllm_standard", "vllm_soft", "vllm_stock", "torch_standard", "torch_soft", "hf_generate")


def job_prompts(cfg):
    """(prompts, tokenizer): one step's prompts as the loop draws and encodes them (step 1's)."""
    from transformers import AutoTokenizer

    from rl.data.loaders import PromptSampler, load_task_split
    from rl.data.prompts import PromptFitter, prompt_token_limit

    tok = AutoTokenizer.from_pretrained(cfg.model.tokenizer or cfg.model.path)
    fitter = PromptFitter(tok, prompt_token_limit(cfg), cfg.data.overlong_prompts)
    rows, _ = fitter.fit(load_task_split(cfg.data, "train", tokenizer=tok), "train data")
    sampler = PromptSampler(rows, seed=cfg.train.seed)
    return [fitter.encode(r) for r in sampler.next(cfg.train.prompts_per_step)], tok


def export_plain_llama(fbt_dir: str, out: str) -> str:
    """The FBT's backbone as a plain LlamaForCausalLM directory (every tensor but the fusion's, bit for bit)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from rl.model.files import load_fbt

    fbt = load_fbt(fbt_dir)
    fields = {
        k: v
        for k, v in fbt.config.to_dict().items()
        if not k.startswith("fbt_") and k not in ("model_type", "architectures", "transformers_version")
    }
    cfg = LlamaConfig(**fields)
    cfg.architectures = ["LlamaForCausalLM"]
    plain = LlamaForCausalLM(cfg)
    plain.load_state_dict({k: v for k, v in fbt.state_dict().items() if not k.startswith("fusion.")}, strict=True)
    plain.save_pretrained(out)
    AutoTokenizer.from_pretrained(fbt_dir).save_pretrained(out)
    return out


def fbrl_params(cfg, mode: str, seed: int):
    from rl.samples.request import SamplingParams

    r = cfg.rollout
    return SamplingParams(
        n=r.n_samples_per_prompt,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=0 if r.top_k < 0 else r.top_k,
        max_tokens=r.max_tokens,
        stop_token_ids=(),
        seed=seed,
        decode_mode=mode,
        record_states=False,
    )


def keep_set_num_threads(build):
    """Build a vLLM object without losing `torch.set_num_threads` (vLLM's CPU worker replaces it by a no-op)."""
    saved = torch.set_num_threads
    try:
        return build()
    finally:
        torch.set_num_threads = saved


def vllm_rows(cfg, prompts, plain_dir):
    """{row: run(seed) -> response tokens} for fbrl's vLLM engine (both modes: one engine) and stock vLLM."""
    from actors.rollout_fleet import make_engine

    out = {}
    engine = keep_set_num_threads(lambda: make_engine(cfg))
    engine.eos_token_ids = ()  # every sample runs to max_tokens

    def fbrl_row(mode):
        return lambda seed: sum(s.response_len for s in engine.generate(prompts, fbrl_params(cfg, mode, seed)))

    out["vllm_standard"], out["vllm_soft"] = fbrl_row("standard"), fbrl_row("soft")
    if plain_dir is not None:
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        engine_max_len = engine.max_model_len
        llm = keep_set_num_threads(
            lambda: LLM(
                model=plain_dir,
                max_model_len=engine_max_len,
                max_num_seqs=cfg.rollout.vllm.max_num_seqs,
                max_num_batched_tokens=max(engine_max_len, 4096),
                enforce_eager=True,
                enable_prefix_caching=False,
                enable_chunked_prefill=False,
                distributed_executor_backend="uni",
                dtype=cfg.model.dtype,
                kv_cache_memory_bytes=int(cfg.rollout.vllm.kv_cache_gib * 2**30),
                skip_tokenizer_init=True,
                logprobs_mode="processed_logprobs",
                seed=0,
            )
        )
        r = cfg.rollout

        def stock(seed):
            reqs = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts for _ in range(r.n_samples_per_prompt)]
            sps = [
                SamplingParams(
                    n=1,
                    temperature=r.temperature,
                    top_p=r.top_p,
                    max_tokens=r.max_tokens,
                    ignore_eos=True,
                    seed=seed + i,
                    logprobs=0,
                    detokenize=False,
                )
                for i in range(len(reqs))
            ]
            return sum(len(o.outputs[0].token_ids) for o in llm.generate(reqs, sps, use_tqdm=False))

        out["vllm_stock"] = stock
    return out


def torch_rows(cfg, prompts):
    from rl.model.files import load_fbt
    from rollout.torch_engine import TorchEngine

    engine = TorchEngine(load_fbt(cfg.model.path), eos_token_ids=())

    def row(mode):
        return lambda seed: sum(s.response_len for s in engine.generate(prompts, fbrl_params(cfg, mode, seed)))

    return {"torch_standard": row("standard"), "torch_soft": row("soft")}


def hf_row(cfg, prompts, plain_dir, pad_id):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(plain_dir, dtype=torch.float32).eval()
    n, T = cfg.rollout.n_samples_per_prompt, cfg.rollout.max_tokens
    width = max(map(len, prompts))
    ids = torch.full((len(prompts) * n, width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(q for q in prompts for _ in range(n)):  # left-padded, as TRL's generate gets them
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1

    def run(seed):
        torch.manual_seed(seed)
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=cfg.rollout.temperature,
                top_p=cfg.rollout.top_p,
                top_k=0,
                max_new_tokens=T,
                min_new_tokens=T,
                pad_token_id=pad_id,
            )
        return int((out.shape[1] - width) * out.shape[0])

    return {"hf_generate": run}


def time_rows(runs: dict, threads: int, reps: int) -> dict:
    """{row: {wall_s, cpu_s, tokens, tokens_per_s}} medians over `reps` interleaved repetitions (+ 1 warm-up)."""
    torch.set_num_threads(threads)
    names = list(runs)
    for name in names:  # warm-up: first-call costs (allocations, kernels picked) stay out of the figures
        runs[name](0)
    got = {name: [] for name in names}
    for rep in range(reps):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            t, c = time.perf_counter(), time.process_time()
            tokens = runs[name](1000 + rep)
            got[name].append((time.perf_counter() - t, time.process_time() - c, tokens))
    out = {}
    for name, xs in got.items():
        wall, cpu = statistics.median(x[0] for x in xs), statistics.median(x[1] for x in xs)
        out[name] = {
            "wall_s": round(wall, 4),
            "cpu_s": round(cpu, 4),
            "tokens": xs[0][2],
            "tokens_per_s": round(xs[0][2] / wall, 1),
        }
    return out


def ratios(rows: dict) -> dict:
    def ratio(a, b):
        return round(rows[a]["wall_s"] / rows[b]["wall_s"], 3) if a in rows and b in rows else None

    return {
        "plugin_standard_over_stock_vllm": ratio("vllm_standard", "vllm_stock"),
        "vllm_soft_over_standard": ratio("vllm_soft", "vllm_standard"),
        "torch_standard_over_hf_generate": ratio("torch_standard", "hf_generate"),
        "vllm_standard_over_torch_standard": ratio("vllm_standard", "torch_standard"),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"))
    ap.add_argument("--hf", help="the plain Llama the FBT is in standard mode (default: export its backbone)")
    ap.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("overrides", nargs="*", help="fbrl config overrides (key=value)")
    args = ap.parse_args(argv)
    from rl.config import load_config

    cfg = load_config(args.config, args.overrides)
    rows = [r for r in args.rows.split(",") if r]
    unknown = set(rows) - set(ROWS)
    if unknown:
        ap.error(f"--rows: unknown {sorted(unknown)}; known: {', '.join(ROWS)}")
    prompts, tok = job_prompts(cfg)
    tmp = tempfile.TemporaryDirectory(prefix="fbrl_plain_llama_")
    plain = args.hf
    if plain is None and {"vllm_stock", "hf_generate"} & set(rows):
        plain = export_plain_llama(cfg.model.path, tmp.name)
    runs = {}
    if {"vllm_standard", "vllm_soft", "vllm_stock"} & set(rows):
        runs.update(vllm_rows(cfg, prompts, plain if "vllm_stock" in rows else None))
    if {"torch_standard", "torch_soft"} & set(rows):
        runs.update(torch_rows(cfg, prompts))
    if "hf_generate" in rows:
        runs.update(hf_row(cfg, prompts, plain, tok.pad_token_id if tok.pad_token_id is not None else 0))
    runs = {r: runs[r] for r in rows}
    r = cfg.rollout
    result = {
        "config": args.config,
        "overrides": args.overrides,
        "model": cfg.model.path,
        "plain_llama": args.hf,
        "prompts": len(prompts),
        "samples_per_prompt": r.n_samples_per_prompt,
        "new_tokens": r.max_tokens,
        "prompt_tokens_mean": round(statistics.mean(map(len, prompts)), 1),
        "reps": args.reps,
        "load_before": os.getloadavg()[0],
        "threads": {},
    }
    for n in [int(t) for t in args.threads.split(",")]:
        timed = time_rows(runs, n, args.reps)
        result["threads"][n] = {"rows": timed, "ratios": ratios(timed)}
        for name, v in timed.items():
            print(
                f"rollout_speed: {n} threads {name:15s} {v['wall_s']:7.3f} s wall {v['cpu_s']:7.3f} s cpu "
                f"{v['tokens_per_s']:8.1f} tokens/s",
                flush=True,
            )
        print(f"rollout_speed: {n} threads ratios {json.dumps(result['threads'][n]['ratios'])}", flush=True)
    result["load_after"] = os.getloadavg()[0]
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
