"""rollout — rollout engines behind one interface (`rollout.engine.RolloutEngine`).

Owns: the pure-torch reference engine (KV cache, per-sequence latent state, all decode modes), and the vLLM
engine with our vLLM model plugin (per-request latent state slot, recorded states, versioned weight updates).
May import `rl`; never `actors`.
"""
