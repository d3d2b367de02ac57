#!/usr/bin/env bash
# The benchmarks on one GPU (sized for an H200): bf16 models at their GPU size, every file under $OUT.
#
#   OUT=/path/for/results bash benchmarks/gpu.sh [more options for python -m benchmarks.run]
#
# Run it from the repository root. It needs torch (2.9 or later: 2.11 is what it was written for),
# sympy and numpy, no network and no installation: PYTHONPATH=. is enough. It plots if matplotlib
# can be imported. It finishes within 8 minutes: the runner gives each model an equal share of
# LIMIT seconds and skips the settings (last in the 'gpu' group's priority order first) and models
# that would not fit; a hard timeout interrupts it after that, and it still writes the models that
# finished.
#
# Before the runner, `python -m ckpt calibrate --device cuda` measures the GPU's profile (a second or
# so) into $OUT/profile.txt; the runner's ckpt settings plan with it and with library calls timed on
# the GPU (CKPT_MEASURE_OPS, on by default).
#
# After the runner, a one-GPU FSDP2 run (python -m benchmarks.fsdp, world size 1 on nccl) compares
# default torch.compile with ckpt at 0.5 under fully_shard, within FSDP_LIMIT seconds.
#
# Knobs (environment): MODELS (default gpt2,llama), SETTINGS (default: the 'gpu' group),
# LIMIT (default 230 seconds for the runner's schedule), FSDP_LIMIT (default 140), PYTHON
# (default python3), DEVICE (default cuda) and FSDP_SIZE (default gpu on cuda, tiny otherwise).
# A dry run of the whole script on a machine without a GPU:
#   DEVICE=cpu OUT=/tmp/gpu-try bash benchmarks/gpu.sh --quick
# Files under $OUT: profile.txt, <gpu>.md, <gpu>.json, <gpu>.png (e.g. h200.*), fsdp-<gpu>.md,
# run.log, fsdp.log, env.txt.
set -uo pipefail
: "${OUT:?set OUT to the directory that receives the results}"
PYTHON=${PYTHON:-python3}
MODELS=${MODELS:-gpt2,llama}
SETTINGS=${SETTINGS:-gpu}
LIMIT=${LIMIT:-230}
FSDP_LIMIT=${FSDP_LIMIT:-140}
DEVICE=${DEVICE:-cuda}
if [ "$DEVICE" = cuda ]; then FSDP_SIZE=${FSDP_SIZE:-gpu}; else FSDP_SIZE=${FSDP_SIZE:-tiny}; fi

mkdir -p "$OUT"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/ckpt-bench-inductor}
export CKPT_CACHE_DIR=${CKPT_CACHE_DIR:-/tmp/ckpt-bench-cache}

{
    date -u +%Y-%m-%dT%H:%M:%SZ
    git rev-parse HEAD 2>/dev/null || true
    "$PYTHON" - <<'PY'
import platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"gpu {i}: {p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs")
try:
    import matplotlib
    print("matplotlib", matplotlib.__version__)
except ImportError:
    print("matplotlib missing: no plot")
PY
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null || true
} >"$OUT/env.txt" 2>&1

if [ "$DEVICE" = cuda ]; then
    timeout 120 "$PYTHON" -m ckpt calibrate --device cuda >"$OUT/profile.txt" 2>&1 ||
        echo "calibration failed: the runner falls back to the datasheet profile" >>"$OUT/profile.txt"
fi

# The runner stops starting work after LIMIT seconds; INT after LIMIT+45 makes it write what finished
# and exit; KILL 15 seconds later is the last resort. With the FSDP2 run after it, the worst case is
# about 7.5 minutes in all.
timeout --signal=INT --kill-after=15 $((LIMIT + 45)) \
    "$PYTHON" -m benchmarks.run --device "$DEVICE" --models "$MODELS" --settings "$SETTINGS" \
    --rounds 10 --time-limit "$LIMIT" --plot auto --out "$OUT" "$@" 2>&1 | tee "$OUT/run.log"
status=${PIPESTATUS[0]}
echo "benchmarks.run exited with status $status" | tee -a "$OUT/run.log"

timeout --signal=INT --kill-after=15 $((FSDP_LIMIT + 10)) \
    "$PYTHON" -m benchmarks.fsdp --device "$DEVICE" --size "$FSDP_SIZE" --timeout "$FSDP_LIMIT" --out "$OUT" 2>&1 | tee "$OUT/fsdp.log"
fsdp_status=${PIPESTATUS[0]}
echo "benchmarks.fsdp exited with status $fsdp_status" | tee -a "$OUT/fsdp.log"
exit $((status != 0 ? status : fsdp_status))
