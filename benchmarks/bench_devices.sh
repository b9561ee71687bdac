#!/usr/bin/env bash
# Scaling over the GPUs of one machine: the same workloads with the server and the corpus
# job on 1, 2, ... N devices, in one call.
#
#   benchmarks/bench_devices.sh TOKENIZER_DIR [SHAPES] [COUNTS]
#
# SHAPES: comma-separated (default bert-large,qwen3-0.6b); COUNTS: device counts to run
# (default: 1 and every visible GPU, e.g. "1 4"). For each count n the devices are
# cuda:0 ... cuda:n-1:
#   - bench_router.py --realistic with --devices and 8 x n backfill connections: idle query
#     p50/p99, backfill tok/s through HTTP, query p50/p99 under the backfill, and the router's
#     CPU by thread during the solo backfill (thread_cpu.py);
#   - bench_corpus.py --jobs: trt-tei-embed tokens/s against n x one device's engine, once
#     per mode of $JOB_MODES (default "threads processes"; one GPU runs in one process).
# Every window is a steady state of $SECONDS_PER_WINDOW seconds (default 20); the corpus job
# runs about as long (its corpus repeated 30 x n times). SERVER_COUNTS and JOB_COUNTS
# (default COUNTS) run a part alone; JOB=0 skips the jobs. Target (docs/performance.md): n GPUs
# >= 0.9 x n x one GPU. On a one-GPU machine it runs the count 1 only, which shows it works.
set -euo pipefail

tokenizer=${1:?usage: bench_devices.sh TOKENIZER_DIR [SHAPES] [COUNTS]}
shapes=${2:-bert-large,qwen3-0.6b}
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
counts=${3:-$( [ "$gpus" -gt 2 ] && echo "1 2 $gpus" || { [ "$gpus" -gt 1 ] && echo "1 2" || echo 1; } )}
modes=${SERVER_MODES:-threads processes}
here=$(cd "$(dirname "$0")" && pwd)
seconds=${SECONDS_PER_WINDOW:-20}

device_list() {
    python3 -c "import sys; print(','.join(f'cuda:{i}' for i in range(int(sys.argv[1]))))" "$1"
}

echo "GPUs visible: $gpus; counts: $counts; shapes: $shapes; commit ${TRT_TEI_COMMIT:-?}"
for n in ${SERVER_COUNTS-$counts}; do
    devices=$(device_list "$n")
    echo "=== $n device(s): $devices — server"
    # One GPU is served in one process whatever the mode (`auto`); several once per mode.
    variants=$( [ "$n" -gt 1 ] && printf -- '--device-workers %s;' $modes | sed 's/;$//' \
        || echo '--device-workers threads' )
    python3 "$here/bench_router.py" --realistic --shapes "$shapes" --tokenizer-from "$tokenizer" \
        --router-args "--devices $devices" --router-variants "$variants" \
        --clients $((8 * n)) --seconds "$seconds" --passes 1 \
        2>&1 | grep -A 30 '^device:'
done
[ "${JOB:-1}" = 0 ] && exit 0
# Every job on one checkpoint per shape, so each engine is measured once.
jobs=""
for n in ${JOB_COUNTS-$counts}; do
    devices=$(device_list "$n")
    for mode in $( [ "$n" -gt 1 ] && echo "${JOB_MODES:-threads processes}" || echo threads ); do
        jobs="$jobs${jobs:+;}$devices@$mode"
    done
done
echo "=== trt-tei-embed: $jobs"
python3 "$here/bench_corpus.py" --shapes "$shapes" --tokenizer-from "$tokenizer" --reps 1 \
    --jobs "$jobs" --job-repeat 30 2>&1 | grep -E '^\||: '
