#!/usr/bin/env bash
# Build the driver examples, normal and deliberately broken, from Debian's
# packages only. Installs what is missing (apt-get; root or sudo), then builds:
#
#   c/build/kv-subscriber                 c/build/kv-subscriber-broken-dedup
#   c/build/kv-publisher                  c/build/kv-publisher-broken-replay
#   rust/target/release/kv-subscriber     rust/target/broken/kv-subscriber
#
# Idempotent: a second run installs nothing and rebuilds nothing that is
# up to date. Cargo runs offline against Debian's registry
# (rust/.cargo/config.toml), so nothing is fetched but Debian packages.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

packages=(gcc make pkg-config libzmq3-dev libmsgpack-dev librust-zmq-dev librust-rmp-serde-dev)
# A cargo already on the machine (rustup's, say) is used; otherwise Debian's.
if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null || packages+=(cargo)

missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" \
        || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
    sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    echo "build.sh: installing ${missing[*]}"
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi

make -s -C "$here/c" all-builds
cd "$here/rust"
# Cargo's own files stay in the checkout too. The broken build is copied aside,
# then the normal one is built: both feature sets stay cached in target/.
export CARGO_HOME="${CARGO_HOME:-$here/rust/target/cargo-home}"
cargo build --release --offline --quiet --features broken-end-marker
mkdir -p target/broken
cp target/release/kv-subscriber target/broken/kv-subscriber
cargo build --release --offline --quiet
echo "build.sh: built the C and Rust driver examples (normal and broken)"
