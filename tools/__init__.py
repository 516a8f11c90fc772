"""Maintainer tools, run from the repository root (`python -m tools.NAME [--help]`): generators of doc tables
(reliability_table, run_summary), mutation testing (mutation), the long-job soak and the memory watchers it and
the memory sections of docs/RELIABILITY.md use (soak, actor_memory, engine_memory), a profiling target for the
rollout (rollout_profile), and the GPU validation under tools/gpu/."""
