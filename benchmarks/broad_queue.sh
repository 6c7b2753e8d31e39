#!/usr/bin/env bash
# #45's broad set, eval half, ~4K inputs (INPUT=8192 for ~8K): the default (page-round) against the full cache at
# 4x and 8x, by exact replay. One more source per family on each pass (8 prompts: four families x two regimes), so a run stopped
# anywhere holds every cell about equally; every pass resumes from the rows already written. The rows labelled
# `page-round` there were written before page-round chose again inside a round by default (rechoose_after=0, passes
# 1-4); the default since is measured under its explicit label (a resume under `page-round` is refused).
set -u
cd "$(dirname "$0")/.."
INPUT=${INPUT:-4096}
OUT=${OUT:-benchmarks/results/broad/qwen-coder/eval-${INPUT}in-256tok}
for k in $(seq "${FROM:-1}" "${TO:-8}"); do
  .venv/bin/python -m lab replay --preset qwen-coder --policies "${POLICIES:-full,page-round@rechoose_after=2}" \
    --compressions 4,8 --input-tokens "$INPUT" --new-tokens 256 --per-task "$k" --sources broad-eval \
    --experiment broad-eval --out "$OUT" || exit 1
done
