// Hand-off by id: permit.export(), sem.adopt(token), sem.releaseHandoff(token), against a
// real Redis: a scheduler acquires, a worker renews and releases.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';

import { startServer } from './servers.mjs';

const require = createRequire(import.meta.url);
const redsem = require('../index.js');

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

describe('hand-off', { timeout: 120_000 }, () => {
  let server;
  before(async () => {
    server = await startServer(process.env.REDSEM_REDIS_SERVER || 'redis-server');
  });
  after(() => server?.stop());

  test('an exported permit is adopted by another client and outlives its exporter', async () => {
    const scheduler = await redsem.connect(server.url);
    const worker = await redsem.connect(server.url);
    try {
      const semS = await scheduler.semaphore('handoff-keep', { limit: 3, leaseMs: 600 });
      const semW = await worker.semaphore('handoff-keep', { limit: 3, leaseMs: 600 });
      const p = await semS.acquire({ permits: 2 });
      const { holderId, fences } = p;
      const token = await p.export();
      assert.equal(typeof token, 'string');
      assert.ok(token.startsWith('redsem-handoff-1:'), token);
      assert.equal(p.isReleased, true);
      await assert.rejects(p.export(), redsem.InvalidArgumentError);
      await scheduler.close();
      const q = await semW.adopt(token);
      assert.equal(q.holderId, holderId);
      assert.deepEqual(q.fences, fences);
      assert.equal(q.numPermits, 2);
      await sleep(3000); // five leases: the adopter renews it
      assert.equal(q.isLost, false);
      const stats = await semW.stats();
      assert.deepEqual(stats.holders.map((h) => h.id), [holderId]);
      await q.release();
      assert.equal((await semW.stats()).inUse, 0);
    } finally {
      await worker.close();
    }
  });

  test('release by token frees at once; errors are typed', async () => {
    const client = await redsem.connect(server.url);
    try {
      const sem = await client.semaphore('handoff-release', { limit: 1, leaseMs: 60_000 });
      const other = await client.semaphore('handoff-other', { limit: 1, leaseMs: 60_000 });
      const token = await (await sem.acquire()).export();
      await assert.rejects(other.adopt(token), redsem.InvalidArgumentError);
      await assert.rejects(sem.adopt('not a token'), redsem.InvalidArgumentError);
      const waiter = sem.acquire({ timeoutMs: 20_000 });
      await sleep(200);
      assert.equal(await sem.releaseHandoff(token), true);
      const p = await waiter; // well before the 60 s lease
      assert.equal(await sem.releaseHandoff(token), false);
      await assert.rejects(sem.adopt(token), (e) => {
        assert.ok(e instanceof redsem.HandoffGoneError, String(e));
        assert.equal(e.code, 'ERR_REDSEM_HANDOFF_GONE');
        assert.ok(token.includes(e.holderId));
        return true;
      });
      await p.release();
    } finally {
      await client.close();
    }
  });

  test('adopted twice, the first adopter loses it with handedOff', async () => {
    const a = await redsem.connect(server.url);
    const b = await redsem.connect(server.url);
    try {
      const semA = await a.semaphore('handoff-twice', { limit: 1, leaseMs: 900 });
      const semB = await b.semaphore('handoff-twice', { limit: 1, leaseMs: 900 });
      const token = await (await semA.acquire()).export();
      const first = await semA.adopt(token);
      const second = await semB.adopt(token);
      const lost = await new Promise((resolve) => first.onLost(resolve));
      assert.ok(lost instanceof redsem.LeaseLostError);
      assert.equal(lost.reason, 'handedOff');
      assert.equal(first.lostReason, 'handedOff');
      await first.release(); // leaves the winner's permit alone
      await sleep(1000);
      assert.equal(second.isLost, false);
      assert.equal((await semB.stats()).inUse, 1);
      await second.release();
    } finally {
      await a.close();
      await b.close();
    }
  });
});
