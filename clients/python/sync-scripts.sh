#!/usr/bin/env bash
# Copies the Lua scripts from the Rust crate (their single source) into the Python package.
# Run it after changing crates/redsem/src/scripts/*.lua; scripts/test.sh and the package's
# tests fail while the copies differ.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="$here/../../crates/redsem/src/scripts"
dst="$here/src/redsem/scripts"
rm -f "$dst"/*.lua
cp "$src"/*.lua "$dst"/
echo "copied $(ls "$src"/*.lua | wc -l) scripts from crates/redsem/src/scripts"
