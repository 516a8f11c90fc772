"""Multi-turn rollouts: a policy that calls tools over several turns, for FBTs (docs/TOOLS.md).

A sample becomes [prompt][turn 1][observation 1][turn 2]...: the policy's tokens (`generated_mask` 1: trained on,
fed back) and the environment's (0: masked from the loss, consumed plainly). Each turn after the first resumes the
sequence from its recorded states (rl/samples/continuation.py): the engine's replay prefill fuses, at every
token the policy generated, the state that predicted it — what its recurrent decode did — so the next turn is
sampled from the context the learner reproduces (`replay`, `kpass`, `exact` read the same positions).

When a turn hands over to the environment: an environment with `stop_strings` gets the turn that ends in one
(the request stops at every token that may complete one: `stop_token_ids`), and the model's own stop token ends
the episode; an
environment without them (a chat environment) gets every turn that ends with the model's stop token. A turn cut
by a token cap ends the episode. Caps: `max_turns`, `max_turn_tokens` per turn, `max_tokens` in all (the
response, observations included). Token in, token out: sampled tokens are never re-tokenized; only observation
text is encoded. Plain Python over the worker interfaces: no Ray, vLLM or DeepSpeed here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Protocol

import torch

import rl.samples.states as state_formats
from rl.samples.batch import Sample
from rl.samples.continuation import Continuation


class StepEnvs(Protocol):
    def __call__(self, envs: list, rows: list[dict], texts: list[str]) -> list:
        """One step per episode (`envs[i]` None starts episode i from `rows[i]`): outcomes with `env` (the
        environment to pass next time), `observation` (str | None), `reward`, `done`, `failure` (str | None),
        `kind` (ok | error | timeout | crash | junk). The reward workers' `step_envs`."""


@dataclass(eq=False)  # episodes are told apart by identity
class Episode:
    first: Sample  # turn 1's sample: prompt, group, version
    tokens: list[int] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    states: list[torch.Tensor] = field(default_factory=list)  # fp32 rows, one per response token
    env: object = None
    finish_reason: str = "length"
    turns: int = 0
    tool_calls: int = 0
    env_reward: float = 0.0
    failure: str | None = None
    failure_kind: str | None = None
    preempted: bool = False
    done: bool = False

    def add_turn(self, s: Sample) -> None:
        self.tokens += s.response_ids
        self.generated += [1] * s.response_len
        self.logprobs += list(s.logprobs)
        self.states.append(state_formats.decode(s.states) if s.states is not None else torch.zeros(s.response_len, 0))
        self.finish_reason, self.turns = s.finish_reason, self.turns + 1
        self.preempted |= s.preempted

    def add_observation(self, ids: list[int]) -> None:
        self.tokens += ids
        self.generated += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        width = self.states[0].shape[1] if self.states else 0
        self.states.append(torch.zeros(len(ids), width))

    def continuation(self) -> tuple[list[int], Continuation]:
        prompt = self.first.prompt_ids
        states = torch.cat(self.states)
        full = torch.zeros(len(prompt) + len(self.tokens), max(states.shape[1], 1))
        full[len(prompt) :, : states.shape[1]] = states
        fed = torch.tensor([0] * len(prompt) + self.generated, dtype=torch.bool)
        return prompt + self.tokens, Continuation(full, fed)


def stop_token_ids(tokenizer, stop_strings: tuple[str, ...]) -> tuple[int, ...]:
    """Every token whose text holds the last character of one of `stop_strings`: the token that completes a stop
    string always does (engines stop on tokens, not text). A turn may so end before a stop string is complete; the
    environment, reading the text, then answers nothing and the model goes on."""
    last = {s[-1] for s in stop_strings if s}
    if not last:
        return ()
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=True)
    return tuple(i for i, t in enumerate(texts) if any(c in t for c in last))


def run_episodes(
    rollout,
    step_envs: StepEnvs,
    tokenizer,
    prompts: list[list[int]],
    rows: list[dict],
    params,
    min_version: int,
    max_turns: int,
    max_turn_tokens: int | None = None,
    env_stop_ids: tuple[int, ...] = (),
) -> list[Sample]:
    """n episodes per prompt (prompt-major, like `generate`), each up to `max_turns` turns and `params.max_tokens`
    response tokens in all. States are recorded whatever `params` says (a continuation needs them); they stay on
    the samples only when `params.record_states`."""
    budget = params.max_tokens
    per_turn = min(budget, max_turn_tokens or budget)
    feedback = params.decode_mode != "standard"
    turn_params = replace(
        params,
        max_tokens=per_turn,
        stop_token_ids=tuple(dict.fromkeys((*params.stop_token_ids, *env_stop_ids))),
        record_states=feedback,
    )
    hands_over = set(env_stop_ids) if env_stop_ids else set(turn_params.stop_token_ids)
    # (continuations given, even empty: the rollout workers then hand the states to this process)
    first = rollout.generate(prompts, turn_params, min_version=min_version, continuations=[None] * len(prompts))
    episodes = [Episode(s) for s in first]
    for ep in episodes:
        ep.add_turn(ep.first)
    for turn in range(1, max_turns + 1):
        waiting = [ep for ep in episodes if not ep.done and _hands_over(ep, hands_over)]
        for ep in episodes:
            if ep not in waiting:
                ep.done = True
        if not waiting:
            break
        if turn == max_turns:  # the turn cap: nobody answers the last call
            for ep in waiting:
                ep.done, ep.finish_reason = True, "length"
            break
        _step_envs(step_envs, tokenizer, waiting, rows, budget)
        going = [ep for ep in waiting if not ep.done]
        for ep in [ep for ep in going if len(ep.tokens) >= budget]:  # no token left to answer with
            ep.done, ep.finish_reason = True, "length"
            going.remove(ep)
        if not going:
            break
        seed = None if params.seed is None else (params.seed * 31 + turn * 1_000_000_007) % 2**62
        _next_turn(rollout, going, replace(turn_params, n=1, seed=seed), budget, min_version, feedback)
    return [_sample(ep, params.record_states, params.states_dtype) for ep in episodes]


def _next_turn(rollout, going: list[Episode], params, budget: int, min_version: int, feedback: bool) -> None:
    """Every going episode's next turn, resumed from its recorded states: one request per remaining token
    budget (usually one)."""
    seqs, conts = zip(*(ep.continuation() for ep in going))
    limit_of = [min(params.max_tokens, budget - len(ep.tokens)) for ep in going]
    for limit in sorted(set(limit_of)):
        group = [i for i, n in enumerate(limit_of) if n == limit]
        samples = rollout.generate(
            [seqs[i] for i in group],
            replace(params, max_tokens=limit),
            min_version=min_version,
            continuations=[conts[i] if feedback else None for i in group],
        )
        for i, s in zip(group, samples):
            going[i].add_turn(s)


def _hands_over(ep: Episode, hands_over: set[int]) -> bool:
    return ep.finish_reason == "stop" and bool(ep.tokens) and ep.tokens[-1] in hands_over


def _step_envs(step_envs: StepEnvs, tokenizer, waiting: list[Episode], rows: list[dict], budget: int) -> None:
    texts = [tokenizer.decode(_last_turn(ep), skip_special_tokens=True) for ep in waiting]
    outcomes = step_envs([ep.env for ep in waiting], [rows[ep.first.group_id] for ep in waiting], texts)
    for ep, out in zip(waiting, outcomes):
        ep.env, ep.env_reward = out.env, ep.env_reward + float(out.reward)
        if out.failure is not None:
            ep.failure, ep.failure_kind = out.failure, out.kind
        if out.observation:
            ids = tokenizer.encode(out.observation, add_special_tokens=False)
            if len(ep.tokens) + len(ids) >= budget:  # no room to append it and answer: the episode is cut
                ep.done, ep.finish_reason = True, "length"
                continue
            ep.tool_calls += 1
            ep.add_observation(ids)
        if out.done:
            ep.done = True


def _last_turn(ep: Episode) -> list[int]:
    """The tokens the policy generated since the last observation."""
    start = len(ep.generated)
    while start > 0 and ep.generated[start - 1] == 1:
        start -= 1
    return ep.tokens[start:]


def _sample(ep: Episode, keep_states: bool, states_dtype: str) -> Sample:
    s = ep.first
    states = None
    if keep_states:
        states = state_formats.encode(torch.cat(ep.states), states_dtype)
    return Sample(
        prompt_ids=list(s.prompt_ids),
        response_ids=list(ep.tokens),
        logprobs=list(ep.logprobs),
        finish_reason=ep.finish_reason,
        policy_version=s.policy_version,
        states=states,
        group_id=s.group_id,
        sample_index=s.sample_index,
        decode_mode=s.decode_mode,
        preempted=ep.preempted,
        generated_mask=list(ep.generated),
        episode={
            "turns": ep.turns,
            "tool_calls": ep.tool_calls,
            "env_reward": ep.env_reward,
            "failure": ep.failure,
            "failure_kind": ep.failure_kind,
        },
    )


def episode_metrics(samples: list[Sample]) -> dict[str, float]:
    """`env/*`: turns and tool calls per episode, environment reward, failures by kind."""
    eps = [s.episode for s in samples if s.episode is not None]
    if not eps:
        return {}
    n = len(eps)
    out = {
        "env/turns_mean": sum(e["turns"] for e in eps) / n,
        "env/tool_calls_mean": sum(e["tool_calls"] for e in eps) / n,
        "env/reward_mean": sum(e["env_reward"] for e in eps) / n,
        "env/observation_token_frac": sum(s.response_len - sum(s.generated) for s in samples)
        / max(1, sum(s.response_len for s in samples)),
    }
    for kind in ("error", "timeout", "crash", "junk"):
        out[f"env/failures_{kind}"] = float(sum(e["failure_kind"] == kind for e in eps))
    return out
