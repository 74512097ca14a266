#!/usr/bin/env bash
# Several benchmark steps in one device call (one lease, no cold start between them):
#
#     bash benchmarks/tools/device_steps.sh "STEP" ["STEP" ...]
#
# Each STEP is a command line, run in order with two helpers defined:
#   dit TAG TIMEOUT_S [dit.py args]    benchmarks/dit/dit.py --size full ($SIZE) --tag TAG, stopped at TIMEOUT_S
#   agent WORKLOAD BUDGET_MIN TIMEOUT_S KB_SEED [agent_run args]
#                                      python -m benchmarks.agent_run on a copy of the knowledge base
#                                      KB_SEED (a path in the checkout, e.g. benchmarks/results/kb-*.sqlite;
#                                      "none" for a fresh one), stopped at TIMEOUT_S
# e.g. bash benchmarks/tools/device_steps.sh \
#        "dit s31e 330 --models gemma2 --variants torch.compile+graphs,kopt-regional --no-ceilings" \
#        "agent llama 7.5 555 benchmarks/results/kb-agent-llama-s23c.sqlite --fp8"
#
# Results, logs and knowledge bases go to $OUT/r; after every step all of it is packed into
# $OUT/res.tgz, because the device returns at most 8 files and a step cut off by the call's limit
# must not take the earlier steps' results with it. Needs .whl/ carried (gpu_setup.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:?set by the device machine}"
export PYTHONUNBUFFERED=1
source benchmarks/tools/gpu_setup.sh > "$OUT/setup.txt" 2>&1
tail -1 "$OUT/setup.txt"
R="$OUT/r"
mkdir -p "$R"

dit() {
    local tag=$1 limit=$2
    shift 2
    timeout "$limit" python3 benchmarks/dit/dit.py --size "${SIZE:-full}" --out "$R" --tag "$tag" "$@" 2>&1 \
        | tee "$R/log-dit-$tag.txt" | tail -25
}

agent() {
    local workload=$1 budget=$2 limit=$3 seed=$4
    shift 4
    local kb="$R/kb-agent-$workload.sqlite"
    if [ "$seed" != none ]; then cp "$seed" "$kb"; fi
    timeout "$limit" python3 -m benchmarks.agent_run --workload "$workload" --budget-min "$budget" --kb "$kb" \
        --out "$R" "$@" 2>&1 | tee "$R/log-agent-$workload.txt" | grep -v "^  " | tail -50
}

for step in "$@"; do
    echo "=== $(date +%T) $step"
    started=$SECONDS
    eval "$step"
    echo "=== done in $((SECONDS - started)) s"
    tar czf "$OUT/res.tgz" -C "$R" .
done
ls -la "$R"
