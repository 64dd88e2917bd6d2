#!/bin/bash
# Served A/B: Q0 (torch.ao int8), C0 (PT2E + AOTInductor int8), F0 (float) of one seed-0 network, through the main
# benchmark's ceiling, TorchServe shipped and the python runtime; order Q C F F C Q.
cd "$(dirname "$0")/../../.."
i=0
for n in Q C F F C Q; do
  i=$((i+1))
  echo "$(date -u +%H:%M:%S) round $i $n $(uptime | sed 's/.*load average/load/')" >> ${AB_WORK:-/tmp/quant}/ab.log
  OMP_NUM_THREADS=1 .venv/bin/python -m bench run --artifacts ${AB_WORK:-/tmp/quant}/${n}0 --sections ceiling,rest,peers \
    --configs shipped --peers python --concurrency 1,16,64 --trials 2 --duration 5 \
    --out ${AB_WORK:-/tmp/quant}/ab/$i-$n > ${AB_WORK:-/tmp/quant}/ab/$i-$n.log 2>&1
done
echo "$(date -u +%H:%M:%S) done $(uptime | sed 's/.*load average/load/')" >> ${AB_WORK:-/tmp/quant}/ab.log
