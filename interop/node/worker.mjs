// A Node.js worker for the interoperability tests (crates/redsem/tests/interop_languages.rs),
// written on the npm package `redsem` (clients/node, built; or $REDSEM_NODE_PACKAGE). Same
// command line and output as interop/python/worker.py:
//
//   node worker.mjs --url redis://... --name S --limit N [--lease-ms MS] [--threads T]
//                   [--count C] [--hold-ms MS] [--label L]
//
// Each of T tasks acquires C permits one after the other, holds each for --hold-ms, and
// releases it. One JSON line per permit on stdout, printed when it is released:
//   {"lang": "node", "label": L, "ticket": 7, "slots": [0], "fences": ["0:1712..."],
//    "start": 1.7e9, "end": 1.7e9, "lost": false}
// `start` is taken right after the grant and `end` right before the release (Unix seconds).
// Exit code 0 when every acquisition succeeded; 3 on a protocol-version refusal; 1 otherwise.
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const require = createRequire(import.meta.url);
const here = path.dirname(fileURLToPath(import.meta.url));
const redsem = require(process.env.REDSEM_NODE_PACKAGE || path.resolve(here, '../../clients/node'));

const { values: a } = parseArgs({
  options: {
    url: { type: 'string' },
    name: { type: 'string' },
    limit: { type: 'string' },
    'lease-ms': { type: 'string', default: '5000' },
    threads: { type: 'string', default: '1' },
    count: { type: 'string', default: '1' },
    'hold-ms': { type: 'string', default: '10' },
    label: { type: 'string', default: 'node' },
  },
});
for (const required of ['url', 'name', 'limit']) {
  if (a[required] === undefined) {
    console.error(`worker: --${required} is required`);
    process.exit(2);
  }
}

// Date.now() is the wall clock cut down to the millisecond: the true time is in
// [now, now + 1 ms). A start is reported at the top of that range and an end at the bottom,
// so a reported interval lies inside the true one (the test compares intervals across
// languages: a start read 1 ms early overlapped the previous holder's end).
const startNow = () => (Date.now() + 1) / 1000;
const endNow = () => Date.now() / 1000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function main() {
  const client = await redsem.connect(a.url);
  let sem;
  try {
    sem = await client.semaphore(a.name, {
      limit: Number(a.limit),
      leaseMs: Number(a['lease-ms']),
      label: a.label,
    });
  } catch (e) {
    console.error(`worker: ${e.message}`);
    await client.close();
    return e instanceof redsem.ProtocolMismatchError ? 3 : 1;
  }

  async function task() {
    for (let i = 0; i < Number(a.count); i++) {
      const permit = await sem.acquire({ timeoutMs: 60000 });
      const start = startNow();
      await sleep(Number(a['hold-ms']));
      const lost = permit.isLost;
      const end = endNow();
      await permit.release();
      process.stdout.write(`${JSON.stringify({
        lang: 'node',
        label: a.label,
        ticket: permit.ticket,
        slots: permit.slots,
        fences: permit.fences,
        start,
        end,
        lost,
      })}\n`);
    }
  }

  const results = await Promise.allSettled(Array.from({ length: Number(a.threads) }, task));
  await client.close();
  const errors = results.filter((r) => r.status === 'rejected');
  for (const e of errors) console.error(`worker: ${e.reason?.stack ?? e.reason}`);
  return errors.length ? 1 : 0;
}

process.exitCode = await main();
