"""Where a DeepSpeed learner rank's time goes, from watch_fbrl.sh's py-spy records (stdlib only).

    python3 pyspy_phases.py PROF/pyspy_<pid>.txt:<trained steps> [more files...]

Each file is py-spy's raw (collapsed) output of one learner rank (10 Hz, so a sample is 0.1 s); the number after
the colon is how many trained steps the record covers (the per-step figures divide by it). Samples are put in
phases by the frames they contain: fbrl's micro-batch forward (the decoder stack; the LM head + log_softmax +
entropy at the response tokens, rl/estimators/likelihood.py `token_logprobs`), the backward (autograd; DeepSpeed ZeRO-2's
gradient hooks: bucket flatten / copy into the partition, and gloo's all_reduce of the buckets), the optimizer step
(AdamW, the parameter all-gather, norm / flatten / clip), and outside the update the mismatch parts and the
weight export (rank 0). Prints a markdown table in seconds per trained step.
"""

from __future__ import annotations

import sys
from collections import Counter

ORDER = [
    "fwd: decoder stack",
    "fwd: LM head + log_softmax + entropy",
    "bwd: autograd",
    "bwd: ZeRO-2 hooks: bucket flatten / copy",
    "bwd: ZeRO-2 hooks: gloo all_reduce",
    "step: AdamW",
    "step: parameter all-gather",
    "step: norm / flatten / clip",
    "update: other",
    "mismatch parts",
    "sync: weight export",
]


def name(frame: str) -> str:
    return frame.split(" (")[0]


def phase(frames: list[str]) -> str | None:
    names = [name(f) for f in frames]
    joined = ";".join(frames)
    if "LearnerRank.update" not in names:
        if "LearnerRank.mismatch_parts" in names:
            return "mismatch parts"
        if "LearnerRank.export_weights" in names:
            return "sync: weight export"
        return None  # idle threads, waiting for a call, other calls
    if "DeepSpeedBackend.backward" in names:
        if "TorchBackend.all_reduce" in names:
            return "bwd: ZeRO-2 hooks: gloo all_reduce"
        if "DeepSpeedZeroOptimizer" in joined:
            return "bwd: ZeRO-2 hooks: bucket flatten / copy"
        return "bwd: autograd"
    if "DeepSpeedBackend.step" in names:
        if "all_gather" in joined:
            return "step: parameter all-gather"
        if "Adam" in joined:
            return "step: AdamW"
        return "step: norm / flatten / clip"
    if "token_logprobs" in names:
        return "fwd: LM head + log_softmax + entropy"
    if any(n.endswith(("_micro_loss", "_logprobs")) for n in names):
        return "fwd: decoder stack"
    return "update: other"


def main() -> int:
    cols = []
    for arg in sys.argv[1:]:
        path, _, steps = arg.rpartition(":")
        counts = Counter()
        for line in open(path):
            stack, _, n = line.rstrip("\n").rpartition(" ")
            k = phase(stack.split(";"))
            if k:
                counts[k] += int(n)
        cols.append((path, counts, int(steps)))
    print(
        "| phase (s per trained step) | "
        + " | ".join(p.rsplit("/", 2)[-2] + "/" + p.rsplit("/", 1)[-1] for p, _, _ in cols)
        + " |"
    )
    print("|---|" + "---|" * len(cols))
    for k in ORDER:
        print(f"| {k} | " + " | ".join(f"{c[k] / 10 / n:.2f}" for _, c, n in cols) + " |")
    outside = ("mismatch parts", "sync: weight export")
    print(
        "| **update (learner phase) total** | "
        + " | ".join(f"**{sum(v for k, v in c.items() if k not in outside) / 10 / n:.2f}**" for _, c, n in cols)
        + " |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
