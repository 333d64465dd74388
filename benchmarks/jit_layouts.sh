# wr.jit against eager in every layout `wgrumus train` accepts, 8 logical devices of one GPU:
# seconds (including two eager warm-up steps), throughput and final loss per run (the losses must match).
#   bash benchmarks/jit_layouts.sh
for L in "" "--dp 2" "--tp 2" "--pp 2" "--pp 2 --schedule interleaved" "--pp 2 --schedule zb-h1" "--dp 2 --tp 2 --pp 2"; do for J in --no-jit --jit; do
  timeout 100 env WGRUMUS_DEVICES=8 ${PYTHON:-python3} -m wgrumus train gpt --n-layer 4 --n-embd 256 --block-size 128 --batch-size 16 $L --steps 30 --json $J 2>/dev/null | ${PYTHON:-python3} -c "import json,sys; d=json.load(sys.stdin); print('gpt $L $J', round(d['seconds'],2), round(d['throughput']), d['final_loss'], flush=True)"
done; done
for L in "--dp 2" "--pp 2" "--dp 2 --pp 2"; do for J in --no-jit --jit; do
  timeout 100 env WGRUMUS_DEVICES=8 ${PYTHON:-python3} -m wgrumus train mlp $L --steps 200 --json $J 2>/dev/null | ${PYTHON:-python3} -c "import json,sys; d=json.load(sys.stdin); print('mlp $L $J', round(d['seconds'],2), round(d['throughput']), d['final_loss'], flush=True)"
done; done
