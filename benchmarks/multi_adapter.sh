# The multi-adapter runs (2 physical GPUs of one host), each ratio against one adapter in the
# same run; one log per part under $1 (default: results/). Every part has its own time limit.
#   bash benchmarks/multi_adapter.sh /tmp/out            # all parts
#   PARTS="comm dp" bash benchmarks/multi_adapter.sh     # some of them
# mpi parts need mpiexec on PATH (pip's `mpich` wheel: MPI4PY_MPIABI=mpich and its lib/ on
# LD_LIBRARY_PATH); each rank gets its own adapter through WGRUMUS_ADAPTER (MPMD form; plain
# mpiexec -n 2 does the same now: init_process_group opens the local rank's adapter only).
set -u
OUT=${1:-benchmarks/results}
PY=${PYTHON:-python3}
PARTS=${PARTS:-"comm dp mpi pipe p3d"}
export PYTHONUNBUFFERED=1
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  echo "### $(date -u +%H:%M:%S) $*" | tee -a "$OUT/$name.txt"
  timeout "$limit" "$@" 2>&1 | tee -a "$OUT/$name.txt"
  echo "### exit ${PIPESTATUS[0]}" | tee -a "$OUT/$name.txt"
}
mpi2() {  # name limit script args...: one process per adapter
  local name=$1 limit=$2; shift 2
  run "$name" "$limit" mpiexec -n 1 env WGRUMUS_ADAPTER=0 "$PY" "$@" : -n 1 env WGRUMUS_ADAPTER=1 "$PY" "$@"
}
for part in $PARTS; do case $part in
  comm) run comm 200 "$PY" benchmarks/collectives.py --backend comm --ranks 2 \
          --sizes 1048576,4194304,16777216,67108864,268435456 ;;
  dp)   run dp 240 "$PY" benchmarks/data_parallel.py --devices 1 2 --jit
        run dp 240 "$PY" benchmarks/data_parallel.py --devices 1 2 --jit --batch 64 ;;
  mpi)  mpi2 mpi 240 benchmarks/data_parallel.py --backend mpi --jit
        mpi2 mpi 240 benchmarks/data_parallel.py --backend mpi --jit --batch 64 ;;
  pipe) WGRUMUS_DEVICES=2 run pipe 240 "$PY" benchmarks/pipeline.py -p 2 -m 4 8 --width 1024 \
          --mb-size 256 --repeats 2 ;;
  p3d)  for s in 1f1b interleaved; do
          run p3d 200 "$PY" benchmarks/parallel3d.py --devices 2 --schedule "$s" \
            --layouts 1x1x1,2x1x1,1x2x1,1x1x2
        done ;;
esac; done
