#!/usr/bin/env bash
# Torch-only GPU check: runs as it is on a GPU machine with only torch and transformers installed (plus
# safetensors, and pytest for step 3; no vLLM / Ray / DeepSpeed, no package registry) in at most 8 minutes, and
# writes its results to the output directory $OUT. docs/GPU.md says what it measures; tools/gpu/gpu_check_vllm.sh is the check
# for a machine with the full stack (vLLM oracle tests, native weight transfer, vLLM throughput).
#   1. environment: the GPU, versions, our torch-only packages import without vllm/ray/deepspeed  (<= 60 s)
#   2. tools/gpu/gpu_bench.py: torch engine soft / standard / fused decode, learner replay / standard and
#      K=3 / standard fwd+bwd time and peak memory, exact estimator at R = 256 and 1024 (1B shape, bf16)  (<= 330 s)
#   3. compatibility: the CPU unit tests of rl/model, the torch engine and the estimators under this machine's
#      torch / transformers (CI pins other versions)  (<= 90 s)
# Each step runs even if an earlier one failed; the exit status is non-zero if any failed.
# Usage, from anywhere:
#   bash tools/gpu/gpu_check.sh [--dry-run]    env: PY (default python3), OUT (the output directory, default ./gpu_check_out)
# --dry-run: the same steps on the CPU with a tiny model (seconds; CI runs it: tests/test_gpu_check.py), no GPU
# needed, unit tests left out (CI runs them anyway).
set -uo pipefail
OUT=${OUT:-gpu_check_out}  # the output directory, relative to the caller's directory unless absolute
case "$OUT" in /*) ;; *) OUT=$PWD/$OUT ;; esac
cd "$(dirname "$0")/../.."
DRY=""
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1 ;;
    *) echo "usage: bash tools/gpu/gpu_check.sh [--dry-run]" >&2; exit 64 ;;
  esac
done
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
declare -A STATUS
step() { echo; echo "=== $* ($(date +%T))"; }
START=$SECONDS

step "1. environment"
{
  if [ -z "$DRY" ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no nvidia-smi"
  fi
  # what a copy of the working tree to a GPU machine weighs
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 -r stat -c %s 2>/dev/null \
      | awk '{s += $1} END {print s + 0}')
    echo "working tree (tracked + untracked, not ignored): $tree bytes"
  fi
  timeout 60 $PY - "$DRY" <<'EOF'
import importlib.util, platform, sys
for name in ("vllm", "ray", "deepspeed", "math_verify", "wandb"):  # not installed on a torch-only machine
    sys.modules.setdefault(name, None)
import torch, transformers, safetensors, huggingface_hub
import rl.model, rl.estimators.likelihood, rl.train.policy_update, rollout.torch_engine  # noqa: F401  (the torch-only packages)
print(f"python {platform.python_version()} | torch {torch.__version__} | transformers {transformers.__version__} "
      f"| huggingface_hub {huggingface_hub.__version__} | safetensors {safetensors.__version__} "
      f"| pytest {'yes' if importlib.util.find_spec('pytest') else 'no'}")
if not sys.argv[1]:
    assert torch.cuda.is_available(), "torch sees no CUDA device"
    print("gpu", torch.cuda.get_device_name(), "| cuda", torch.version.cuda)
EOF
} 2>&1 | tee "$OUT/env.txt"
[ "${PIPESTATUS[0]}" = 0 ] && STATUS[environment]=ok || STATUS[environment]=FAIL

step "2. benchmark (tools/gpu/gpu_bench.py)"
timeout 330 $PY -m tools.gpu.gpu_bench ${DRY:+--dry-run} --out "$OUT" --budget-s 270 2>&1 | tee "$OUT/gpu_bench.log"
[ "${PIPESTATUS[0]}" = 0 ] && STATUS[benchmark]=ok || STATUS[benchmark]=FAIL

if [ -z "$DRY" ]; then
  step "3. compatibility: CPU unit tests of the torch-only packages under this machine's versions"
  timeout 90 $PY -m pytest -q -x -p no:cacheprovider tests/test_model.py tests/test_torch_engine.py \
    tests/test_likelihood.py >"$OUT/tests.log" 2>&1 && STATUS[unit_tests]=ok || STATUS[unit_tests]=FAIL
  tail -3 "$OUT/tests.log"
fi

step "summary ($((SECONDS - START)) s; results in $OUT)"
rc=0
for k in environment benchmark unit_tests; do
  [ -n "$DRY" ] && [ "$k" = unit_tests ] && continue
  echo "$k: ${STATUS[$k]:-not run}"
  [ "${STATUS[$k]:-}" = ok ] || rc=1
done
exit $rc
