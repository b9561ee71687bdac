#!/usr/bin/env bash
# Packs FlashAttention 4 (the `flash-attn-4` CuTe-DSL kernels) and its dependencies for the
# GPU machine, which has no package index, for `bench_attention.py`'s FA4 column:
#   benchmarks/carry_fa4.sh            # here: downloads into .carry/fa4-a and .carry/fa4-b
#   (device call 1, carry .carry/fa4-a)   mkdir -p /tmp/fa4carry && cp .carry/fa4-a/* /tmp/fa4carry/
#   (device call 2, carry .carry/fa4-b)   source benchmarks/carry_fa4.sh --install
# The CUDA 13 compiler library alone is 92 MB, over one call's 64 MiB: it travels
# xz-compressed and split in two, one part per call (the machine keeps /tmp while warm).
FA4=4.0.0b36 CUTE=4.8.1
if [[ ${1:-} == --install ]]; then  # sourced: leaves the caller's shell options alone
    rm -rf /tmp/fa4site /tmp/fa4cu13 && mkdir -p /tmp/fa4site /tmp/fa4cu13
    cat /tmp/fa4carry/cu13.tar.xz.part-a .carry/fa4-b/cu13.tar.xz.part-b | tar xJf - -C /tmp/fa4cu13
    python3 -m pip install -q --no-deps --target /tmp/fa4site .carry/fa4-b/*.whl 2>&1 | grep -v WARNING || true
    cp -r /tmp/fa4cu13/. /tmp/fa4site/
    # What nvidia_cutlass_dsl's .pth does in a site-packages folder.
    export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
    return 0 2>/dev/null || exit 0
fi
set -euo pipefail
a=.carry/fa4-a b=.carry/fa4-b tmp=$(mktemp -d)
rm -rf "$a" "$b" && mkdir -p "$a" "$b"
pip_get() {
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_28_x86_64 -d "$1" "${@:2}"
}
pip_get "$b" "flash-attn-4==$FA4" "nvidia-cutlass-dsl==$CUTE" "nvidia-cutlass-dsl-libs-base==$CUTE" \
    "nvidia-cutlass-dsl-libs-core==$CUTE" "quack-kernels==0.6.5" "apache-tvm-ffi==0.1.15.post2" \
    "torch-c-dlpack-ext==0.1.5" "einops==0.8.2" "protobuf==7.36.2"
pip_get "$tmp" "nvidia-cutlass-dsl-libs-cu13==$CUTE"
mkdir "$tmp/x" && (cd "$tmp/x" && python3 -m zipfile -e "$tmp"/nvidia_cutlass_dsl_libs_cu13-*.whl .)
tar cf - -C "$tmp/x" . | xz -T0 -9 > "$tmp/cu13.tar.xz"
head -c 54M "$tmp/cu13.tar.xz" > "$a/cu13.tar.xz.part-a"
tail -c +$((54 * 1024 * 1024 + 1)) "$tmp/cu13.tar.xz" > "$b/cu13.tar.xz.part-b"
rm -rf "$tmp"
du -sh "$a" "$b"
