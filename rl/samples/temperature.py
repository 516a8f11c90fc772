"""The sampling temperatures both engines accept: 0 (greedy) or T in [TEMPERATURE_MIN, TEMPERATURE_MAX] (the
log-prob contract, rl/samples/logprob_contract.py). Apart from it, and free of torch, so that loading a config
(which checks `rollout.temperature`) costs no torch import: `fbrl train` starts Ray as soon as its config loads."""

TEMPERATURE_MIN = 1e-2  # vLLM raises smaller positive temperatures to this (its _MAX_TEMP), silently
TEMPERATURE_MAX = 2.0  # vLLM's SamplingParams refuses anything above
