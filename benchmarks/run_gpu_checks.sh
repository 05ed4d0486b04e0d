#!/usr/bin/env bash
# The GPU checks in one command, for a machine with an NVIDIA GPU (torch with CUDA, onnx, onnxruntime):
#   1. the torch backend's tests on cuda        (HYBRID_TEST_DEVICE=cuda tests/test_torch_backend.py)
#   2. every test marked gpu                    (GPU memory pool, TensorRT engine, gpu target selection)
#   3. the GPU benchmark                        (benchmarks/gpu.py: hybrid cuda vs torch eager vs ORT CPU)
# Results go to $OUT (default ${TMPDIR:-/tmp}/hybrid-gpu-checks): pytest logs, environment.txt, gpu_results.md.
# Installs nothing from the network. A missing pure-Python dependency (onnx-ir, pytest, ...) is installed
# from $HYBRID_WHEELHOUSE when that folder is given (pip --no-index). Without a CUDA device every GPU
# step is skipped and the script exits 0. Exit status: 1 if any step that ran failed.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-${TMPDIR:-/tmp}/hybrid-gpu-checks}"
mkdir -p "$OUT"
export OUT
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-$(command -v python || command -v python3)}"
STEP_TIMEOUT="${STEP_TIMEOUT:-540}"

missing=$("$PY" - <<'EOF'
import importlib.util
need = ["numpy", "onnx", "onnx_ir", "onnxruntime", "ml_dtypes", "torch", "pytest"]
print(" ".join(m for m in need if importlib.util.find_spec(m) is None))
EOF
)
if [ -n "$missing" ]; then
    if [ -n "${HYBRID_WHEELHOUSE:-}" ] && [ -d "$HYBRID_WHEELHOUSE" ]; then
        echo "installing from $HYBRID_WHEELHOUSE: $missing"
        "$PY" -m pip install --no-index --find-links "$HYBRID_WHEELHOUSE" ${missing//_/-} >"$OUT/pip.txt" 2>&1 \
            || { echo "offline install failed (see $OUT/pip.txt)"; exit 1; }
    else
        echo "missing Python modules: $missing (set HYBRID_WHEELHOUSE to a folder of wheels to install them offline)"
        exit 1
    fi
fi

"$PY" - <<'EOF' | tee "$OUT/environment.txt"
import platform, torch, onnx, onnxruntime
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"onnx {onnx.__version__}, onnxruntime {onnxruntime.__version__} {onnxruntime.get_available_providers()}")
if torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        print(f"cuda:{i} {p.name}, {p.total_memory / 2**30:.1f} GiB, compute {p.major}.{p.minor}")
else:
    print("no CUDA device visible to torch")
EOF

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA device: GPU checks skipped"
    exit 0
fi

status=0
run() {  # run NAME CMD...: log to $OUT/NAME.txt, remember failures, keep going
    local name="$1"; shift
    echo "== $name: $*"
    timeout "$STEP_TIMEOUT" "$@" 2>&1 | tee "$OUT/$name.txt"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc"
    [ "$rc" -eq 0 ] || status=1
}

run pytest_torch_cuda env HYBRID_TEST_DEVICE=cuda "$PY" -m pytest tests/test_torch_backend.py -q -m "not slow" \
    -p no:cacheprovider -o addopts="-ra"
run pytest_gpu_marked "$PY" -m pytest tests -q -m gpu -p no:cacheprovider -o addopts="-ra"
run gpu_benchmark "$PY" benchmarks/gpu.py --out "$OUT/gpu_results.md"
echo "results in $OUT (exit $status)"
exit $status
