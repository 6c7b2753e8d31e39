#!/usr/bin/env bash
# Every check rift-hf runs on a GPU, in one go (a lent GPU comes with minutes, not hours).
#
#   bash benchmarks/gpu_session.sh [OUTDIR]      # from the repo root, on a machine with a CUDA GPU
#
# 1. the Triton kernel tests compiled for the GPU (fp32, fp16 and bf16) and the attention-backend tests;
# 2. `python -m benchmarks.kernels`: kernels against the PyTorch path, the rescoring share, and one drafter decode
#    step with a full cache against RIFT caches at 4K..128K inputs (Qwen2.5-Coder-0.5B shapes, random weights);
#    PARTS (default: all) picks its parts;
# 3. `python -m benchmarks.step --random-weights`: decode step per policy and budget, the assisted loop's ms per
#    drafted token, and whether a rift decode step can be captured in a CUDA graph; then its `compiled` part, eager vs
#    compiled (`compile=True`) drafter steps at 4K and 32K inputs.
# Real checkpoints are not needed (none of this measures acceptance). Wheels found in .whl/ (git-ignored; carry it)
# are installed into /tmp/site first, for an image with another transformers (the 2026-11-30 image had 5.17):
#   P="--python-version 3.12 --only-binary=:all: --platform manylinux2014_x86_64"
#   pip download --no-deps -d .whl $P transformers==5.23.0 tokenizers==0.23.3 safetensors==0.8.0
#   pip download -d .whl/deps $P huggingface_hub==2.4.0 typer regex
# (.whl/deps only when the image's own hub/typer/regex are too old). rift-hf runs from the checkout, given the layout
# pyproject.toml installs (links rift_hf/kernels and rift_hf/demo, git-ignored), so nothing is built. Each part has
# its own time limit and writes its output as it goes, so a part that fails or runs out of time does not cost the
# others.
set -u
if ! command -v nvidia-smi >/dev/null; then
    echo "gpu_session.sh needs a CUDA GPU (no nvidia-smi here); on CPU use: python -m benchmarks.kernels --dry-run" >&2
    exit 2
fi
OUT=${1:-benchmarks/results/gpu}
mkdir -p "$OUT" /tmp/site
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}

if compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    # Their dependencies (.whl/deps) only when the image's own versions do not satisfy them.
    if compgen -G ".whl/deps/*.whl" >/dev/null && ! PYTHONPATH=/tmp/site $PY -c "import transformers.generation" 2>/dev/null
    then
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/deps/*.whl
    fi
fi
[ -e rift_hf/kernels ] || ln -s ../kernels rift_hf/kernels
[ -e rift_hf/demo ] || ln -s ../demo rift_hf/demo
export PYTHONPATH=/tmp/site

nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
$PY - <<'EOF' 2>&1 | tee "$OUT/env.txt"
import platform, torch, transformers, triton
print("python", platform.python_version(), "torch", torch.__version__, "triton", triton.__version__,
      "transformers", transformers.__version__, "gpu", torch.cuda.get_device_name(0))
EOF

timeout ${PYTEST_LIMIT:-200} $PY -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_attention.py \
    tests/test_storage.py tests/test_cache.py \
    2>&1 | tee "$OUT/pytest-gpu.txt"
echo "pytest exit: ${PIPESTATUS[0]}" | tee -a "$OUT/pytest-gpu.txt"

PARTS=${PARTS:-window_scores indexed_attention rescore_share drafter_step}
timeout ${KERNELS_LIMIT:-300} $PY -m benchmarks.kernels --out "$OUT" --parts $PARTS 2>&1 | tee "$OUT/kernels.log"
echo "benchmarks.kernels exit: ${PIPESTATUS[0]}" | tee -a "$OUT/kernels.log"

timeout ${STEP_LIMIT:-240} $PY -m benchmarks.step --random-weights --out "$OUT/step-gpu.json" --steps 130 \
    --contexts 1024,2048,4096,8192,16384,32768 --inputs 4096,16384,32768 --policies swa,rift-stat,rift-dyn \
    --assisted-inputs 4096,16384 --parts full,plain,assisted 2>&1 | tee "$OUT/step.log"
echo "benchmarks.step exit: ${PIPESTATUS[0]}" | tee -a "$OUT/step.log"
# The CUDA-graph capture in its own process: a failed capture must not disturb the timings above.
timeout 60 $PY -m benchmarks.step --random-weights --out "$OUT/step-gpu.json" --parts graph 2>&1 | tee -a "$OUT/step.log"
# Compiled drafting (`compile=True`, CUDA graphs): an eager and a compiled drafter step in turn from one prefill, in
# its own process (a failed capture must not cost the parts above).
timeout ${COMPILED_LIMIT:-240} $PY -m benchmarks.step --random-weights --out "$OUT/step-gpu-compiled.json" --steps 64 \
    --inputs 4096,32768 --budgets 1024 --parts compiled 2>&1 | tee "$OUT/compiled.log"
echo "benchmarks.step compiled exit: ${PIPESTATUS[0]}" | tee -a "$OUT/compiled.log"
