#!/usr/bin/env bash
# Keeps every running router's threads on the cores named here, by thread name, re-applied
# every 0.5 s (routers that benchmarks start later are caught too). An experiment's tool:
# does a query wait because tokenizer threads share a core with the thread that serves it?
#
#   benchmarks/experiments/pin_threads.sh TOKENIZER_CPUS BULK_CPUS INTERACTIVE_CPUS [OTHER_CPUS] &
#   # e.g. 0-13 14 15; or "0-14 0-14 15 0-14": the interactive thread alone on CPU 15
#   ... run a benchmark ...; kill %1
#
# Threads: `tokenizer-N` (the tokenization pool), `model-backend*` (bulk backend threads),
# `model-interactive*` (interactive backend threads; /proc shows the first 15 characters).
# OTHER_CPUS: every other thread of every process (the router's tokio workers, the
# benchmark's clients). A CPU list of "-" leaves that kind alone.
set -u
tokenizers=$1 bulk=$2 interactive=$3 other=${4:--}
pin() {  # pin TID CPUS
    [[ $2 == - ]] || taskset -p -c "$2" "$1" >/dev/null 2>&1
}
while true; do
    for task in /proc/[0-9]*/task/[0-9]*; do
        name=$(cat "$task/comm" 2>/dev/null) || continue
        case $name in
            tokenizer-*) pin "${task##*/}" "$tokenizers" ;;
            model-backend*) pin "${task##*/}" "$bulk" ;;
            model-interact*) pin "${task##*/}" "$interactive" ;;
            *) pin "${task##*/}" "$other" ;;
        esac
    done
    sleep 0.5
done
