#!/usr/bin/env bash
# Training across 2 or 4 physical adapters of one host, every figure a ratio against one adapter
# (or one GPU for PyTorch) measured in the same run. Parts:
#   cli   `wgrumus train gpt` data parallel: 1 adapter, --dp 2, --dp 4 (weak scaling: sequences
#         per adapter fixed), exact f32, --grad-comm f16, --sync-every 8; and PyTorch DDP (NCCL,
#         benchmarks/torch_reference.py under torchrun) on the same models: 1, 2, 4 GPUs
#   pp    pipeline layouts against 1 adapter at the same global batch
#   tp    tensor-parallel layouts against 1 adapter at the same global batch, each tp layout
#         with its row-parallel all-reduce in 1 and in 2 token chunks (--tp-chunks) and the tp2
#         row also without the column-parallel backward overlap (--no-tp-overlap)
#   loss  (not in the default PARTS) the final loss of --grad-comm f16 and --sync-every 8 after
#         LOSS_STEPS (default 300) steps against exact data parallel, dp 2 and 4 (target: 2%)
#   comm  benchmarks/collectives.py: latency of send/recv and all-reduce, 4 KB-16 MB, 2 and 4 ranks
#         (processes backend, with the host copy and PCIe copies of the same run), then the
#         all-reduce bandwidth of the processes and comm backends against their bounds
# Models: mini = GPT-mini (4 layers, d 256, 4 heads, T 128; 16 sequences per adapter in cli),
#         gpt2 = GPT-2-small width (12 layers, d 768, 12 heads, T 256; 8 per adapter in cli).
# Steady-state tokens/s comes from `wgrumus train --json`'s "steady" field (warm-up excluded).
#
#   bash benchmarks/multi_adapter.sh OUT                  # every part into folder OUT
# A command of the device tool runs at most 10 minutes; on a 4-GPU host use three calls (each
# ~10-13 runs of 15-30 s: process start, shader compiles, capture, then the measured steps):
#   PARTS="cli comm" MODELS=mini bash benchmarks/multi_adapter.sh OUT
#   PARTS=cli MODELS=gpt2 bash benchmarks/multi_adapter.sh OUT
#   PARTS="pp tp" bash benchmarks/multi_adapter.sh OUT
#   PARTS=loss MODELS=gpt2 bash benchmarks/multi_adapter.sh OUT   # 6 runs of 300 steps
#   QUICK=1 bash benchmarks/multi_adapter.sh /tmp/ma      # tiny sizes, logical devices: a check
#                                                          # that the script runs (lavapipe)
# Settings (environment): PARTS (default "cli pp tp comm"), ADAPTERS (2 or 4, default 4: rows
# needing more are skipped), MODELS (default "mini gpt2"), BACKEND (wgrumus --backend; unset:
# the CLI's default; "mpi" launches mpiexec -n WORLD), PYTHON, TORCHRUN (default torchrun),
# LIMIT (seconds per run), STEPS_MINI / STEPS_GPT2 (optimizer steps per run), TP_CHUNKS (the
# --tp-chunks values of the tp part, default "1 2"), TP_NO_OVERLAP (1, default: the tp2 rows
# once more with --no-tp-overlap; 0: not).
# Raw logs: OUT/<part>.log (and OUT/raw/); records: OUT/runs.jsonl (calls into one OUT add up);
# the tables print after each part and together at the end.
set -u
OUT=${1:-benchmarks/results/multi_adapter}
PY=${PYTHON:-python3}
PARTS=${PARTS:-"cli pp tp comm"}
ADAPTERS=${ADAPTERS:-4}
MODELS=${MODELS:-"mini gpt2"}
BACKEND=${BACKEND:-}
TORCHRUN=${TORCHRUN:-torchrun}
QUICK=${QUICK:-0}
TP_CHUNKS=${TP_CHUNKS:-"1 2"}
TP_NO_OVERLAP=${TP_NO_OVERLAP:-1}
HERE=$(cd "$(dirname "$0")" && pwd)
TABLE="$PY $HERE/multi_adapter_table.py"
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/raw"

if [ "$QUICK" = 1 ]; then  # tiny models on logical devices of one adapter: the script's check
  export WGRUMUS_DEVICES=${WGRUMUS_DEVICES:-$ADAPTERS}
  LIMIT=${LIMIT:-240}; STEPS_MINI=${STEPS_MINI:-5}; STEPS_GPT2=${STEPS_GPT2:-5}
  MODELS=${MODELS_QUICK:-mini}
  model_flags() { echo "--n-layer 4 --n-embd 32 --n-head 4 --block-size 16"; }
  per_adapter() { echo 2; }
  TORCH_DEV="--cpu"
  SIZES=4096,65536,1048576
else
  LIMIT=${LIMIT:-150}; STEPS_MINI=${STEPS_MINI:-150}; STEPS_GPT2=${STEPS_GPT2:-50}
  model_flags() {
    case $1 in
      mini) echo "--n-layer 4 --n-embd 256 --n-head 4 --block-size 128" ;;
      gpt2) echo "--n-layer 12 --n-embd 768 --n-head 12 --block-size 256" ;;
    esac
  }
  per_adapter() { case $1 in mini) echo 16 ;; gpt2) echo 8 ;; esac; }
  TORCH_DEV=""
  SIZES=4096,16384,65536,262144,524288,1048576,4194304,16777216
fi
LOSS_STEPS=${LOSS_STEPS:-300}; [ "$QUICK" = 1 ] && LOSS_STEPS=${LOSS_STEPS_QUICK:-5}
steps_of() { case $1 in mini) echo "$STEPS_MINI" ;; gpt2) echo "$STEPS_GPT2" ;; esac; }

N=0
# record PART MODEL ROW WORLD REF TARGET CMD...: run CMD under $LIMIT, its output in OUT/raw,
# its tail in OUT/PART.log and its row in the table
record() {
  local part=$1 model=$2 row=$3 world=$4 ref=$5 target=$6; shift 6
  N=$((N + 1))
  local raw="$OUT/raw/$part-$N.txt"
  echo "### $(date -u +%H:%M:%S) $part $model $row: $*" | tee -a "$OUT/$part.log"
  timeout "$LIMIT" "$@" >"$raw" 2>&1
  local rc=$?
  tail -n 3 "$raw" | cut -c1-400 >>"$OUT/$part.log"
  echo "### exit $rc" >>"$OUT/$part.log"
  [ $rc -ne 0 ] && tail -n 5 "$raw"
  $TABLE add "$OUT" "$part" "$model" "$row" "$world" "$ref" "$target" "$rc" "$raw"
}

# wg PART MODEL ROW REF TARGET WORLD FLAGS...: one `wgrumus train gpt` run and its record
wg() {
  local part=$1 model=$2 row=$3 ref=$4 target=$5 world=$6; shift 6
  if [ "$world" -gt "$ADAPTERS" ]; then
    echo "--- $part $model $row: needs $world adapters (ADAPTERS=$ADAPTERS), skipped"; return
  fi
  local cmd=("$PY" -m wgrumus train gpt $(model_flags "$model") --steps "$(steps_of "$model")"
             "$@" --json)
  if [ -n "$BACKEND" ] && [ "$world" -gt 1 ]; then
    cmd+=(--backend "$BACKEND")
    [ "$BACKEND" = mpi ] && cmd=(mpiexec -n "$world" "${cmd[@]}")
  fi
  record "$part" "$model" "$row" "$world" "$ref" "$target" "${cmd[@]}"
}

HAVE_TORCH=0
"$PY" -c "import torch" 2>/dev/null && HAVE_TORCH=1
# pt PART MODEL ROW REF WORLD: benchmarks/torch_reference.py on WORLD GPUs (DDP above one)
pt() {
  local part=$1 model=$2 row=$3 ref=$4 world=$5
  if [ "$HAVE_TORCH" != 1 ]; then echo "--- $part $model $row: PyTorch not installed, skipped"
    return; fi
  if [ "$world" -gt "$ADAPTERS" ]; then echo "--- $part $model $row: skipped"; return; fi
  local m; m=$(model_flags "$model")
  local cmd=("$PY" "$HERE/torch_reference.py" $m --vocab 64
             --batch "$(per_adapter "$model")" --steps "$(steps_of "$model")" $TORCH_DEV --json)
  [ "$world" -gt 1 ] && cmd=("$TORCHRUN" --standalone --nproc_per_node "$world" "${cmd[@]:1}")
  record "$part" "$model" "$row" "$world" "$ref" - "${cmd[@]}"
}

# coll ARGS: benchmarks/collectives.py with ARGS (word-split), its tables into OUT/comm.log
coll() {
  echo "### $(date -u +%H:%M:%S) comm: collectives.py $1" | tee -a "$OUT/comm.log"
  # shellcheck disable=SC2086
  timeout "$LIMIT" "$PY" "$HERE/collectives.py" $1 2>&1 | tee -a "$OUT/comm.log"
  echo "### exit ${PIPESTATUS[0]}" >>"$OUT/comm.log"
}

# targets (issue figures): t MODEL ROW -> minimum ratio, or "-"
t() {
  [ "$QUICK" = 1 ] && { echo -; return; }  # tiny models on lavapipe: no targets
  case "$1 $2" in
    "mini dp2") echo 1.8 ;; "mini dp4") echo 3.3 ;;
    "gpt2 dp2") echo 1.7 ;; "gpt2 dp4") echo 2.2 ;;
    "gpt2 dp2 f16") echo 1.85 ;; "gpt2 dp4 f16") echo 3.0 ;;
    "gpt2 dp2 sync8") echo 1.9 ;; "gpt2 dp4 sync8") echo 3.5 ;;
    "mini pp2 m8") echo 1.3 ;; "gpt2 pp2 m8") echo 1.5 ;; "gpt2 pp4 m16") echo 2.4 ;;
    "gpt2 dp2 pp2 m8") echo 2.4 ;; "gpt2 tp2 b8"|"gpt2 tp2 b8 "*) echo 0.75 ;;
    *) echo - ;;
  esac
}

for part in $PARTS; do case $part in
  cli)
    for m in $MODELS; do
      b=$(per_adapter "$m")
      wg cli "$m" "1 adapter" "" - 1 --batch-size "$b"
      for k in 2 4; do
        wg cli "$m" "dp$k" "1 adapter" "$(t "$m" "dp$k")" $k --dp $k --batch-size $((k * b))
        wg cli "$m" "dp$k f16" "1 adapter" "$(t "$m" "dp$k f16")" $k --dp $k \
          --batch-size $((k * b)) --grad-comm f16
        wg cli "$m" "dp$k sync8" "1 adapter" "$(t "$m" "dp$k sync8")" $k --dp $k \
          --batch-size $((k * b)) --sync-every 8
      done
      pt cli "$m" "torch 1 GPU" "" 1
      pt cli "$m" "torch DDP 2" "torch 1 GPU" 2
      pt cli "$m" "torch DDP 4" "torch 1 GPU" 4
    done
    $TABLE table "$OUT" cli ;;
  pp)
    g=32; [ "$QUICK" = 1 ] && g=16
    for m in $MODELS; do
      wg pp "$m" "1 adapter b$g" "" - 1 --batch-size $g
      wg pp "$m" "pp2 m8" "1 adapter b$g" "$(t "$m" "pp2 m8")" 2 --pp 2 --micro-batches 8 \
        --batch-size $g
      if [ "$m" = gpt2 ] || [ "$QUICK" = 1 ]; then
        wg pp "$m" "pp4 m16" "1 adapter b$g" "$(t "$m" "pp4 m16")" 4 --pp 4 \
          --micro-batches 16 --batch-size $g
        wg pp "$m" "dp2 pp2 m8" "1 adapter b$g" "$(t "$m" "dp2 pp2 m8")" 4 --dp 2 --pp 2 \
          --micro-batches 8 --batch-size $g
      fi
    done
    $TABLE table "$OUT" pp ;;
  tp)
    # wtp MODEL ROW REF WORLD FLAGS...: the row once per --tp-chunks value (ROW c2, ...)
    wtp() {
      local m=$1 row=$2 ref=$3 world=$4; shift 4
      for c in $TP_CHUNKS; do
        local name=$row; [ "$c" != 1 ] && name="$row c$c"
        wg tp "$m" "$name" "$ref" "$(t "$m" "$name")" "$world" "$@" --tp-chunks "$c"
      done
    }
    for m in $MODELS; do
      b=16; [ "$m" = gpt2 ] && b=8; [ "$QUICK" = 1 ] && b=4
      wg tp "$m" "1 adapter b$b" "" - 1 --batch-size $b
      wtp "$m" "tp2 b$b" "1 adapter b$b" 2 --tp 2 --batch-size $b
      if [ "$TP_NO_OVERLAP" = 1 ]; then
        wg tp "$m" "tp2 b$b no-overlap" "1 adapter b$b" "$(t "$m" "tp2 b$b no-overlap")" 2 \
          --tp 2 --batch-size $b --no-tp-overlap
      fi
      if [ "$m" = gpt2 ]; then
        wtp "$m" "tp4 b$b" "1 adapter b$b" 4 --tp 4 --batch-size $b
      else
        wg tp "$m" "1 adapter b$((2 * b))" "" - 1 --batch-size $((2 * b))
        wtp "$m" "dp2 tp2 b$((2 * b))" "1 adapter b$((2 * b))" 4 --dp 2 --tp 2 \
          --batch-size $((2 * b))
      fi
    done
    $TABLE table "$OUT" tp ;;
  comm)  # the processes backend's latency table (send/recv and all-reduce, 4 KB-16 MB, with the
         # host copy and one-way PCIe copies of the same sizes), then the bandwidth tables
    ranks=2; [ "$ADAPTERS" -ge 4 ] && ranks=2,4
    if [ "$QUICK" = 1 ]; then
      coll "--backend threads --ranks $ranks --sizes $SIZES"
    else
      coll "--backend processes --ranks $ranks --latency-sizes $SIZES"
      coll "--backend comm --ranks $ranks --sizes 1048576,16777216,67108864"
    fi ;;
  loss)  # --grad-comm f16 and --sync-every 8 against exact data parallel after LOSS_STEPS
    for m in $MODELS; do
      b=$(per_adapter "$m")
      for k in 2 4; do
        STEPS_MINI=$LOSS_STEPS STEPS_GPT2=$LOSS_STEPS wg loss "$m" "dp$k exact" "" - $k \
          --dp $k --batch-size $((k * b))
        STEPS_MINI=$LOSS_STEPS STEPS_GPT2=$LOSS_STEPS wg loss "$m" "dp$k f16" "dp$k exact" - $k \
          --dp $k --batch-size $((k * b)) --grad-comm f16
        STEPS_MINI=$LOSS_STEPS STEPS_GPT2=$LOSS_STEPS wg loss "$m" "dp$k sync8" "dp$k exact" - \
          $k --dp $k --batch-size $((k * b)) --sync-every 8
      done
    done
    $TABLE table "$OUT" loss ;;
  *) echo "unknown part '$part' (parts: cli pp tp comm loss)"; exit 2 ;;
esac; done

echo
echo "==================== summary ($(date -u +%Y-%m-%dT%H:%MZ), ADAPTERS=$ADAPTERS) ===================="
$TABLE table "$OUT"
