"""The precision line at the start of `fbrl train` (actors/resources.py): the engine's and learner's dtypes, and
whether the CPU computes bf16 natively, read from /proc/cpuinfo's flags."""

from types import SimpleNamespace

import torch

from actors.resources import cpu_vector_isa, native_bf16_flag, precision_line

AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
SAPPHIRE_RAPIDS = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"


def job(dtype="float32", bf16=False, gpus=0):
    return SimpleNamespace(
        model=SimpleNamespace(dtype=dtype),
        learner=SimpleNamespace(bf16=bf16, num_gpus_per_worker=gpus),
        rollout=SimpleNamespace(num_gpus_per_engine=gpus),
    )


def test_native_bf16_flag_from_cpuinfo():
    assert native_bf16_flag(AVX2_ONLY) is None
    assert native_bf16_flag(SAPPHIRE_RAPIDS) == "amx_bf16"
    assert native_bf16_flag("flags\t: avx512f avx512_bf16\n") == "avx512_bf16"
    assert native_bf16_flag("model name\t: amx_bf16 in a name, not a flag\n") is None


def test_precision_line_says_the_choice_and_what_the_cpu_offers():
    fp32_here = precision_line(job(), "AVX2", native_bf16_flag(AVX2_ONLY))
    assert fp32_here == (
        "fbrl train: precision: engine float32, learner float32 (CPU AVX2, no native bf16: fp32 is its fastest)"
    )
    assert "bf16 runs converted to fp32, slower" in precision_line(job(bf16=True), "AVX2", None)
    native = precision_line(job(), "AVX512", "amx_bf16")
    assert "native bf16: amx_bf16: model.dtype bfloat16 / learner.bf16 true would use it" in native
    chosen = precision_line(job("bfloat16", True), "AVX512", "amx_bf16")
    assert chosen.endswith("engine bfloat16, learner bf16 (CPU AVX512, native bf16: amx_bf16)")
    assert precision_line(job("bfloat16", True, gpus=1), "AVX2", None).endswith("(GPU job)")


def test_vector_isa_from_cpuinfo_is_what_torch_dispatches_to(monkeypatch):
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert cpu_vector_isa(AVX2_ONLY) == "AVX2"
    assert cpu_vector_isa("flags\t: avx2 fma avx512f avx512bw avx512vl avx512dq\n") == "AVX512"
    assert cpu_vector_isa("flags\t: avx2 fma avx512f\n") == "AVX2"  # AVX-512 without BW/VL/DQ: torch uses AVX2
    assert cpu_vector_isa("flags\t: sse2 avx\n") == "DEFAULT"
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # a user's cap, which torch obeys
    assert cpu_vector_isa(SAPPHIRE_RAPIDS + "flags\t: avx512bw avx512vl avx512dq fma\n") == "AVX2"
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512", "DEFAULT"):  # x86 (other ISAs: torch's names)
        assert cpu_vector_isa() == torch.backends.cpu.get_cpu_capability()
