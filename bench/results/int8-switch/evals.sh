#!/bin/bash
# evals.sh SEED: `training eval` and the photo/printed exams (quality.py) for $AB_WORK/{F,Q,C}SEED
cd "$(dirname "$0")/../../.."
S=$1
for n in F Q C; do
  OMP_NUM_THREADS=1 .venv/bin/python -m training eval --artifacts ${AB_WORK:-/tmp/quant}/$n$S --threads 1 --out ${AB_WORK:-/tmp/quant}/eval.$n$S.json > ${AB_WORK:-/tmp/quant}/eval.$n$S.log 2>&1
done
AB_REPO=$PWD OMP_NUM_THREADS=1 .venv/bin/python bench/results/int8-switch/quality.py 500 ${AB_WORK:-/tmp/quant}/exam$S.json ${AB_WORK:-/tmp/quant}/F$S ${AB_WORK:-/tmp/quant}/Q$S ${AB_WORK:-/tmp/quant}/C$S > ${AB_WORK:-/tmp/quant}/quality$S.log 2>&1
echo done > ${AB_WORK:-/tmp/quant}/evals$S.done
