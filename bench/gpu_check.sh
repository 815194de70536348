#!/usr/bin/env bash
# The GPU check, for a machine with CUDA: under 8 minutes (its parts' time limits add up to 7 min 40 s).
#
#   1. tests marked `gpu`: the fused linear + cross-entropy's and the replica hash's Triton kernels
#      against their PyTorch references on CUDA (tests/kernels/test_kernels_gpu.py), a bf16 run of
#      the smoke model through train() with the fused loss and torch.compile (loss falls, MFU), and
#      vLLM's CUDA build against our model and transformers in fp32 (tests/infer/test_gpu.py);
#      a skipped test fails the check: on a GPU machine nothing may skip;
#   2. numbers: the fused head against the unfused one at vocab 8k/32k/128k (time with CUDA events,
#      peak memory);
#   3. bench/hash_bench.py --device cuda: the hash kernel equal to the reference on 72 tensors of
#      10 dtypes, then its time against the reference and the former hash (smoke and a 1 B model).
#
# Needs the project's environment with the GPU extra (make setup on that machine: EXTRA=gpu) or
# PYTHON naming an interpreter that has it. Writes its logs under $OUT (default
# test-artifacts/gpu). Exit 0 only when every part passed.
#
#     bench/gpu_check.sh            # or: PYTHON=/path/to/python OUT=/tmp/gpu bench/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
OUT=${OUT:-test-artifacts/gpu}
mkdir -p "$OUT"
export FACTORY_HOME=${FACTORY_HOME:-$(mktemp -d)/home} HF_HUB_OFFLINE=1 SPARK_LOCAL_IP=127.0.0.1 PYTHONUNBUFFERED=1
status=0

echo "== machine"
nvidia-smi -L || { echo "gpu_check: no GPU answers nvidia-smi"; exit 2; }
"$PY" -c "
import torch, triton, vllm
assert torch.cuda.is_available(), 'torch has no CUDA: ' + torch.__version__
print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(), '| triton', triton.__version__, '| vllm', vllm.__version__)
" || exit 2

echo "== 1. kernels, bf16 smoke run, vLLM-CUDA equivalence (tests marked gpu)"
timeout 270 "$PY" -m pytest -q -p no:cacheprovider -rs -s -m gpu tests/kernels/test_kernels_gpu.py tests/infer/test_gpu.py \
  2>&1 | tee "$OUT/tests.log"
if [ "${PIPESTATUS[0]}" -ne 0 ] || grep -q "skipped" "$OUT/tests.log"; then
  echo "gpu_check: FAILED: tests (or a test skipped on a GPU machine)"; status=1
fi

echo "== 2. numbers"
timeout 90 "$PY" - <<'PYEOF' 2>&1 | tee "$OUT/numbers.log"
import torch
from kernels import linear_cross_entropy as lce

def timed(fn, reps=5):
    fn(); torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record(); fn(); end.record(); torch.cuda.synchronize(); times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]

n, d = 16384, 1024
print(f"LM head + loss, forward + backward of {n} tokens at d_model {d}, bf16 inputs")
print(f"{'vocab':>8s} {'variant':>8s} {'ms':>8s} {'peak GiB':>9s}")
for v in (8192, 32768, 131072):
    h = torch.randn(n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (0.02 * torch.randn(v, d, device="cuda")).bfloat16().requires_grad_()
    t = torch.randint(0, v, (n,), device="cuda")
    rows = {}
    for name, fn in (("unfused", lce.reference), ("fused", lce.launch)):
        def step():
            fn(h, w, t).mean().backward(); h.grad = w.grad = None
        torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated()
        ms = timed(step)
        rows[name] = (ms, (torch.cuda.max_memory_allocated() - base) / 2**30)
        print(f"{v:>8d} {name:>8s} {ms:>8.2f} {rows[name][1]:>9.2f}")
    print(f"{v:>8d} fused/unfused: speed {rows['unfused'][0] / rows['fused'][0]:.2f}x, memory {rows['fused'][1] / rows['unfused'][1]:.2f}x")
    del h, w, t

PYEOF
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_check: FAILED: numbers"; status=1; }

echo "== 3. replica hash: the Triton kernel against the reference on 72 tensors (exact), and its cost per check"
timeout 100 "$PY" bench/hash_bench.py --device cuda 2>&1 | tee "$OUT/hash.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_check: FAILED: hash"; status=1; }

echo "== gpu_check: $([ $status -eq 0 ] && echo PASSED || echo FAILED)"
exit $status
