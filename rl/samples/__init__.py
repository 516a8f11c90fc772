"""rl.samples — what rollout engines and learners exchange, the ground floor both stand on.

`batch` (a rollout's `Sample` and the learner's padded `Batch`), `states` (the recorded states' storage formats
and `StateRef`), `logprob_contract` (the behaviour density π_b engines and learners share), `request`
(`SamplingParams`, what a rollout request asks for). It imports nothing of fbrl but `rl.decode_modes` and
`rl.errors`; rollout/ imports only this and `rl.model` from rl/.
"""
