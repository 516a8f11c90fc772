"""rl.estimators — the learner's log-probs of a rollout, and how they are checked.

`likelihood` (the estimators `exact`, `kpass`, `replay`, `standard` behind one registry), `logprob_contract` (the
behaviour density π_b the engines and the learner share), `states` (the recorded states' storage formats and
`StateRef`), `compare` (the estimators against the exact recurrence: `fbrl compare-likelihood`), `mismatch_parts`
(the rollout / learner mismatch taken apart). Importing the package loads nothing; each module imports what it needs.
"""
