#!/usr/bin/env bash
# redsem's test command (what CI runs, through .ci/run):
#   bash scripts/test.sh [ARGS...]
# installs the test dependencies (scripts/install-deps.sh), checks formatting and clippy,
# runs every test of the workspace against Redis and Valkey, then the doc tests, the Python
# package's tests, types and CLI suite (through `python -m redsem`), the Node.js package's
# types, tests and CLI suite (through its entry point), and the chaos run.
# ARGS go to the test runner (`cargo nextest run`, or `cargo test` without nextest),
# e.g. a test-name filter. Exits non-zero when any step fails; the steps after a failing
# lint still run, so one run reports everything.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

failed=()
step() { printf '\n==> [%ds] %s\n' "$SECONDS" "$*" >&2; }
run() {
    local name="$1"
    shift
    step "$name: $*"
    if ! "$@"; then
        failed+=("$name")
        printf '==> FAILED: %s\n' "$name" >&2
    fi
}

# On CI (a fresh clone, built once) incremental compilation only costs: its caches are
# written for builds that never come.
if [ "${CI:-}" = true ]; then
    export CARGO_INCREMENTAL=0
fi

step "install-deps"
bash scripts/install-deps.sh

run fmt cargo fmt --all -- --check
# --all-features: redsem's optional `tower`, `metrics` and `blocking` code (and every example
# and test that needs it) is linted, built and tested too.
run clippy cargo clippy --workspace --all-targets --all-features -- -D warnings
run docs env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features

# Valkey is installed above: a missing one must fail the tests, not skip half of them.
export REDSEM_REQUIRE_VALKEY=1
# ...and so is promtool: the monitoring tests must check the alert rules with it.
export REDSEM_REQUIRE_PROMTOOL=1
# ...and the Python/Rust interoperability tests must run, not skip.
export REDSEM_REQUIRE_INTEROP=1
if cargo nextest --version >/dev/null 2>&1; then
    run tests cargo nextest run --workspace --all-features --no-fail-fast --profile ci "$@"
else
    step "cargo-nextest not found: using cargo test"
    run tests cargo test --workspace --all-targets --all-features --no-fail-fast -- "$@"
fi
run doctests cargo test --workspace --doc --all-features
# The Python package (clients/python, the PyO3 binding), as built into .cache/interop-venv by
# install-deps: its tests against Redis and against Valkey (pytest's exit 5, "no tests
# collected", fails the step too: they must run), its types (mypy --strict on the package, its
# tests and the interop worker; stubtest of the compiled module against _native.pyi), and the
# CLI's test suite through `python -m redsem` (the same Rust CLI, run in-process; the build of
# the tests step is reused).
py=.cache/interop-venv/bin/python
run python "$py" -m pytest -q -p no:cacheprovider clients/python/tests
run python-valkey env REDSEM_TEST_SERVER="$PWD/.cache/valkey/valkey-server" \
    "$py" -m pytest -q -p no:cacheprovider clients/python/tests
run python-types "$py" -m mypy --strict clients/python/python/redsem clients/python/tests interop/python/worker.py
run python-stubs "$py" -m mypy.stubtest redsem._native
if cargo nextest --version >/dev/null 2>&1; then
    run python-cli env REDSEM_CLI_LAUNCHER="$PWD/$py -m redsem" \
        cargo nextest run --workspace --all-features --no-fail-fast --profile ci -E 'package(redsem-cli)'
else
    run python-cli env REDSEM_CLI_LAUNCHER="$PWD/$py -m redsem" \
        cargo test -p redsem-cli --all-features --no-fail-fast
fi
# The Node.js package (clients/node, built by install-deps): its types (tsc), its tests against
# Redis and Valkey, and the CLI suite through its entry point (`npx redsem`: bin/redsem.js).
run node-types npm --prefix clients/node run --silent typecheck
run node npm --prefix clients/node test
# (--workspace --all-features, as the tests step: its test binaries are reused, not rebuilt)
if cargo nextest --version >/dev/null 2>&1; then
    run cli-node env REDSEM_CLI_LAUNCHER="node $PWD/clients/node/bin/redsem.js" \
        cargo nextest run --workspace --all-features --no-fail-fast --profile ci -E 'package(redsem-cli)'
else
    run cli-node env REDSEM_CLI_LAUNCHER="node $PWD/clients/node/bin/redsem.js" \
        cargo test -p redsem-cli --all-features --no-fail-fast
fi
# The bounded chaos run: 40 s of faults with seed 1, then 40 s with a random seed (printed
# first, with the command that reproduces it); any violation fails the step, and the logs
# of a failing run are kept under target/chaos/. It runs the binary of the tests step's build
# (dev profile, debug assertions on; `cargo build ... --tests` only makes sure it is there and
# fresh, it builds nothing new after the tests step): a release build would add three
# minutes of compiling to CI, for about 1.4 times the acquisitions under the same faults.
# The long runs of "Guarantees" use the release build.
run chaos-build cargo build --workspace --all-features --tests
chaos="${CARGO_TARGET_DIR:-target}/debug/redsem-chaos"
run chaos "$chaos" --seconds 40 --seed 1 --seed random
# Steps of the server's clock (on Valkey: Redis 7.0.15 hangs under libfaketime), among holders
# cut off from it and failovers to a lagging replica: 30 s with seed 1.
run chaos-clock "$chaos" --seconds 30 --seed 1 \
    --faults clock-step,blackhole-cmd,failover-replica

if [ "${#failed[@]}" -gt 0 ]; then
    printf '\n==> [%ds] scripts/test.sh: FAILED: %s\n' "$SECONDS" "${failed[*]}" >&2
    exit 1
fi
printf '\n==> [%ds] scripts/test.sh: all passed\n' "$SECONDS" >&2
