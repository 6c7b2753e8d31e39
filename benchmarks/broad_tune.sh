#!/usr/bin/env bash
# #45 item 3 on the broad set's tune half (~4K inputs, the `generate` cells, where page-round loses AL): which queries
# score a round (`score_queries`: the newest verified one, today's default, against the newest 4 and 12), page-round
# against the full cache at 4x and 8x, by exact replay. One more source per family on each pass (4 prompts), so a
# run stopped anywhere holds every family about equally; every pass resumes from the rows already written. Nothing
# here looks at the eval half.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/broad/qwen-coder/tune-4096in-256tok-score-queries}
POLICIES=${POLICIES:-full,page-round,page-round@score_queries=4,page-round@score_queries=12}
for k in $(seq "${FROM:-1}" "${TO:-8}"); do
  .venv/bin/python -m lab replay --preset qwen-coder --policies "$POLICIES" --compressions "${COMPRESSIONS:-4,8}" --input-tokens 4096 \
    --new-tokens 256 --per-task "$k" --sources broad-tune --experiment broad-tune --out "$OUT" \
    --tasks python/generate,cpp/generate,prose/generate,technical/generate || exit 1
done
