#!/usr/bin/env bash
# The vLLM engine (rollout/vllm_engine.py) on one GPU, in one prepared run of at most ~10 minutes:
#   1. environment: vLLM 0.32 importable (installed here if missing), our package's plugin entry point installed;
#   2. the oracle tests (tests/test_vllm_engine.py: vLLM vs the torch engine, fp32) on the GPU;
#   3. vLLM's native weight transfer (CUDA IPC, worker in its own process) into the engine, checked against the
#      torch engine with the same weights;
#   4. throughput of soft vs standard (and fused) decoding on random-weight 135M-size and 1B-size FBT models
#      (bf16, batch 256), printing the ratios beside the FLOP-predicted fusion overhead.
# Each step runs even if an earlier one failed; the last lines summarize. Usage, from anywhere:
#   bash bench/gpu_check.sh            env: PY (python, default python3), OUT (logs, default /tmp/fbrl_gpu_check),
#                                      FBRL_WHEELS (a folder of wheels for an offline `pip install vllm`)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT=${OUT:-/tmp/fbrl_gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
declare -A STATUS
step() { echo; echo "=== $* ($(date +%T))"; }

step "1. environment"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || { echo "FAIL: no GPU"; exit 1; }
if ! $PY -c "import vllm" 2>/dev/null; then
  if [ -n "${FBRL_WHEELS:-}" ]; then
    $PY -m pip install -q --no-index --find-links "$FBRL_WHEELS" "vllm==0.32.*"
  else
    timeout 300 $PY -m pip install -q "vllm==0.32.*"
  fi
fi
if ! $PY -c "import vllm, torch, transformers; print('vllm', vllm.__version__, '| torch', torch.__version__, \
'| transformers', transformers.__version__, '| gpu', torch.cuda.get_device_name())"; then
  echo "FAIL: vLLM is not importable here (no package registry and no FBRL_WHEELS?); nothing else can run"
  exit 2
fi
# vLLM's worker processes find our model through the `vllm.general_plugins` entry point of the installed package.
$PY -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip_e.log" 2>&1 \
  && STATUS[entry_point]=ok || { STATUS[entry_point]=FAIL; tail -3 "$OUT/pip_e.log"; }

step "2. oracle tests on GPU (vLLM vs torch engine, fp32, in-process engines)"
VLLM_ENABLE_V1_MULTIPROCESSING=0 timeout 300 $PY -m pytest -q -p no:cacheprovider tests/test_vllm_engine.py \
  >"$OUT/tests.log" 2>&1 && STATUS[oracle_tests]=ok || STATUS[oracle_tests]=FAIL
grep -E "passed|failed|^FAILED|^E " "$OUT/tests.log" | tail -15

step "3. native weight transfer (CUDA IPC into a multiprocess engine)"
cat >"$OUT/ipc_check.py" <<'EOF'
"""Trainer-side IPC engine -> VLLMEngine.load_weights(trainer, v): outputs must match the torch engine's."""
import copy
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from rollout.torch_engine import TorchEngine
from rollout.vllm_engine import VLLMEngine
from tests.test_vllm_engine import assert_same, greedy, make_prompts, perturb, random_tiny_fbt

if __name__ == "__main__":  # the engine spawns its worker process
    from vllm.distributed.weight_transfer.base import ModuleSource
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo, IPCTrainerWeightTransferEngine

    ckpt = Path(tempfile.mkdtemp())
    random_tiny_fbt(ckpt)
    hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    prompts = make_prompts(hf.config.vocab_size, n=8)
    engine = VLLMEngine(str(ckpt), max_model_len=128, max_num_seqs=16, dtype="float32",
                        weight_transfer_backend="ipc")
    new = copy.deepcopy(hf)
    perturb(new, seed=1)
    trainer = IPCTrainerWeightTransferEngine.trainer_init(IPCTrainerInitInfo(rank=0), client=engine,
                                                          source=ModuleSource(copy.deepcopy(new).cuda()))
    engine.load_weights(trainer, 1)
    assert engine.version == 1
    assert_same(engine.generate(prompts, greedy("soft"), min_version=1),
                TorchEngine(new).generate(prompts, greedy("soft")))
    print("IPC weight transfer: outputs match the torch engine with the new weights")
    engine.close()
EOF
VLLM_ENABLE_V1_MULTIPROCESSING=1 timeout 180 $PY "$OUT/ipc_check.py" >"$OUT/ipc.log" 2>&1 \
  && STATUS[native_weight_transfer]=ok || STATUS[native_weight_transfer]=FAIL
grep -E "IPC weight transfer|Error|error:" "$OUT/ipc.log" | tail -5

step "4. throughput: soft / standard / fused, random weights, bf16, batch 256"
cat >"$OUT/throughput.py" <<'EOF'
"""Wall time of one generate() per decode mode (same engine: the mode is per request), best and median of 3."""
import json
import shutil
import statistics
import sys
import tempfile
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, "bench")
from decode import flops_per_decode_token, fusion_flops_per_token  # noqa: E402  (one FLOP model for all benches)

from rl.model import convert_to_fbt  # noqa: E402
from rollout.base import SamplingParams  # noqa: E402
from rollout.vllm_engine import VLLMEngine  # noqa: E402

SHAPES = {  # SmolLM2-135M and Llama-3.2-1B shapes
    "135m": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                 intermediate_size=1536, vocab_size=49152),
    "1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=8192, vocab_size=128256),
}
BATCH, NEW, REPS = 256, 128, 3

for name, shape in SHAPES.items():
    cfg = LlamaConfig(tie_word_embeddings=True, bos_token_id=1, eos_token_id=None, pad_token_id=0,
                      max_position_embeddings=2048, **shape)
    torch.manual_seed(0)
    with torch.device("cuda"):
        fbt = convert_to_fbt(LlamaForCausalLM(cfg).to(torch.bfloat16))
    ckpt = tempfile.mkdtemp(prefix=f"fbrl_gpu_{name}_")
    fbt.save_pretrained(ckpt)
    del fbt
    torch.cuda.empty_cache()
    g = torch.Generator().manual_seed(1)
    lens = torch.randint(64, 257, (BATCH,), generator=g).tolist()
    prompts = [[1] + torch.randint(4, cfg.vocab_size, (n - 1,), generator=g).tolist() for n in lens]
    engine = VLLMEngine(ckpt, max_model_len=512, max_num_seqs=BATCH, dtype="bfloat16", eos_token_ids=(),
                        gpu_memory_utilization=0.6)
    modes = ["standard", "soft", "fused"]
    params = {m: SamplingParams(temperature=0.0, max_tokens=NEW, decode_mode=m) for m in modes}
    times = {m: [] for m in modes}
    for m in modes:
        engine.generate(prompts, params[m])  # warm-up (and the soft/fused token tables)
    for r in range(REPS):
        for m in modes[r % 3:] + modes[:r % 3]:
            torch.cuda.synchronize()
            t = time.perf_counter()
            engine.generate(prompts, params[m])
            times[m].append(time.perf_counter() - t)
    engine.close()
    shutil.rmtree(ckpt, ignore_errors=True)
    best = {m: min(v) for m, v in times.items()}
    med = {m: statistics.median(v) for m, v in times.items()}
    predicted = fusion_flops_per_token(cfg) / flops_per_decode_token(cfg, sum(lens) / BATCH + (NEW + 1) / 2)
    print("THROUGHPUT " + json.dumps({
        "model": name, "batch": BATCH, "new_tokens": NEW, "predicted_fusion_overhead": round(predicted, 5),
        "goal_soft_over_standard_max": round(1 + 1.2 * predicted, 5),
        "soft_over_standard": round(best["soft"] / best["standard"], 4),
        "soft_over_standard_medians": round(med["soft"] / med["standard"], 4),
        "fused_over_standard": round(best["fused"] / best["standard"], 4),
        "tokens_per_s": {m: round(BATCH * NEW / best[m], 1) for m in modes},
        "wall_s_best": {m: round(v, 3) for m, v in best.items()}}), flush=True)
EOF
VLLM_ENABLE_V1_MULTIPROCESSING=0 timeout 300 $PY "$OUT/throughput.py" >"$OUT/throughput.log" 2>&1 \
  && STATUS[throughput]=ok || STATUS[throughput]=FAIL
grep "^THROUGHPUT" "$OUT/throughput.log" || tail -5 "$OUT/throughput.log"

step "summary (logs in $OUT)"
for k in entry_point oracle_tests native_weight_transfer throughput; do echo "$k: ${STATUS[$k]:-not run}"; done
grep "^THROUGHPUT" "$OUT/throughput.log" | sed 's/^THROUGHPUT //'
