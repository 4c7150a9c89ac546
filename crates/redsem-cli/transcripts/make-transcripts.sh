#!/usr/bin/env bash
# Regenerates ../README-cli.md from README-cli.md.in with real transcripts, and the README's
# CLI section (between the cli-section markers) from it:
#   cargo build -p redsem-cli && bash crates/redsem-cli/transcripts/make-transcripts.sh
# Starts three private redis-servers on loopback (plain on $PORT, with a password on
# $PORT+1, TLS on $PORT+2; default PORT=18600) and a temp dir for TLS certificates, and
# removes them on exit. Needs redis-server, redis-cli, openssl, curl and python3.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
PORT="${PORT:-18600}"
AUTH_PORT=$((PORT + 1))
TLS_PORT=$((PORT + 2))
work="$(mktemp -d /tmp/redsem-transcripts.XXXXXX)"
cleanup() {
    local f p
    for f in "$work"/*.pid; do
        [ -f "$f" ] || continue
        p="$(cat "$f")"
        kill "$p" 2>/dev/null
        for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
    done
    rm -rf "$work"
}
trap cleanup EXIT
cd "$work"
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj "/CN=redsem test CA" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=localhost" 2>/dev/null
printf "subjectAltName=DNS:localhost,IP:127.0.0.1\n" > ext.cnf
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2 -extfile ext.cnf 2>/dev/null
start() {
    local port="$1"
    shift
    redis-server --port "$port" "$@" --save '' --appendonly no --daemonize yes \
        --pidfile "$work/redis-$port.pid" --logfile "$work/redis-$port.log" ||
        { echo "cannot start redis-server on port $port" >&2; exit 1; }
}
start "$PORT"
start "$AUTH_PORT" --requirepass s3cret
start 0 --tls-port "$TLS_PORT" --tls-cert-file server.crt --tls-key-file server.key --tls-ca-cert-file ca.crt --tls-auth-clients no --pidfile "$work/redis-tls.pid"
sleep 0.5
redis-cli -p "$PORT" ping >/dev/null || { echo "redis-server on port $PORT did not start" >&2; exit 1; }
export PATH="$root/target/debug:$PATH"
SSL_CA="$work/ca.crt"
export PORT AUTH_PORT TLS_PORT SSL_CA
# show a command with the ports and paths of this run filled in
show() {
    local s="$*"
    s="${s//\$AUTH_PORT/$AUTH_PORT}"; s="${s//\$TLS_PORT/$TLS_PORT}"
    s="${s//\$PORT/$PORT}"; s="${s//\$SSL_CA/$SSL_CA}"
    printf '$ %s\n' "$s"
}
# t: run in a child shell, mark a non-zero exit; b: run in this shell (jobs, variables)
t() { show "$*"; bash -c "$*" 2>&1; rc=$?; [ $rc -ne 0 ] && printf '[exit %d]\n' $rc; return 0; }
b() { show "$*"; eval "$*"; }
exec 3>&1 > "$work/all.txt" 2>&1
echo "### exit"
redsem --help | sed -n '/^Exit status (every subcommand)/,$p'
echo "### 1"
b 'export REDSEM_URL=redis://127.0.0.1:$PORT/'
t 'redsem run licence-server --limit 4 -- sh -c '"'"'echo "slot $REDSEM_SLOTS, fence $REDSEM_FENCES, holder $REDSEM_HOLDER"'"'"''
t 'for i in 1 2 3 4 5 6; do redsem run licence-server --label "nightly-$i" -- sh -c '"'"'echo "$(date +%T) job '"'"'$i'"'"' on slot $REDSEM_SLOTS"; sleep 2'"'"' & done; wait'
t 'redsem run -v licence-server --permits 2 -- sh -c '"'"'echo "slots $REDSEM_SLOTS, fences $REDSEM_FENCES, ticket $REDSEM_TICKET"'"'"''
t 'redsem run licence-server --shell -- '"'"'echo "slot $REDSEM_SLOTS" && exit 3'"'"''
t 'redsem run licence-server -- no-such-tool --version'
t 'redsem run licence-server --permits 5 -- true'
t 'redsem run nightly-report -- true'
echo "### 2"
b 'redsem run licence-server --permits 4 --label "backup (all 4 seats)" -- sleep 600 2>backup.err & BACKUP=$!'
sleep 0.5
t 'redsem run licence-server --timeout 2s -- make deploy'
t 'redsem run licence-server -n -- make deploy'
t 'redsem run licence-server -n -E 1 -- make deploy'
echo "### wait"
b 'redsem run gpu --limit 1 --label "training run 41" -- sleep 8 &'
G1=$!
sleep 0.5
b 'redsem run gpu --label "eval-1" -- sleep 2 &'
G2=$!
sleep 0.3
t 'redsem run -v gpu --label "eval-2" -- true'
# (only these two: the backup of section 2 still runs, until section 5 releases it)
wait $G1 $G2
echo "### values"
t 'redsem --version'
t 'redsem run jobs --limit -3 -- make'
t 'REDSEM_LEASE=ten redsem run jobs --limit 2 -- make'
t 'redsem run jobs --limit 2 --timeout -5s -- make'
t 'redsem run jobs --limit 2 --label "$(printf '"'"'line 1\nline 2'"'"')" -- make'
t 'redsem run jobs --limit 2 --lease 365d -- true'
redsem delete jobs >/dev/null
echo "### 3"
b 'redsem run licence-server --label "ci-runner-7 make test" -- sleep 5 &'
sleep 0.3
b 'redsem run licence-server --permits 2 --label "ci-runner-2 e2e" -- sleep 5 &'
sleep 1.5
t 'redsem stats licence-server'
t 'redsem stats licence-server --json'
t 'redsem list'
t 'redsem list --json'
t 'redsem watch licence-server --interval 1s --iterations 2'
echo "### 4"
t 'redsem limit licence-server 6'
t 'redsem limit licence-server -1'
t 'redsem limit licence-server +1'
sleep 0.3
t 'redsem stats licence-server'
echo "### 5"
H=$(redsem stats licence-server --json | python3 -c 'import json,sys; print([h["id"] for h in json.load(sys.stdin)["holders"] if h["label"].startswith("backup")][0])')
t "redsem release licence-server --holder $H"
b 'wait $BACKUP; echo "redsem run exited with $?"; cat backup.err'
sleep 0.3
t 'redsem stats licence-server'
t 'redsem limit licence-server 4'
t 'redsem run -v licence-server --limit 6 -- true'
t 'redsem run licence-server --limit 6 --strict-limit -- true'
t "redsem release licence-server --holder $H"
wait
echo "### 6"
b 'redsem run demo --limit 1 --lease 30s -- sh -c '"'"'trap "echo child: got SIGTERM, cleaning up; exit 0" TERM; while :; do sleep 0.1; done'"'"' & P=$!'
b 'sleep 1; kill -TERM $P; wait $P; echo "redsem run exited with $?"; redsem stats demo | head -1'
b 'redsem run demo -- sleep 600 & P=$!'
b 'sleep 1; kill -TERM $P; wait $P; echo "redsem run exited with $?"'
b 'redsem run demo --lease 2s -- sleep 600 & P=$!'
b 'sleep 1; kill -KILL $P; wait $P 2>/dev/null; sleep 0.2'
t 'redsem stats demo | head -1; ps -C sleep -o args= | grep -x "sleep 600" || echo "no sleep 600 left: it got SIGTERM when redsem died"'
t 'sleep 2; redsem stats demo | head -1'
REDIS_PID="$(cat "$work/redis-$PORT.pid")"
b 'redsem run stubborn --limit 1 --lease 3s -- sh -c '"'"'trap "" TERM; while :; do sleep 0.1; done'"'"' & P=$!'
b 'sleep 1; kill -STOP $REDIS_PID; sleep 4; kill -CONT $REDIS_PID; wait $P; echo "redsem run exited with $?"'
redsem delete stubborn >/dev/null
b 'redsem run demo --max-hold 1s -- sleep 600; echo "redsem run exited with $?"; redsem stats demo | head -1'
echo "### 7"
b 'redsem run licence-server --label "long job" -- sleep 3 &'
b 'redsem exporter --listen 127.0.0.1:9721 & EXPORTER=$!'
sleep 0.7
t 'curl -s http://127.0.0.1:9721/metrics'
kill $EXPORTER; wait
echo "### 8"
b 'redis-cli -p $PORT set "redsem:{legacy}:cfg" "written by another program"'
t 'redsem stats nightly'
t 'redsem --redis-url redis://127.0.0.1:1/ list'
t 'redsem --redis-url redis://:wrong-password@127.0.0.1:$AUTH_PORT/ list'
t 'redsem --redis-url http://127.0.0.1:$PORT/ list'
t 'redsem stats legacy'
t 'redsem run legacy --limit 1 -- true'
t 'redsem --redis-url redis://127.0.0.1:1/ run x --limit 1 -- true'
t 'redsem limit licence-server 0'
t 'redsem limit licence-server -9'
t 'redsem run licence-server --lease 10s --kill-after 10s -- make deploy'
t 'redsem --redis-url rediss://localhost:$TLS_PORT/ list'
t 'redsem --redis-url rediss://localhost:$TLS_PORT/ --tls-ca $SSL_CA run tls-demo --limit 1 -- echo hello over TLS'
t 'REDSEM_TLS_CA=$SSL_CA redsem --redis-url rediss://localhost:$TLS_PORT/ list'
echo "### 9"
b 'redsem run gpu-pool --limit 1 --label "training run 41" -- sleep 20 &'
sleep 0.3
b 'for i in 1 2 3; do redsem run gpu-pool --label "eval-$i" -- true & done'
sleep 1
t 'redsem watch gpu-pool --interval 1s --alert-after 2s --iterations 4 | awk '"'"'/^redsem watch/{n++} n==4'"'"'  # the 4th refresh'
b 'redsem run ab --limit 2 --label "one seat" -- sleep 20 &'
sleep 0.3
b 'redsem run ab --permits 2 --label "needs both seats" -- true &'
sleep 0.3
b 'redsem run ab --label "small job" -- true &'
sleep 0.5
t 'redsem watch ab --interval 1s --iterations 2 | awk '"'"'/^redsem watch/{n++} n==2'"'"'  # the 2nd refresh'
kill $(jobs -p) 2>/dev/null; wait
echo "### delete"
b 'redsem run old-pool --limit 2 --label "still running" -- sleep 600 2>old.err & P=$!'
sleep 0.5
t 'redsem delete old-pool'
t 'redsem delete old-pool --force'
b 'wait $P; echo "redsem run exited with $?"; cat old.err'
t 'redsem delete old-pool'
t 'redsem delete old-pool'
exec 1>&3 2>&3
python3 - "$work/all.txt" "$here/README-cli.md.in" "$here/../README-cli.md" "$root/README.md" <<'PY'
import re, sys
txt = open(sys.argv[1]).read()
parts = re.split(r"^### (\w+)\n", txt, flags=re.M)
out = open(sys.argv[2]).read()
for i in range(1, len(parts), 2):
    out = out.replace("{{" + parts[i] + "}}", parts[i + 1].rstrip("\n"))
assert "{{" not in out, "a section is missing"
open(sys.argv[3], "w").write(out)
# the README's CLI section is the part of README-cli.md between these markers
# (crates/redsem-cli/tests/readme.rs fails when the two differ)
begin, end = "<!-- cli-section:begin -->", "<!-- cli-section:end -->"
section = out[out.index(begin):out.index(end) + len(end)]
readme = open(sys.argv[4]).read()
a, b = readme.index(begin), readme.index(end) + len(end)
open(sys.argv[4], "w").write(readme[:a] + section + readme[b:])
PY
echo "wrote $here/../README-cli.md and the CLI section of $root/README.md"
