#!/usr/bin/env bash
# Runs the same benchmark under two builds of the project, interleaved (old new new old), so
# that a change is compared within one device session.
#
#   benchmarks/ab_wheels.sh OLD.whl NEW.whl -- python3 benchmarks/bench_router.py --shapes bert-large ...
#
# Each wheel is installed with --no-deps into its own folder under $AB_ROOT (default
# /tmp/ab); the command runs with that folder first on PYTHONPATH and its bin/ first on PATH
# (the `text-embeddings-router` console script). Output lines are prefixed with the build.
# AB_ORDER changes the order (e.g. "old new" when one pass of each fits the time limit).
# OLD may instead be the old build's `_router.abi3.so`, xz-compressed (`OLD.so.xz`), when
# both builds share their Python sources and two wheels do not fit the device's transfer
# limit: the new wheel is installed for both and the old extension module replaces its own.
set -euo pipefail

if [[ $# -lt 4 || $3 != "--" ]]; then
    echo "usage: $0 OLD.whl NEW.whl -- COMMAND..." >&2
    exit 2
fi
old_wheel=$1
new_wheel=$2
shift 3
root=${AB_ROOT:-/tmp/ab}

for build in old new; do
    wheel=$old_wheel
    [[ $build == new || $old_wheel == *.so.xz ]] && wheel=$new_wheel
    python3 -m pip install -q --no-deps --upgrade --target "$root/$build" "$wheel"
done
if [[ $old_wheel == *.so.xz ]]; then
    xz -dc "$old_wheel" >"$root/old/trt_tei_runtime/_router.abi3.so"
fi
# Two builds whose extension modules are one file compare nothing: cargo reuses a build from
# another checkout of the same crate that shares CARGO_TARGET_DIR (a git worktree) as fresh.
module=trt_tei_runtime/_router.abi3.so
if cmp -s "$root/old/$module" "$root/new/$module"; then
    echo "$0: the old and new builds have the same $module; rebuild one of them" >&2
    exit 2
fi

for build in ${AB_ORDER:-old new new old}; do
    echo "=== $build"
    PYTHONPATH="$root/$build${PYTHONPATH:+:$PYTHONPATH}" PATH="$root/$build/bin:$PATH" \
        "$@" 2>&1 | sed "s/^/[$build] /"
done
