#!/usr/bin/env bash
# Run several full-size DiT benchmark jobs at once, one per GPU of the machine (no network there):
#     bash benchmarks/tools/run_on_gpus.sh "qwen-image --variants eager,kopt --tag a" \
#                                    "qwen-image --variants eager,kopt-no-redundancy --tag b"
# Job i runs dit.py on GPU i (CUDA_VISIBLE_DEVICES=i) with its own log, $OUT/log-<model>-<i>.txt,
# pinned to its own share of the CPU cores (taskset): one job's Inductor compile would otherwise
# slow the other's host-bound timed calls (measured: 20-30 ms per Qwen-Image forward).
# Rows of different jobs ran on different cards: compare them through each job's own eager row
# (the ratio to eager), never directly. Wheels and results as in run_on_gpu.sh.
set -euo pipefail
[ "$#" -ge 1 ] || { echo "usage: bash benchmarks/tools/run_on_gpus.sh 'MODEL [dit.py args]' ..." >&2; exit 2; }
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/benchmarks/results}"
mkdir -p "$OUT"
source benchmarks/tools/gpu_setup.sh
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
[ "$#" -le "$GPUS" ] || { echo "$# jobs but only $GPUS GPUs" >&2; exit 2; }

# SM clock and power of every card every 0.5 s (benchmarks/tools/clocks.py reads it against the logs)
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu --format=csv,noheader \
        -lms 500 > "$OUT/smi.csv" 2>&1 &
    smi=$!
    trap 'kill $smi 2>/dev/null' EXIT
fi

pids=()
i=0
cores=$(nproc)
share=$((cores / $#))
for job in "$@"; do
    read -r -a words <<< "$job"
    model="${words[0]}"
    pin=()
    if command -v taskset >/dev/null && [ "$share" -ge 1 ]; then
        pin=(taskset -c "$((i * share))-$((i * share + share - 1))")
    fi
    # Inductor's compile worker pool sized to the job's share of cores explicitly (torch versions differ on
    # whether the default follows the pinning or os.cpu_count()), and compile caches of its own per job
    # (Inductor's and Triton's take file locks: two jobs compiling at once must not wait on each other)
    CUDA_VISIBLE_DEVICES=$i PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=$share \
        TORCHINDUCTOR_CACHE_DIR="/tmp/inductor-job$i" TRITON_CACHE_DIR="/tmp/triton-job$i" KOPT_CACHE_DIR="/tmp/kopt-job$i" \
        "${pin[@]}" python3 benchmarks/dit/dit.py --size full --models "$model" \
        --out "$OUT" "${words[@]:1}" > "$OUT/log-$model-$i.txt" 2>&1 &
    pids+=($!)
    echo "job $i (GPU $i, pid ${pids[-1]}): $job"
    i=$((i + 1))
done
status=0
for j in "${!pids[@]}"; do
    wait "${pids[$j]}" || { echo "job $j failed (rc $?)"; status=1; }
done
for j in "${!pids[@]}"; do
    echo "=== job $j: tail of log ==="
    tail -n 25 "$OUT"/log-*-"$j".txt
done
exit $status
