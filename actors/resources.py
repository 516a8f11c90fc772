"""What each worker may use, the lowest floor of actors/: whether a job wants GPUs, the CPUs a local Ray needs, which
cluster it joins, the torch threads of each actor (`role_threads`), and whether the CPU computes bf16 natively
(`precision_line`). Imports nothing of fbrl."""

from __future__ import annotations

import os

JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray's job supervisor in a `ray job submit` entrypoint


def uses_gpu(cfg) -> bool:
    return cfg.rollout.num_gpus_per_engine > 0 or cfg.learner.num_gpus_per_worker > 0


def required_cpus(cfg) -> int:
    E, W = cfg.rollout.num_engines, cfg.learner.num_workers
    return (max(E, W) if cfg.ray.colocate else E + W) + 1  # + the reward actor


def cluster_address(cfg) -> str | None:
    """The cluster to connect to: `ray.address`, or "auto" inside a `ray job submit` job; None: a local Ray."""
    if cfg.ray.address:
        return cfg.ray.address
    return "auto" if os.environ.get(JOB_ENV) else None


def role_threads(
    num_threads: int | None, role_count: int, max_staleness: int, cores: int, reserved_cpus: float, one_machine: bool
) -> int:
    """torch / OpenMP threads of each actor of a role (its engines or its learner ranks): the role's
    `num_threads`, or where it is null the cores the actor may use. A synchronous job on one machine
    (`train.max_staleness` 0) never generates while it trains, so while a role works every core is its:
    `cores // role_count` each. Otherwise (an asynchronous job, or a cluster) an actor takes the CPUs Ray reserved
    for it. Ray itself starts every actor with OMP_NUM_THREADS = its CPUs (1 here), which left a core idle."""
    if num_threads is not None:
        return num_threads
    if one_machine and max_staleness == 0:
        return max(1, cores // role_count)
    return max(1, int(reserved_cpus))


# /proc/cpuinfo flags of native bf16 arithmetic: AVX-512 bf16 dot products, AMX bf16 tiles
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


# the x86 vector ISAs torch's CPU kernels dispatch to, best first, with the /proc/cpuinfo flags each needs
VECTOR_ISAS = (("AVX512", {"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma"}), ("AVX2", {"avx2", "fma"}))


def cpu_flags(cpuinfo: str | None = None) -> set[str] | None:
    """The flags /proc/cpuinfo (or `cpuinfo`'s text) lists; None where it is unreadable (not Linux)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return None
    return {w for line in cpuinfo.splitlines() if line.startswith("flags") for w in line.split(":", 1)[-1].split()}


def native_bf16_flag(cpuinfo: str | None = None) -> str | None:
    """The first flag of NATIVE_BF16_FLAGS this CPU lists in /proc/cpuinfo (or in `cpuinfo`'s text); None where
    it lists none or the file is unreadable (not Linux)."""
    flags = cpu_flags(cpuinfo) or set()
    return next((f for f in NATIVE_BF16_FLAGS if f in flags), None)


def cpu_vector_isa(cpuinfo: str | None = None) -> str:
    """What `torch.backends.cpu.get_cpu_capability()` says on an x86 CPU (AVX512, AVX2 or DEFAULT), read from
    /proc/cpuinfo, so the driver names it without importing torch (~1.3 CPU-s before its workers could start).
    ATEN_CPU_CAPABILITY, which torch obeys, is obeyed here too. "unknown" where the flags cannot be read."""
    forced = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().upper()
    flags = cpu_flags(cpuinfo)
    if flags is None:
        return forced or "unknown"
    isas = [name for name, needs in VECTOR_ISAS if needs <= flags] + ["DEFAULT"]
    return forced if forced in isas else isas[0]


def precision_line(cfg, cpu_capability: str, bf16_flag: str | None) -> str:
    """One line for the start of a job: the engine's and the learner's dtype (`model.dtype`, `learner.bf16`; both
    fp32 by default) and whether this CPU computes bf16 natively. `cpu_capability`: torch's vector ISA here."""
    engine, learner = cfg.model.dtype, "bf16" if cfg.learner.bf16 else "float32"
    line = f"fbrl train: precision: engine {engine}, learner {learner}"
    if uses_gpu(cfg):
        return line + " (GPU job)"
    wants_bf16 = engine == "bfloat16" or cfg.learner.bf16
    if bf16_flag:
        hint = "" if wants_bf16 else ": model.dtype bfloat16 / learner.bf16 true would use it"
        return line + f" (CPU {cpu_capability}, native bf16: {bf16_flag}{hint})"
    note = "bf16 runs converted to fp32, slower" if wants_bf16 else "fp32 is its fastest"
    return line + f" (CPU {cpu_capability}, no native bf16: {note})"
