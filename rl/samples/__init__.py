"""rl.samples — what rollout engines and learners exchange: samples, recorded states, log-prob contract, requests."""
