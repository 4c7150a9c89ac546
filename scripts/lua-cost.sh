#!/usr/bin/env bash
# The cost of the protocol's hot path to the Redis server, in instructions (deterministic,
# unlike CPU time on a shared machine): a private redis-server runs under valgrind's callgrind,
# gets redsem's Functions library (`redsem load-library`), and is sent JOBS acquisitions and
# releases, as `acquire` and `release` calls of BATCH requests each (what a client sends when
# BATCH tasks acquire at once); the instructions of a run without them are subtracted.
#   bash scripts/lua-cost.sh [BATCH] [JOBS]     (defaults 16 and 4000; needs valgrind)
# Prints the server's instructions per job (one acquire + one release). docs/PROTOCOL.md,
# "Records", quotes it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
batch="${1:-16}"
jobs="${2:-4000}"
command -v valgrind >/dev/null || { echo "lua-cost: needs valgrind (apt install valgrind)" >&2; exit 1; }
cargo build --release -q -p redsem-cli --manifest-path "$root/Cargo.toml"
redsem="${CARGO_TARGET_DIR:-$root/target}/release/redsem"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"

# Instructions of a whole server run that is sent the commands of file $1.
run() {
    valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" \
        redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>"$work/vg.err" &
    local pid=$!
    for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
    "$redsem" --redis-url "redis://127.0.0.1:$port" load-library >"$work/loaded.txt"
    redis-cli -p "$port" <"$1" >"$work/out.txt"
    if grep -qi '^err' "$work/out.txt"; then grep -i -m3 '^err' "$work/out.txt" >&2; exit 1; fi
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    wait "$pid" || true
    awk '/^summary:/{print $2}' "$work/cg.out"
}

# The baseline first: it loads the library, whose name (the SHA-1 of its text: library.rs) the
# jobs' calls need; `redsem load-library` prints it.
: >"$work/none.txt"
base="$(run "$work/none.txt")"
lib="$(awk '{print $NF}' "$work/loaded.txt")"
python3 - "$lib" "$batch" "$jobs" "$work/jobs.txt" <<'EOF'
import sys
lib, batch, jobs, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
keys = ' '.join(f'redsem:{{cost}}:{k}' for k in 'cfg queue exp meta slots free own'.split())
header = '64 redsem:{cost}:c: PUBLISH'
lines = []
for i in range(jobs // batch):
    ids = [f'id{i}x{j}' for j in range(batch)]
    requests = ' '.join(f'{x} 1 5000 30000 c1 "" wait 0' for x in ids)
    lines.append(f'FCALL {lib}_acquire 7 {keys} {header} {batch} {requests}')
    lines.append(f'FCALL {lib}_release 7 {keys} {header} 0 0 0 ' + ' '.join(ids))
open(out, 'w').write('\n'.join(lines) + '\n')
EOF
total="$(run "$work/jobs.txt")"
echo "lua-cost: batch $batch: $(( (total - base) / (jobs / batch * batch) )) server instructions per acquire + release ($lib, $(redis-server --version | awk "{print \$3}" | sed "s/^v=//"))"
