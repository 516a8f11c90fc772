"""rl.estimators — the learner's log-probs of a rollout, and how they are checked.

`likelihood` (the estimators `exact`, `kpass`, `replay`, `standard` behind one registry), `comparison` (the
estimators against the exact recurrence: `fbrl compare-likelihood`), `mismatch_parts`
(the rollout / learner mismatch taken apart). Importing the package loads nothing; each module imports what it needs. What
engines and learners exchange (samples, recorded states, the log-prob contract) is in `rl.samples`.
"""
