#!/usr/bin/env bash
# The cost of the protocol's hot path to the Redis server, in instructions (deterministic,
# unlike CPU time on a shared machine): a private redis-server runs under valgrind's callgrind,
# gets redsem's Functions library (`redsem load-library`), and is sent JOBS acquisitions and
# releases, as `acquire` and `release` calls of BATCH requests each (what a client sends when
# BATCH tasks acquire at once); the instructions of a run without them are subtracted.
# With `queued`, each job is instead the pattern of a contended semaphore (the bench's `base`):
# an acquire that queues (BATCH is then the limit, every slot held, five times as many waiting)
# and a release whose freed slot grants the head of the queue (the first acquisitions, of the
# first holders and waiters, are counted in too).
#   bash scripts/lua-cost.sh [BATCH] [JOBS] [queued]   (defaults 16, 4000; needs valgrind)
# Prints the server's instructions per job (one acquire + one release). docs/PROTOCOL.md,
# "Records", quotes it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
batch="${1:-16}"
jobs="${2:-4000}"
mode="${3:-free}"
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
python3 - "$lib" "$batch" "$jobs" "$work/jobs.txt" "$mode" <<'EOF'
import sys
lib, batch, jobs, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
keys = ' '.join(f'redsem:{{cost}}:{k}' for k in 'cfg queue exp meta slots free own'.split())
header = '64 redsem:{cost}:c: PUBLISH'
lines = []
if sys.argv[5] == 'queued':
    # limit `batch`, all held: each job's acquire queues, and one release grants it
    header = f'{batch} redsem:{{cost}}:c: PUBLISH'
    # (and, as in `base`, five times as many waiting: the oldest holder leaves, the head of
    # the queue takes its slot)
    held = [f'h{j}' for j in range(batch)]
    waiting = [f'w{j}' for j in range(5 * batch)]
    for x in held + waiting:
        lines.append(f'FCALL {lib}_acquire 7 {keys} {header} 1 {x} 1 5000 30000 c1 "" wait 0')
    for i in range(jobs):
        x = f'id{i}'
        lines.append(f'FCALL {lib}_acquire 7 {keys} {header} 1 {x} 1 5000 30000 c1 "" wait 0')
        waiting.append(x)
        lines.append(f'FCALL {lib}_release 7 {keys} {header} 0 0 0 {held.pop(0)}')
        held.append(waiting.pop(0))
else:
    for i in range(jobs // batch):
        ids = [f'id{i}x{j}' for j in range(batch)]
        requests = ' '.join(f'{x} 1 5000 30000 c1 "" wait 0' for x in ids)
        lines.append(f'FCALL {lib}_acquire 7 {keys} {header} {batch} {requests}')
        lines.append(f'FCALL {lib}_release 7 {keys} {header} 0 0 0 ' + ' '.join(ids))
open(out, 'w').write('\n'.join(lines) + '\n')
EOF
total="$(run "$work/jobs.txt")"
per=$(( jobs / batch * batch ))
if [ "$mode" = queued ]; then per="$jobs"; fi
echo "lua-cost: $mode, batch $batch: $(( (total - base) / per )) server instructions per acquire + release ($lib, $(redis-server --version | awk "{print \$3}" | sed "s/^v=//"))"
