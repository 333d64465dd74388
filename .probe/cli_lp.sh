#!/bin/bash
# wall time of CLI commands at LP_NUM_THREADS unset / 0, alternating
. .venv/bin/activate
export XDG_RUNTIME_DIR=/tmp
run() { local s=$(date +%s.%N); "$@" > /dev/null 2>&1; local rc=$?; echo "$(echo "$(date +%s.%N) - $s" | bc) rc=$rc"; }
for rep in 1 2; do
for cmd in "wgrumus demo" "wgrumus train gpt" "wgrumus train mlp --steps 300" "wgrumus train cnn --dp 2 --devices 2"; do
  for lp in def 0; do
    if [ $lp = def ]; then t=$(run $cmd); else t=$(LP_NUM_THREADS=0 run $cmd); fi
    printf "%-40s LP=%-4s %s\n" "$cmd" $lp "$t"
  done
done
done
