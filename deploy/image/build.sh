#!/usr/bin/env bash
# Builds the router image from the Containerfile (`make image`) and prints its size.
#
#   deploy/image/build.sh IMAGE
#
# Environment:
#   PODMAN         container CLI (default: podman, installed from Debian's packages when
#                  missing and apt-get can run); `PODMAN=docker` works where a registry is
#                  reachable, with registry bases
#   BASE_IMAGE     runtime base   (default: localhost/trt-tei-base:bookworm, made here)
#   BUILDER_IMAGE  builder base   (default: localhost/trt-tei-builder:bookworm, made here)
#
# The local bases are made from Debian's packages by make-bases.sh, because no container
# registry is reachable from the project's machines (shared/CONTAINERS.md). For those bases
# the host's Rust toolchain is mounted at /opt/rust for the build only. The host's CA bundle
# is mounted for the build only too, so pip and cargo work behind TLS-intercepting proxies
# without it ever being written into the image.
set -euo pipefail

image=${1:?usage: build.sh IMAGE}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
local_base=localhost/trt-tei-base:bookworm
local_builder=localhost/trt-tei-builder:bookworm
base=${BASE_IMAGE:-$local_base}
builder=${BUILDER_IMAGE:-$local_builder}
podman=${PODMAN:-podman}
ca_bundle=/etc/ssl/certs/ca-certificates.crt

need_debian_tools() {
    local missing=()
    for tool in "$@"; do
        command -v "$tool" >/dev/null || missing+=("$tool")
    done
    [ ${#missing[@]} -eq 0 ] && return
    if ! command -v apt-get >/dev/null || [ "$(id -u)" != 0 ]; then
        echo "missing ${missing[*]}: install them (Debian: apt-get install ${missing[*]})" >&2
        exit 1
    fi
    echo "installing ${missing[*]} from Debian's packages"
    apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
}

build_cmd=("$podman")
build_flags=(--build-arg "BASE_IMAGE=$base" --build-arg "BUILDER_IMAGE=$builder")
if [ "$podman" = podman ]; then
    need_debian_tools podman runc
    # Hybrid cgroups and fixed rlimits on the project's machines (shared/CONTAINERS.md).
    export CONTAINERS_CONF=${CONTAINERS_CONF:-$here/containers.conf}
    build_cmd+=(--runtime runc)
    # --format docker keeps HEALTHCHECK, which the OCI image format has no field for.
    build_flags+=(--format docker --network host)
    [ -f "$ca_bundle" ] && build_flags+=(--volume "$ca_bundle:$ca_bundle:ro")
fi
if [ "$base" = "$local_base" ] || [ "$builder" = "$local_builder" ]; then
    need_debian_tools mmdebstrap
    PODMAN=$podman "$here/make-bases.sh" "$local_base" "$local_builder"
fi
if [ "$builder" = "$local_builder" ]; then
    sysroot=$(rustc --print sysroot) || {
        echo "the local builder base needs the host's Rust toolchain (rustc) to mount" >&2
        exit 1
    }
    build_flags+=(--volume "$sysroot:/opt/rust:ro")
fi

start=$(date +%s)
"${build_cmd[@]}" build "${build_flags[@]}" --tag "$image" --file "$root/Containerfile" "$root"
seconds=$(( $(date +%s) - start ))
bytes=$("$podman" image inspect --format '{{.Size}}' "$image")
echo "built $image in ${seconds} s: $(( bytes / 1000000 )) MB (base $base)"
