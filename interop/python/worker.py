"""A Python worker for the interoperability tests (crates/redsem/tests/interop.rs).

    python worker.py --url redis://... --name S --limit N [--lease-ms MS] [--threads T]
                     [--count C] [--hold-ms MS] [--label L]

Each of T threads acquires C permits one after the other, holds each for --hold-ms, and
releases it. One JSON line per permit on stdout, printed when it is released:
    {"lang": "python", "label": L, "ticket": 7, "slots": [0], "start": 1.7e9, "end": 1.7e9}
`start` is taken right after the grant and `end` right before the release (Unix seconds), so
the intervals of all holders, Python and Rust, can be checked against the limit.
Exit code 0 when every acquisition succeeded; 3 on a protocol-version refusal; 1 otherwise.
"""

import argparse
import json
import logging
import sys
import threading
import time

import redis

import redsem_proto

out_lock = threading.Lock()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--limit", type=int, required=True)
    p.add_argument("--lease-ms", type=int, default=5000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--hold-ms", type=int, default=10)
    p.add_argument("--label", default="python")
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    try:
        client = redsem_proto.Client(a.url, label=a.label)
        sem = client.semaphore(a.name, a.limit, lease_ms=a.lease_ms)
    except redis.ResponseError as e:
        print(f"worker: {e}", file=sys.stderr)
        return 3 if str(e).startswith("REDSEM_PROTOCOL") else 1
    errors = []

    def run() -> None:
        try:
            for _ in range(a.count):
                permit = sem.acquire(timeout=60)
                start = time.time()
                time.sleep(a.hold_ms / 1000)
                lost = permit.lost.is_set()
                end = time.time()
                permit.release()
                with out_lock:
                    print(json.dumps({"lang": "python", "label": a.label, "ticket": permit.ticket,
                                      "slots": permit.slots, "start": start, "end": end,
                                      "lost": lost}), flush=True)
        except Exception as e:  # reported through the exit code
            errors.append(repr(e))

    threads = [threading.Thread(target=run) for _ in range(a.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.close()
    for e in errors:
        print(f"worker: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
