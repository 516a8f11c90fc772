"""One `VLLMEngine.generate` call's requests to vLLM and what comes back (rollout/vllm_engine.py): the prefix-cache
salt each prompt's samples share (`cache_salts`), each sample's vLLM sampling parameters (`request_params`: the
model plugin reads its key, decode mode and whether it records states from `extra_args`), and a vLLM output as a
`Sample` (`output_sample`).
"""

from __future__ import annotations

from rl.samples.batch import Sample
from rl.samples.request import SamplingParams

# vLLM's finish reasons -> a `Sample`'s (anything else: aborted)
FINISH = {"stop": "stop", "length": "length", "abort": "aborted"}


def cache_salts(prompts, decode_mode: str, continuations, call_salt: str) -> list[str | None]:
    """Per prompt, the prefix-cache salt its samples share (`call_salt`: this call's, so no entry outlives the
    weights it was computed with), or None where each sample needs one of its own (it must never hit):

    - a fused prompt: its passes need the whole prompt in one step, and its K/V are the last pass's, not a plain
      prompt's;
    - a continuation that feeds states: its K/V at fed positions depend on them;
    - a prompt that extends another prompt of the call: it could hit blocks holding that prompt's generated
      tokens, whose K/V were computed with feedback (soft, fused).
    """
    salts: list[str | None] = [None if decode_mode == "fused" else call_salt] * len(prompts)
    if continuations is not None:
        for i, c in enumerate(continuations):
            if c is not None and bool(c.fed.any()):
                salts[i] = None
    if decode_mode != "standard":
        distinct = set(map(tuple, prompts))
        lengths = sorted({len(p) for p in distinct})
        for i, p in enumerate(prompts):
            if any(tuple(p[:k]) in distinct for k in lengths if k < len(p)):
                salts[i] = None
    return salts


def request_params(
    params: SamplingParams, key: str, seed: int | None, eos_token_ids: tuple[int, ...], resume_preempted: bool
):
    """vLLM's sampling parameters of one sample (n=1: each sample has its own key, slot and seed); `eos_token_ids`
    and `resume_preempted` are the engine's (`VLLMEngine`)."""
    from vllm import SamplingParams as VSamplingParams

    # vLLM's own EOS handling is off (ignore_eos): the stop set is exactly ours, as in TorchEngine.
    stop = sorted(set(params.stop_token_ids) | set(eos_token_ids))
    # States are recorded also when the caller wants none, if a preempted request is to resume exactly.
    record = params.record_states or (resume_preempted and params.decode_mode != "standard")
    return VSamplingParams(
        n=1,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        max_tokens=params.max_tokens,
        stop_token_ids=stop,
        ignore_eos=True,
        seed=seed,
        logprobs=0,
        detokenize=False,
        extra_args={"fbt": {"key": key, "mode": params.decode_mode, "record": record}},
    )


def output_sample(out, key, group_id, sample_index, params, prompt, states, index, preempted, version: int) -> Sample:
    """vLLM's output of sample `key` as a `Sample` of policy `version`: its tokens, their log-probs, and its rows of
    the call's recorded `states` (`index[key]`: first row, row count) when states were asked for."""
    comp = out.outputs[0]
    ids = list(comp.token_ids)
    logprobs = [float(lp[t].logprob) for lp, t in zip(comp.logprobs, ids)]
    sample_states = None
    if params.record_states and not preempted:
        if key not in index or index[key][1] < len(ids):
            got = index[key][1] if key in index else 0
            raise RuntimeError(
                f"sample {key}: {got} recorded state rows for {len(ids)} response tokens "
                f"(the request was neither complete nor flagged preempted)"
            )
        off, _ = index[key]
        sample_states = states[off : off + len(ids)].clone()
    return Sample(
        prompt_ids=list(prompt),
        response_ids=ids,
        logprobs=logprobs,
        finish_reason=FINISH.get(comp.finish_reason or "length", "aborted"),
        policy_version=version,
        states=sample_states,
        group_id=group_id,
        sample_index=sample_index,
        decode_mode=params.decode_mode,
        preempted=preempted,
    )
