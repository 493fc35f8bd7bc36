#!/usr/bin/env bash
# scripts/build-deb.sh — build the qpath Debian package: target/debian/qpath_<version>-1_<arch>.deb
#   1. cargo build --release -p qpath
#   2. the manual pages (`qpath man`, gzipped as Debian wants them) and the bash, zsh and
#      fish completions (`qpath completions SHELL`) of that binary, into target/release/qpath-doc
#   3. cargo deb -p qpath --no-build (the layout is [package.metadata.deb] in crates/qpath/Cargo.toml)
# Prints the package's path on its last line. Arguments are passed to cargo deb (--fast...).
# Needs cargo-deb (`cargo install cargo-deb --locked`; scripts/install-deps.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! cargo deb --version > /dev/null 2>&1; then
  echo "build-deb: cargo-deb is not installed (cargo install cargo-deb --locked, or scripts/install-deps.sh)" >&2
  exit 1
fi
TARGET_DIR=${CARGO_TARGET_DIR:-target}
case "$TARGET_DIR" in /*) ;; *) TARGET_DIR=$PWD/$TARGET_DIR ;; esac

cargo build --release -p qpath
BIN=$TARGET_DIR/release/qpath
DOC=$TARGET_DIR/release/qpath-doc
rm -rf "$DOC"
mkdir -p "$DOC/man" "$DOC/completions"
"$BIN" man "$DOC/man" > /dev/null
gzip -9n "$DOC"/man/*.1
"$BIN" completions bash > "$DOC/completions/qpath.bash"
"$BIN" completions zsh > "$DOC/completions/_qpath"
"$BIN" completions fish > "$DOC/completions/qpath.fish"

out=$(cargo deb -p qpath --no-build "$@")
echo "$out" | tail -1
