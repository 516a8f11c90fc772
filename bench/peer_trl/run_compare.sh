#!/usr/bin/env bash
# fbrl (standard decode mode, standard estimator) vs TRL GRPOTrainer on the same GRPO job, back to back.
#
#   run_compare.sh [--config FILE] [--hf DIR] [--bench] STEPS
#     e.g. run_compare.sh 40                  (the tiny job, configs/tiny.yaml; smoke: run_compare.sh 3)
#          EXTRA=train.eval_n=100 run_compare.sh --config $FBRL_ROOT/configs/smollm_rl.yaml \
#              --hf $FBRL_ROOT/runs/smollm2/hf --bench 5       (SmolLM2-135M-Instruct: REAL_MODEL.md)
#
#   --config FILE  the fbrl config of both jobs (default $FBRL_CONFIG, else configs/tiny.yaml)
#   --hf DIR       TRL loads this existing plain Llama (the stock model the FBT was converted from), after
#                  `export_llama.py SRC --check DIR` shows it is the FBT in standard mode (every tensor bit-equal,
#                  logits equal on $CHECK_ROWS rows of the config's task, default 8); without --hf the FBT is
#                  exported to RUN/llama and TRL loads that
#   --bench        after TRL, bench_torch.py: bare torch fwd+bwd+AdamW of the same model on the rows of TRL's
#                  median step (the machine's practical learner limit), BENCH_THREADS (2,1) x BENCH_MICRO (4,16)
#
# Run from the fbrl checkout (`make peer-compare STEPS=40`). Env (defaults): FBRL_ROOT=the current directory
#   FBRL_VENV=$FBRL_ROOT/.venv  TRL_VENV=$FBRL_ROOT/.venv-peer (`make peer-venv` makes it)
#   FBRL_CONFIG=$FBRL_ROOT/configs/tiny.yaml  WORK=$TMP/peer_trl_work  NICE=10 (nice level of both runs)
#   EXTRA="key=value ..." (more fbrl overrides, applied to both jobs)  ONLY=fbrl|trl (run one side)
#   TRL_THREADS=N (torch threads of the TRL process; default torch's own = the core count)
#   FBRL_THREADS=N (OMP_NUM_THREADS of the fbrl process, inherited by its Ray workers, whose torch threads follow
#     it; unset: Ray sets each actor's to its CPUs, i.e. 1 thread per learner rank)
# Writes $WORK/run_<date>_<STEPS>/{llama/, step_prompts.json, fbrl/, fbrl.log, fbrl.timeline, trl/, trl.log,
# trl.timeline, bench_torch.json, summary.txt}; nothing under FBRL_ROOT but the peer venv. The last line printed is
# the one-line summary.
set -euo pipefail

HF_DIR="" BENCH=0
while [ $# -gt 1 ]; do
  case "$1" in
    --config) FBRL_CONFIG=$2; shift 2 ;;
    --hf) HF_DIR=$2; shift 2 ;;
    --bench) BENCH=1; shift ;;
    *) echo "run_compare.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
STEPS=${1:?usage: run_compare.sh [--config FILE] [--hf DIR] [--bench] STEPS}
[[ "$STEPS" =~ ^[1-9][0-9]*$ ]] || { echo "run_compare.sh: STEPS must be a positive integer" >&2; exit 2; }
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TMP=${TMPDIR:-$(python3 -c "import tempfile; print(tempfile.gettempdir())")}
FBRL_ROOT=${FBRL_ROOT:-$PWD}
[ -f "$FBRL_ROOT/configs/tiny.yaml" ] || { echo "run_compare.sh: run it from the fbrl checkout (or set FBRL_ROOT)" >&2; exit 2; }
FBRL_VENV=${FBRL_VENV:-$FBRL_ROOT/.venv}
TRL_VENV=${TRL_VENV:-$FBRL_ROOT/.venv-peer}
FBRL_CONFIG=${FBRL_CONFIG:-$FBRL_ROOT/configs/tiny.yaml}
FBRL_CONFIG=$(realpath "$FBRL_CONFIG"); [ -n "$HF_DIR" ] && HF_DIR=$(realpath "$HF_DIR")  # the runs cd elsewhere
FBRL_VENV=$(realpath "$FBRL_VENV"); TRL_VENV=$(realpath "$TRL_VENV")  # `make peer-compare` passes .venv-peer
WORK=${WORK:-$TMP/peer_trl_work}
NICE=${NICE:-10}
RUN=$WORK/run_$(date +%Y%m%d-%H%M%S)_${STEPS}
export PYTHONDONTWRITEBYTECODE=1 TOKENIZERS_PARALLELISM=false   # never write __pycache__ into FBRL_ROOT

# The comparison's fbrl settings: latent feedback off (decode mode and likelihood estimator `standard`, eval in
# standard mode), evals only before step 1 and after the last step (as the TRL side), no mid-run checkpoints (TRL
# saves none), no experiment tracker on either side (TRL: report_to=none). Everything else: the config file.
OVR=(rollout.decode_mode=standard likelihood.estimator=standard "train.eval_decode_modes=[standard]"
     "train.steps=$STEPS" "train.eval_every=$STEPS" train.checkpoint_every=0 logging.wandb_mode=disabled)
# shellcheck disable=SC2206
[ -n "${EXTRA:-}" ] && OVR+=($EXTRA)

[ -f "$FBRL_VENV/.fbrl-installed" ] || { echo "run_compare.sh: fbrl venv $FBRL_VENV not installed (make venv)" >&2; exit 2; }
if ! "$TRL_VENV/bin/python" -c "import trl, sys; sys.exit(trl.__version__ != '1.16.0')" 2>/dev/null; then
  echo "run_compare.sh: no TRL 1.16.0 in $TRL_VENV: run \`make peer-venv\` first (or set TRL_VENV)" >&2; exit 2
fi
mkdir -p "$RUN"
cd "$RUN"
load() { cut -d' ' -f1-3 /proc/loadavg; }
# the monotonic clock (stamp_lines.py reads the same one): a virtual machine paused by its host does not count
now() { python3 -c 'import time; print(time.monotonic())'; }
busy=$(awk '{print ($1 > 0.5)}' /proc/loadavg)
[ "$busy" = 1 ] && echo "warning: the machine is busy (load $(load)): both jobs run at nice $NICE, so other work takes the" \
  "cores first and s/step measures the neighbours as much as the frameworks (TRL's 2 torch threads stall worst:" \
  "TRL_THREADS=1 is ~10x faster under contention); compare ratios only from a quiet machine"

echo "== fbrl config $FBRL_CONFIG + ${OVR[*]}; nice $NICE"
cfg_value() {  # a value of the resolved fbrl config (config file + overrides), e.g. cfg_value model.path
  "$FBRL_VENV/bin/python" - "$1" "$FBRL_CONFIG" "${OVR[@]}" <<'EOF' 2>/dev/null | tail -1
import sys
from rl.config import load_config
print(load_config(sys.argv[2], sys.argv[3:]).get(sys.argv[1]))
EOF
}
model_path=$(cfg_value model.path)
if [ -n "$HF_DIR" ]; then
  echo "== check: $HF_DIR is $model_path in standard mode (bit-equal tensors; logits on ${CHECK_ROWS:-8} rows of the task)"
  "$FBRL_VENV/bin/python" "$HERE/export_llama.py" "$model_path" --check "$HF_DIR" --config "$FBRL_CONFIG" \
    --rows "${CHECK_ROWS:-8}" 2>&1 | grep '^export_llama'
  TRL_MODEL=$HF_DIR
else
  echo "== export: $model_path -> $RUN/llama (plain LlamaForCausalLM, checked bit-equal)"
  "$FBRL_VENV/bin/python" "$HERE/export_llama.py" "$model_path" "$RUN/llama" 2>&1 | grep '^export_llama'
  TRL_MODEL=$RUN/llama
fi
# each step's prompts and their token counts as fbrl's loop draws them (the learner phase's tokens/s, summarize.py)
"$FBRL_VENV/bin/python" "$HERE/step_prompts.py" --config "$FBRL_CONFIG" --out "$RUN/step_prompts.json" "${OVR[@]}" \
  2>&1 | grep '^step_prompts'

if [ "${ONLY:-}" != trl ]; then
  echo "== fbrl train (standard mode), $STEPS steps, OMP_NUM_THREADS=${FBRL_THREADS:-unset}; uptime: $(uptime)"
  t0=$(now)
  ( if [ -n "${FBRL_THREADS:-}" ]; then export OMP_NUM_THREADS=$FBRL_THREADS; fi
    nice -n "$NICE" "$FBRL_VENV/bin/fbrl" train "$FBRL_CONFIG" "${OVR[@]}" "run_dir=$RUN/fbrl" ) 2>&1 \
    | "$FBRL_VENV/bin/python" -u "$HERE/stamp_lines.py" "$RUN/fbrl.timeline" "$t0" | tee "$RUN/fbrl.log"
  echo "fbrl process wall $(awk "BEGIN{printf \"%.1f\", $(now) - $t0}") s" | tee -a "$RUN/fbrl.log"
fi
if [ "${ONLY:-}" != fbrl ]; then
  echo "== TRL GRPOTrainer, $STEPS steps, model $TRL_MODEL; uptime: $(uptime)"
  t0=$(now)
  PYTHONPATH="$FBRL_ROOT" nice -n "$NICE" "$TRL_VENV/bin/python" "$HERE/run_trl.py" --model "$TRL_MODEL" \
    --out "$RUN/trl" --threads "${TRL_THREADS:-0}" --config "$FBRL_CONFIG" "${OVR[@]}" 2>&1 \
    | "$FBRL_VENV/bin/python" -u "$HERE/stamp_lines.py" "$RUN/trl.timeline" "$t0" \
    | grep --line-buffered -v -e 'Loading weights' | tee "$RUN/trl.log"
  echo "trl process wall $(awk "BEGIN{printf \"%.1f\", $(now) - $t0}") s" | tee -a "$RUN/trl.log"
fi
if [ "$BENCH" = 1 ]; then
  if [ -f "$RUN/trl/result.json" ]; then
    echo "== bare torch fwd+bwd+AdamW on the rows of TRL's median step; uptime: $(uptime)"
    nice -n "$NICE" "$TRL_VENV/bin/python" "$HERE/bench_torch.py" --model "$TRL_MODEL" --shapes "$RUN/trl/result.json" \
      --threads "${BENCH_THREADS:-2,1}" --micro-batches "${BENCH_MICRO:-4,16}" --lr "$(cfg_value learner.lr)" \
      --out "$RUN/bench_torch.json" 2>&1 | grep --line-buffered -v -e 'Loading weights' | tee "$RUN/bench_torch.log"
  else
    echo "== --bench: no $RUN/trl/result.json (TRL did not run) to take the row shapes from: skipped"
  fi
fi
echo "== done, load $(load)"

python3 "$HERE/summarize.py" "$RUN" "$STEPS" | tee "$RUN/summary.txt"
