"""A LoRA learner against the full fine-tune, side by side on the same batch: peak RSS of the learner rank's
process, seconds per update, and the fusion weights' norms (the latent metrics) over the updates.

    python -m bench.lora_learner --config configs/smollm_rl.yaml [--override k=v ...]
        [--variant NAME=k=v,k=v ...] [--updates 3] [--samples FILE] [--rows N] [--out FILE]

The batch is real: step 1's prompts of the config's task and `rollout.n_samples_per_prompt` samples each, drawn by
the torch engine from the config's checkpoint (with recorded states for replay); `--samples FILE` keeps it (written
the first time, read afterwards). Advantages: a fixed random draw.

Each variant runs in a fresh process (so its peak RSS is its own): one `actors.learner_rank.LearnerRank` (the DeepSpeed
engine of the config, world size 1: what each Ray rank runs) taking `--updates` updates on the batch. Reported:
`peak_rss_gib` (ru_maxrss of that process: weights, optimizer state, activations, everything), `s_per_update`
(median of the updates after the first, which is warm-up), and the fusion norms `latent/w_state_norm` /
`latent/w_token_norm` (rl/report/latent_metrics.py) before the first update and after the last. Default variants:
`full` (the config as it is) and `lora` (`learner.lora={}`).

After each update the rank exports its weights twice, as a weight sync does, and each export's memory is measured
as the process's peak RSS above its RSS when the export starts (the kernel's high-water mark reset just before
it; run with `MALLOC_MMAP_THRESHOLD_` fixed, as this script does for its children, so freed tensors leave RSS):
`sync_file_gib` (`export_weights`: the CPU default, a safetensors file of the full weights) and `sync_stream_gib`
(the (name, tensor) stream the ray and native transfers send, each tensor dropped once taken), and
`stream_per_tensor_gib`, the most any one tensor of that stream adds (the high-water mark reset before each). Beside them the
sizes they are bounded by: `largest_layer_gib` (the largest tensor of the export), `largest_adapted_gib` (the
largest LoRA-adapted weight, in fp32) and `weights_gib` (all of them).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def fusion_norms(rank) -> dict[str, float]:
    from rl.report.latent_metrics import weight_norms

    return {f"latent/{k}": v for k, v in weight_norms(rank.policy).items()}


def rss_gib(field: str) -> float:
    """VmRSS or VmHWM (peak) of this process, GiB (Linux)."""
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith(field + ":"))
    return int(line.split()[1]) / 2**20


def export_peak(export) -> float:
    """Peak RSS above the RSS at the start while `export()` runs, GiB: the kernel's peak is reset first
    (writing 5 to clear_refs sets VmHWM to the current RSS)."""
    import gc

    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    start = rss_gib("VmRSS")
    export()
    return rss_gib("VmHWM") - start


def sync_peaks(rank, directory: str) -> dict[str, float]:
    """Memory of one weight sync of `rank`: the file export and the streamed one (see the module docstring)."""
    import os

    def stream():
        for _name, t in rank.full_tensors():
            del t

    from peft.tuners.lora import LoraLayer

    def per_tensor() -> float:
        """The largest peak above the RSS of any one tensor of the stream (reset before each)."""
        worst = 0.0
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        start = rss_gib("VmRSS")
        for _name, t in rank.full_tensors():
            worst = max(worst, rss_gib("VmHWM") - start)
            del t
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            start = rss_gib("VmRSS")
        return worst

    sizes = [t.numel() * t.element_size() for _, t in rank.full_tensors()]
    adapted = [4 * m.get_base_layer().weight.numel() for m in rank.policy.modules() if isinstance(m, LoraLayer)]
    path = os.path.join(directory, "weights.safetensors")
    return {
        "largest_adapted_gib": max(adapted, default=0) / 2**30,  # in fp32, as merged
        "sync_file_gib": export_peak(lambda: rank.export_weights(path)),
        "sync_stream_gib": export_peak(stream),
        "noop_gib": export_peak(lambda: None),  # the measurement's floor: nothing exported
        "stream_per_tensor_gib": per_tensor(),
        "largest_layer_gib": max(sizes) / 2**30,
        "weights_gib": sum(sizes) / 2**30,
    }


def run_variant(config: str, overrides: list[str], samples_path: str, updates: int, rows: int | None) -> dict:
    """One LearnerRank in this process, `updates` updates on the saved batch (its first `rows` rows)."""
    from actors.learner_rank import LearnerRank
    from rl.config import load_config

    cfg = load_config(config, overrides)
    from rl.samples.batch import load_samples

    samples, adv = load_samples(samples_path)
    samples, adv = samples[:rows], adv[:rows]
    rank = LearnerRank(cfg)
    before = fusion_norms(rank)
    times, metrics, syncs = [], {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(updates):
            t = time.perf_counter()
            metrics = rank.update(samples, adv)
            times.append(time.perf_counter() - t)
            syncs.append(sync_peaks(rank, tmp))
    after = fusion_norms(rank)
    trainable = sum(p.numel() for p in rank.policy.parameters() if p.requires_grad)
    rank.close()
    return {
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "s_per_update": statistics.median(times[1:] or times),
        "update_s": times,
        "sync": {k: max(x[k] for x in syncs) for k in syncs[0]},
        "trainable_params": trainable,
        "grad_norm": metrics.get("grad_norm"),
        "fusion_before": before,
        "fusion_after": after,
        "rows": len(samples),
        "tokens": sum(s.prompt_len + s.response_len for s in samples),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True)
    p.add_argument("--override", action="append", default=[])
    p.add_argument("--variant", action="append", default=[], help="NAME=k=v,k=v (default: full and lora)")
    p.add_argument("--updates", type=int, default=3)
    p.add_argument("--samples", default=None, help="batch file (written if missing)")
    p.add_argument("--rows", type=int, default=None, help="train on the batch's first ROWS rows (whole groups)")
    p.add_argument("--out", default=None)
    p.add_argument("--child", nargs=2, metavar=("VARIANT_OVERRIDES_JSON", "SAMPLES"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(
            "RESULT "
            + json.dumps(run_variant(args.config, json.loads(args.child[0]), args.child[1], args.updates, args.rows)),
            flush=True,
        )
        return 0
    from bench.learner_speed import load_or_make_batch  # the same real batch as the learner-speed benchmark
    from rl.config import load_config

    cfg = load_config(args.config, args.override)
    samples_path = args.samples or "/tmp/lora_learner_batch.pt"
    load_or_make_batch(cfg, samples_path)
    variants = [v.partition("=") for v in args.variant] or [("full", "=", ""), ("lora", "=", "learner.lora={}")]
    results = {}
    for name, _, extra in variants:
        overrides = args.override + [o for o in extra.split(",") if o]
        rows = ["--rows", str(args.rows)] if args.rows else []
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--config",
                args.config,
                "--updates",
                str(args.updates),
                *rows,
                "--child",
                json.dumps(overrides),
                samples_path,
            ],
            capture_output=True,
            text=True,
            # a fixed threshold keeps glibc from moving large frees into its heap, where they stay in RSS
            env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"},
        )
        line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
        if out.returncode or not line:
            print(out.stdout[-2000:], out.stderr[-4000:], file=sys.stderr)
            raise SystemExit(f"variant {name} failed (exit {out.returncode})")
        results[name] = r = json.loads(line[0][len("RESULT ") :])
        print(
            f"{name:>8}: peak RSS {r['peak_rss_gib']:.2f} GiB, {r['s_per_update']:.1f} s/update "
            f"({', '.join(f'{t:.1f}' for t in r['update_s'])}), {r['trainable_params'] / 1e6:.2f}M trainable, "
            f"fusion {r['fusion_before']} -> {r['fusion_after']}; one sync above the RSS: file "
            f"+{r['sync']['sync_file_gib']:.3f} GiB, stream +{r['sync']['sync_stream_gib']:.3f} GiB (largest "
            f"tensor {r['sync']['largest_layer_gib']:.3f} GiB, floor {r['sync']['noop_gib']:.4f} GiB, one tensor at most "
            f"+{r['sync']['stream_per_tensor_gib']:.4f} GiB, largest adapted {r['sync']['largest_adapted_gib']:.4f} GiB, all {r['sync']['weights_gib']:.3f} GiB)",
            flush=True,
        )
    if "full" in results and "lora" in results:
        f, lo = results["full"], results["lora"]
        print(
            f"lora / full: peak RSS {lo['peak_rss_gib'] / f['peak_rss_gib']:.2f}x, "
            f"s/update {lo['s_per_update'] / f['s_per_update']:.2f}x"
        )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
