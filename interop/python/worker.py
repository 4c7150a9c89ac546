"""A Python worker for the interoperability tests (crates/redsem/tests/interop.rs), written on
the installed `redsem` package (clients/python: the PyO3 binding over the Rust crate).

    python worker.py --url redis://... --name S --limit N [--lease-ms MS] [--threads T]
                     [--count C] [--hold-ms MS] [--label L]

Each of T tasks acquires C permits one after the other, holds each for --hold-ms, and
releases it. One JSON line per permit on stdout, printed when it is released:
    {"lang": "python", "label": L, "ticket": 7, "slots": [0], "start": 1.7e9, "end": 1.7e9}
`start` is taken right after the grant and `end` right before the release (Unix seconds), so
the intervals of all holders, Python and Rust, can be checked against the limit.
Exit code 0 when every acquisition succeeded; 3 on a protocol-version refusal; 1 otherwise.
"""

import argparse
import asyncio
import json
import logging
import sys
import time

import redsem


async def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--limit", type=int, required=True)
    p.add_argument("--lease-ms", type=int, default=5000)
    p.add_argument("--threads", type=int, default=1, help="concurrent acquiring tasks")
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--hold-ms", type=int, default=10)
    p.add_argument("--label", default="python")
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    client = redsem.Client.from_url(a.url, label=a.label)
    try:
        sem = await client.semaphore(a.name, limit=a.limit, lease=a.lease_ms / 1000)
    except redsem.RedsemError as e:
        print(f"worker: {e}", file=sys.stderr)
        await client.close()
        return 3 if isinstance(e, redsem.ProtocolMismatch) else 1

    async def task() -> None:
        for _ in range(a.count):
            async with sem.acquire(timeout=60, cancel_on_loss=False) as permit:
                start = time.time()
                await asyncio.sleep(a.hold_ms / 1000)
                lost = permit.is_lost()
                end = time.time()
            print(json.dumps({"lang": "python", "label": a.label, "ticket": permit.ticket,
                              "slots": permit.slots, "start": start, "end": end, "lost": lost}), flush=True)

    results = await asyncio.gather(*(task() for _ in range(a.threads)), return_exceptions=True)
    await client.close()
    errors = [r for r in results if isinstance(r, BaseException)]
    for err in errors:
        print(f"worker: {err!r}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
