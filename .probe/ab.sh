#!/bin/bash
# alternate old (/tmp/old) and new (/work/main) quick-GPT train_step runs
. /work/main/.venv/bin/activate
export XDG_RUNTIME_DIR=/tmp
N=${N:-4}; ARGS=${ARGS:---models gpt --steps 20}
for r in $(seq $N); do
  for side in old new; do
    if [ $side = old ]; then dir=/tmp/old; else dir=/work/main; fi
    (cd $dir && PYTHONPATH=$dir python -c "import wgrumus,sys; sys.stderr.write(wgrumus.__file__+'\n')" 2>&1 | grep -q "^$dir/" || echo "WRONG PACKAGE $side";
     PYTHONPATH=$dir python benchmarks/train_step.py $ARGS 2>&1 | grep -E "^(gpt|mlp)" | sed "s/^/$side /")
  done
done
