#!/usr/bin/env bash
# Makes the two base images the Containerfile starts from, out of Debian's own packages, for
# machines that reach Debian's package mirrors but no container registry (the project's
# development machines). Where a registry is reachable, skip this and pass registry bases:
#   make image BASE_IMAGE=docker.io/library/debian:bookworm-slim \
#              BUILDER_IMAGE=docker.io/library/rust:1-bookworm
#
#   make-bases.sh RUNTIME_TAG BUILDER_TAG
#
# RUNTIME_TAG: Python 3.11, venv, CA certificates, tini and useradd; documentation and locales left
#              out, because the runtime image is as large as its base plus torch.
# BUILDER_TAG: the same plus a C toolchain and Python headers for `make wheel`. Its Rust
#              comes from the host at build time (see the Makefile's `image` target):
#              Debian bookworm's newest rustc (rustc-web 1.85) is older than the router's
#              dependencies need (1.89).
# An image that already exists is kept; `podman rmi` it to make it again.
set -euo pipefail

runtime_tag=${1:?usage: make-bases.sh RUNTIME_TAG BUILDER_TAG}
builder_tag=${2:?usage: make-bases.sh RUNTIME_TAG BUILDER_TAG}
podman=${PODMAN:-podman}
suite=${DEBIAN_SUITE:-bookworm}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

slim=(
    --dpkgopt='path-exclude=/usr/share/doc/*'
    --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/locale/*'
    --dpkgopt='path-exclude=/usr/share/info/*'
)

make_base() {
    local tag=$1 packages=$2
    if "$podman" image exists "$tag"; then
        echo "base image $tag exists"
        return
    fi
    echo "making base image $tag from Debian $suite: $packages"
    mmdebstrap --quiet --variant=apt "${slim[@]}" --include="$packages" \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
        "$suite" "$work/base.tar"
    "$podman" import --quiet "$work/base.tar" "$tag" >/dev/null
    rm -f "$work/base.tar"
}

make_base "$runtime_tag" python3,python3-venv,ca-certificates,tini,passwd
make_base "$builder_tag" python3,passwd,python3-venv,python3-dev,ca-certificates,build-essential,pkg-config
