"""Whether a checkpoint can be resumed by this job's learner: the world size and ZeRO stage that wrote it.

DeepSpeed ZeRO 1-3 keeps one optimizer partition per rank (`*zero_pp_rank_<r>_*optim_states.pt`) and loads them
only at the world size and stage that saved them (otherwise it raises inside the rank, after Ray and every worker
have started). So `--resume` compares first, before any worker starts, and a mismatch is one line naming both sizes
and the way on: resume at the saved size, or start a new run from the checkpoint's consolidated weights
(`learner/model/`, a save_pretrained directory), whose Adam moments and data order start afresh.
A checkpoint without partitions (ZeRO-0, the torch learner) holds its whole state in files every rank reads, so
it resumes at any world size (tests/test_resume_layout.py: 2 ranks to 1 on the real stack gives the weights the
2-rank run reaches); its ZeRO stage must still match.
"""

from __future__ import annotations

import re
from pathlib import Path

_PARTITION = re.compile(r"zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")


def saved_partitions(checkpoint: Path) -> int | None:
    """How many ranks' ZeRO optimizer partitions the checkpoint holds; None without any (whole state)."""
    ranks = {int(m.group(1)) for p in (checkpoint / "learner").rglob("*.pt") if (m := _PARTITION.search(p.name))}
    return len(ranks) or None


def layout_problem(saved, cfg, checkpoint: Path, ranks: int, run_path: Path) -> str | None:
    """The refusal when this job's learner (`ranks` ranks at `cfg.learner.zero_stage`; `saved`: the run's own
    config) cannot load `checkpoint`; None when it can."""
    partitions = saved_partitions(checkpoint)
    stage, saved_stage = cfg.learner.zero_stage, saved.learner.zero_stage
    if partitions is not None:  # what the ranks wrote, whatever the config said (--no-ray runs one rank)
        saved_ranks, fits = partitions, ranks == partitions
    else:  # the whole state, in files every rank reads whole: any world size loads it
        saved_ranks, fits = saved.learner.num_workers, True
    if stage == saved_stage and fits:
        return None
    now = f"{ranks} learner rank{'s' if ranks != 1 else ''} at ZeRO-{stage}"
    if ranks != cfg.learner.num_workers:
        now += " (--no-ray: in-process workers run one rank)"
    left = max(saved.train.steps - int(checkpoint.name.rpartition("_")[2]), 1)
    return (
        f"--resume {run_path}: {checkpoint.name} was saved by {saved_ranks} learner rank"
        f"{'s' if saved_ranks != 1 else ''} at ZeRO-{saved_stage} (learner.num_workers={saved.learner.num_workers}, "
        f"learner.zero_stage={saved_stage}) and this job has {now}; a checkpoint's optimizer state loads only at "
        f"the world size and stage that wrote it. Resume on Ray with learner.num_workers={saved_ranks} "
        f"learner.zero_stage={saved_stage}, or start a new run from its weights (Adam's moments and the data order "
        f"start afresh): fbrl train {run_path}/config.yaml model.path={checkpoint}/learner/model "
        f"learner.num_workers={ranks} learner.zero_stage={stage} train.steps={left} "
        f"train.run_dir=NEW_RUN_DIR"
    )
