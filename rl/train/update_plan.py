"""How a batch is cut for the update: mini-batches (one optimizer step each), each spread over the learner ranks by
tokens and cut into micro-batches within the memory budgets (`plan_update`, `plan_for`), and the rows each rank
reads (`rows_read`). A function of row lengths and config only, so the learner group plans before anything is
fetched (actors/state_plane.py) without loading the model; `rl.train.policy_update.PolicyUpdater` runs the plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from rl.samples.batch import Sample

# Loss metrics of a micro-batch are its share of the mini-batch loss: summed over micro-batches and ranks.
SUMMED_METRICS = ("loss", "pg_loss", "kl_loss")


@dataclass
class UpdatePlan:
    """Rows of each optimizer step, and each rank's micro-batches within it (same count on every rank)."""

    minibatches: list[list[int]]
    micro: list[list[list[list[int]]]]  # [mini-batch][rank] -> micro-batches (row lists; [] = empty)

    def rank_micro_batches(self, mini: int, rank: int) -> list[list[int]]:
        return self.micro[mini][rank]

    def rank_rows(self, mini: int, rank: int) -> list[int]:
        return [r for rows in self.micro[mini][rank] for r in rows]


def plan_update(
    lengths: list[int],
    mini_batches: int,
    world_size: int,
    max_rows: int | None,
    max_tokens: int | None,
    response_lengths: list[int] | None = None,
    max_response_tokens: int | None = None,
    prompt_keys: list | None = None,
) -> UpdatePlan:
    """Mini-batches are contiguous row ranges (a prompt's group stays together); each is spread over the ranks by
    tokens (longest row first, to the rank with the fewest tokens), and each rank's rows, longest first, are cut
    into micro-batches of at most `max_rows` rows, `max_tokens` padded tokens (rows x longest prompt + response:
    the decoder stack's activations) and `max_response_tokens` response tokens (the [tokens, vocab] log-softmax);
    a row over a budget on its own gets a micro-batch of its own. Ranks short of micro-batches get empty ones.

    `prompt_keys` (one hashable per row, equal for rows of one prompt): a prompt's rows go to one rank together and
    sit next to each other, prompts longest row first, so they share a micro-batch unless a budget cuts them (the
    learner then computes each prompt once, rl/estimators/shared_prompt.py)."""
    n_rows = len(lengths)
    resp = response_lengths if response_lengths is not None else [0] * n_rows
    mini_batches = max(1, min(mini_batches, n_rows))
    rows = list(range(n_rows))
    per = -(-n_rows // mini_batches)
    minis = [rows[i * per : (i + 1) * per] for i in range(mini_batches) if rows[i * per : (i + 1) * per]]
    micro = []
    for mini in minis:
        shares, load = [[] for _ in range(world_size)], [0] * world_size
        for unit in _units(mini, lengths, prompt_keys):
            k = min(range(world_size), key=lambda i: (load[i], i))
            shares[k].extend(unit)
            load[k] += sum(lengths[r] for r in unit)
        per_rank = [_cut(share, lengths, resp, max_rows, max_tokens, max_response_tokens) for share in shares]
        n = max(1, max(len(m) for m in per_rank))
        micro.append([m + [[] for _ in range(n - len(m))] for m in per_rank])
    return UpdatePlan(minis, micro)


def _units(mini: list[int], lengths: list[int], prompt_keys: list | None) -> list[list[int]]:
    """The rows of a mini-batch in the units a rank takes whole, longest first (rows longest first within a unit):
    single rows, or with `prompt_keys` the rows of each prompt."""
    if prompt_keys is None:
        return [[r] for r in sorted(mini, key=lambda r: (-lengths[r], r))]
    by_prompt: dict = {}
    for r in mini:
        by_prompt.setdefault(prompt_keys[r], []).append(r)
    units = [sorted(rows, key=lambda r: (-lengths[r], r)) for rows in by_prompt.values()]
    return sorted(units, key=lambda u: (-lengths[u[0]], u[0]))


def _cut(
    rows: list[int],
    lengths: list[int],
    resp: list[int],
    max_rows: int | None,
    max_tokens: int | None,
    max_response: int | None,
) -> list[list[int]]:
    """Rows -> consecutive micro-batches within every budget (greedy: each micro-batch is filled up to a budget, so
    a step's peak is the budget's, whatever the rollout batch)."""
    out: list[list[int]] = []
    n_resp = longest = 0
    for r in rows:
        cur = out[-1] if out else None
        if (
            cur is not None
            and (max_rows is None or len(cur) < max_rows)
            and (max_tokens is None or (len(cur) + 1) * max(longest, lengths[r]) <= max_tokens)
            and (max_response is None or n_resp + resp[r] <= max_response)
        ):
            cur.append(r)
            n_resp += resp[r]
            longest = max(longest, lengths[r])
        else:
            out.append([r])
            n_resp, longest = resp[r], lengths[r]
    return out


def plan_for(samples: list[Sample], cfg, world_size: int) -> UpdatePlan:
    """The update plan of a batch under `cfg` (a function of row lengths and config only: the learner group
    computes the same plan before anything is fetched, see `rows_read`)."""
    lcfg = cfg.learner
    share = lcfg.share_prompts and cfg.rollout.decode_mode != "fused"
    return plan_update(
        [s.prompt_len + s.response_len for s in samples],
        cfg.algo.mini_batches,
        world_size,
        lcfg.micro_batch_size,
        lcfg.max_tokens_per_micro_batch,
        [s.response_len for s in samples],
        lcfg.max_response_tokens_per_micro_batch,
        [tuple(s.prompt_ids) for s in samples] if share else None,
    )


def rows_read(samples: list[Sample], cfg, world_size: int, rank: int) -> list[int]:
    """Rows whose recorded states rank `rank` reads in `PolicyUpdater.update`: its rows of every mini-batch (the
    policy's, behaviour and reference log-probs are all computed on a rank's own micro-batches; an empty
    micro-batch's stand-in row is collated with zero states). A function of row lengths and config only, so a
    learner group assigns rows to ranks before any state is fetched (actors/state_plane.py)."""
    plan = plan_for(samples, cfg, world_size)
    return sorted(r for m in range(len(plan.minibatches)) for r in plan.rank_rows(m, rank))
