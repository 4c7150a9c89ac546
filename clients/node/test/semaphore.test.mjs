// The package's behaviour against real servers (Redis and Valkey, started by the test):
// acquire/release, FIFO, timeouts, tryAcquire, loss, AbortSignal, errors, stats, operator
// calls, fencing, shutdown, and a burst of 3,000 acquires on one client.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';

import { eventually, flavors, startServer } from './servers.mjs';

const require = createRequire(import.meta.url);
const redsem = require('../index.js');

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

for (const { flavor, binary, skip } of flavors()) {
  describe(flavor, { skip, timeout: 120_000 }, () => {
    let server;
    let client;
    before(async () => {
      server = await startServer(binary);
      client = await redsem.connect(server.url, { connectTimeoutMs: 5000 });
    });
    after(async () => {
      await client?.close();
      server?.stop();
    });

    /** Holders and waiters in Redis, read fresh. */
    async function counts(sem) {
      const s = await sem.stats();
      return { holders: s.holders.length, waiters: s.waiters.length, inUse: s.inUse };
    }

    test('acquire gives slots, fences and a ticket; release frees the slot', async () => {
      const sem = await client.semaphore('basic', { limit: 2, leaseMs: 3000 });
      assert.equal(sem.name, 'basic');
      assert.equal(sem.limit, 2);
      const a = await sem.acquire();
      const b = await sem.acquire({ label: 'job b' });
      assert.deepEqual([...a.slots, ...b.slots].sort(), [0, 1]);
      for (const p of [a, b]) {
        assert.equal(p.fences.length, 1);
        assert.match(p.fences[0], /^\d+:\d+$/);
        assert.equal(Number(p.fences[0].split(':')[0]), p.slots[0]);
        assert.equal(p.semaphore, 'basic');
        assert.equal(p.numPermits, 1);
        assert.equal(p.isLost, false);
        assert.equal(p.lostReason, null);
        assert.ok(p.leaseLeftMs > 0 && p.leaseLeftMs <= 3000, `${p.leaseLeftMs}`);
        assert.equal(p.leaseMs, 3000);
      }
      assert.ok(b.ticket > a.ticket);
      const stats = await sem.stats();
      assert.equal(stats.inUse, 2);
      assert.equal(stats.available, 0);
      assert.equal(stats.holderCount, 2);
      assert.equal(stats.waiterCount, 0);
      assert.deepEqual(stats.holders.map((h) => h.label).filter((l) => l === 'job b'), ['job b']);
      assert.deepEqual(
        stats.holders.map((h) => h.id).sort(),
        [a.holderId, b.holderId].sort(),
      );
      await a.release();
      await a.release(); // a no-op once released
      assert.equal(a.isReleased, true);
      await b.release();
      assert.deepEqual(await counts(sem), { holders: 0, waiters: 0, inUse: 0 });
    });

    test('waiters are granted in FIFO order', async () => {
      const sem = await client.semaphore('fifo', { limit: 1 });
      const first = await sem.acquire();
      const order = [];
      const waiters = [];
      for (let i = 0; i < 6; i++) {
        waiters.push(sem.acquire().then(async (p) => {
          order.push(i);
          await sleep(5);
          await p.release();
        }));
        // this one is queued before the next one starts
        assert.ok(await eventually(async () => (await counts(sem)).waiters === i + 1));
      }
      await first.release();
      await Promise.all(waiters);
      assert.deepEqual(order, [0, 1, 2, 3, 4, 5]);
    });

    test('acquires made one after the other queue in that order, without waiting between them', async () => {
      // each native call takes its place as it is made, not when a runtime worker first runs it
      const sem = await client.semaphore('call-order', { limit: 1 });
      for (let round = 0; round < 3; round++) {
        const first = await sem.acquire();
        const order = [];
        const tickets = [];
        const waiters = [];
        for (let i = 0; i < 40; i++) {
          waiters.push(sem.acquire().then(async (p) => {
            order.push(i);
            tickets.push(p.ticket);
            await p.release();
          }));
        }
        assert.ok(await eventually(async () => (await counts(sem)).waiters === 40));
        await first.release();
        await Promise.all(waiters);
        assert.deepEqual(order, [...Array(40).keys()], `round ${round}`);
        assert.deepEqual(tickets, [...tickets].sort((a, b) => a - b), `round ${round}`);
      }
    });

    test('priority classes: higher first, FIFO within a class', async () => {
      const sem = await client.semaphore('prio', { limit: 1 });
      const first = await sem.acquire();
      const order = [];
      const waiters = [];
      const requests = [['a0', 0], ['b2', 2], ['c1', 1], ['d2', 2]];
      for (const [i, [label, priority]] of requests.entries()) {
        waiters.push(sem.acquire({ label, priority }).then(async (p) => {
          order.push(label);
          await p.release();
        }));
        assert.ok(await eventually(async () => (await counts(sem)).waiters === i + 1));
      }
      const stats = await sem.stats();
      assert.deepEqual(stats.waiters.map((w) => [w.label, w.priority]),
        [['b2', 2], ['d2', 2], ['c1', 1], ['a0', 0]]);
      await first.release();
      await Promise.all(waiters);
      assert.deepEqual(order, ['b2', 'd2', 'c1', 'a0']);
      for (const priority of [10, -1, 1.5]) {
        await assert.rejects(sem.acquire({ priority }), (e) =>
          e instanceof redsem.InvalidArgumentError && /outside 0\.\.=9/.test(e.message));
      }
    });

    test('several permits at once, and a per-acquire lease', async () => {
      const sem = await client.semaphore('many', { limit: 3, leaseMs: 2000 });
      const p = await sem.acquire({ permits: 2, leaseMs: 9000 });
      assert.deepEqual(p.slots, [0, 1]);
      assert.equal(p.fences.length, 2);
      assert.equal(p.numPermits, 2);
      assert.equal(p.leaseMs, 9000);
      await p.setLease(6000);
      assert.equal(p.leaseMs, 6000);
      await assert.rejects(sem.acquire({ permits: 4 }), (e) => {
        assert.ok(e instanceof redsem.TooManyPermitsError);
        assert.equal(e.code, 'ERR_REDSEM_TOO_MANY_PERMITS');
        assert.equal(e.requested, 4);
        assert.equal(e.limit, 3);
        return true;
      });
      await p.release();
    });

    test('a timeout gives up the place in the queue', async () => {
      const sem = await client.semaphore('timeout', { limit: 1 });
      const held = await sem.acquire();
      const started = Date.now();
      await assert.rejects(sem.acquire({ timeoutMs: 300 }), (e) => {
        assert.ok(e instanceof redsem.TimeoutError);
        assert.ok(e instanceof redsem.RedsemError);
        assert.ok(e instanceof Error);
        assert.equal(e.name, 'TimeoutError');
        assert.equal(e.code, 'ERR_REDSEM_TIMEOUT');
        assert.equal(e.semaphore, 'timeout');
        assert.equal(e.timeoutMs, 300);
        assert.equal(e.retryable, true);
        return true;
      });
      assert.ok(Date.now() - started >= 250);
      assert.ok(await eventually(async () => (await counts(sem)).waiters === 0));
      await held.release();
    });

    test('tryAcquire takes a free permit and never queues', async () => {
      const sem = await client.semaphore('try', { limit: 1 });
      const p = await sem.tryAcquire({ label: 'try' });
      await assert.rejects(sem.tryAcquire(), (e) => {
        assert.ok(e instanceof redsem.NoPermitsError);
        assert.equal(e.code, 'ERR_REDSEM_NO_PERMITS');
        assert.equal(e.reason, 'noneFree');
        assert.equal(e.semaphore, 'try');
        return true;
      });
      assert.equal((await counts(sem)).waiters, 0);
      await assert.rejects(sem.tryAcquire({ timeoutMs: 5 }), redsem.InvalidArgumentError);
      await p.release();
      (await sem.tryAcquire()).release();
    });

    test('an operator force-release makes the permit lost: onLost and signal fire', async () => {
      const sem = await client.semaphore('lost', { limit: 1, leaseMs: 900 });
      const p = await sem.acquire();
      let seen = null;
      p.onLost((e) => { seen = e; });
      const { signal } = p;
      assert.equal(signal.aborted, false);
      assert.equal(await client.forceReleaseExisting('lost', p.holderId), 'holder');
      // the holder learns it at its next renewal (every lease / 3)
      assert.ok(await eventually(() => seen !== null && signal.aborted, 10000));
      assert.ok(seen instanceof redsem.LeaseLostError);
      assert.equal(seen.code, 'ERR_REDSEM_LEASE_LOST');
      assert.equal(seen.reason, 'notHolder');
      assert.equal(seen.semaphore, 'lost');
      assert.equal(signal.reason, seen);
      assert.equal(p.isLost, true);
      assert.equal(p.lostReason, 'notHolder');
      // the slot went to the queue at once
      const next = await sem.acquire({ timeoutMs: 5000 });
      assert.ok(BigInt(next.fences[0].split(':')[1]) > BigInt(p.fences[0].split(':')[1]));
      await next.release();
      await p.release();
    });

    test('maxHoldMs: the permit is lost with reason maxHold, and its release frees the slot at once', async () => {
      const sem = await client.semaphore('maxhold', { limit: 1, leaseMs: 30000 });
      const other = await redsem.connect(server.url, { connectTimeoutMs: 5000 });
      try {
        const otherSem = await other.semaphore('maxhold', { limit: 1, leaseMs: 30000 });
        const started = performance.now();
        const p = await sem.acquire({ maxHoldMs: 1000 });
        assert.equal(p.isLost, false);
        let seen = null;
        p.onLost((e) => { seen = e; });
        assert.ok(await eventually(() => seen !== null && p.signal.aborted, 15000));
        assert.ok(performance.now() - started >= 900, 'lost before its maximum hold time');
        assert.ok(seen instanceof redsem.LeaseLostError);
        assert.equal(seen.reason, 'maxHold');
        assert.equal(p.lostReason, 'maxHold');
        assert.equal(p.isLost, true);
        // released: another client gets the slot long before the 30 s lease
        await p.release();
        const next = await otherSem.acquire({ timeoutMs: 10000 });
        await next.release();
        // tryAcquire takes the option too; zero and negative values are refused
        const q = await sem.tryAcquire({ maxHoldMs: 60000 });
        assert.equal(q.isLost, false);
        await q.release();
        for (const bad of [0, -1]) {
          await assert.rejects(sem.acquire({ maxHoldMs: bad }), (e) => {
            assert.ok(e instanceof redsem.InvalidArgumentError, String(e));
            return true;
          });
        }
        assert.equal((await counts(sem)).inUse, 0);
      } finally {
        await other.close();
      }
    });

    test('a released permit never reports a loss (and its watch does not keep Node alive)', async () => {
      const sem = await client.semaphore('kept', { limit: 1, leaseMs: 600 });
      const p = await sem.acquire();
      let lost = false;
      p.onLost(() => { lost = true; });
      const { signal } = p;
      await p.release();
      await sleep(700);
      assert.equal(lost, false);
      assert.equal(signal.aborted, false);
    });

    test('an AbortSignal cancels a waiting acquire and leaves no queue entry', async () => {
      const sem = await client.semaphore('abort', { limit: 1 });
      const held = await sem.acquire();
      const controller = new AbortController();
      const waiting = sem.acquire({ signal: controller.signal });
      assert.ok(await eventually(async () => (await counts(sem)).waiters === 1));
      controller.abort();
      let timer;
      const bound = new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error('the acquire was not cancelled within 10 s')), 10000);
      });
      try {
        await assert.rejects(Promise.race([waiting, bound]), (e) => {
          assert.equal(e.name, 'AbortError');
          assert.equal(e, controller.signal.reason);
          return true;
        });
      } finally {
        clearTimeout(timer);
      }
      assert.ok(await eventually(async () => (await counts(sem)).waiters === 0),
        'the cancelled ticket left the queue');
      // an already-aborted signal: nothing is sent
      const reason = new Error('stop');
      await assert.rejects(sem.acquire({ signal: AbortSignal.abort(reason) }), (e) => e === reason);
      assert.equal((await counts(sem)).waiters, 0);
      // the slot still goes to the next waiter
      const next = sem.acquire({ signal: new AbortController().signal, timeoutMs: 5000 });
      await held.release();
      await (await next).release();
      assert.deepEqual(await counts(sem), { holders: 0, waiters: 0, inUse: 0 });
    });

    test('AbortSignal.timeout on many waiters: every one leaves the queue', async () => {
      const sem = await client.semaphore('abort-many', { limit: 1 });
      const held = await sem.acquire();
      const all = Array.from({ length: 50 }, () => sem.acquire({ signal: AbortSignal.timeout(300) }));
      const results = await Promise.allSettled(all);
      assert.ok(results.every((r) => r.status === 'rejected' && r.reason.name === 'TimeoutError'
        && !(r.reason instanceof redsem.RedsemError)), 'rejected with the signal\'s reason');
      assert.ok(await eventually(async () => (await counts(sem)).waiters === 0));
      await held.release();
    });

    test('limitPolicy adopts or resizes the stored limit', async () => {
      await assert.rejects(client.semaphore('policy', { limit: 5, limitPolicy: 'adopt' }),
        (e) => e instanceof redsem.UnknownSemaphoreError);
      await client.semaphore('policy', { limit: 2 });
      const adopted = await client.semaphore('policy', { limit: 5, limitPolicy: 'createOrAdopt' });
      assert.equal(adopted.limit, 2);
      const resized = await client.semaphore('policy', { limit: 4, limitPolicy: 'resize' });
      assert.equal(resized.limit, 4);
      assert.equal((await client.inspect('policy')).limit, 4);
      await assert.rejects(client.semaphore('policy', { limit: 4, limitPolicy: 'sometimes' }),
        (e) => e instanceof redsem.InvalidArgumentError && /limitPolicy/.test(e.message));
    });

    test('an argument of the wrong type is refused naming it, in the library\'s error', async () => {
      const sem = await client.semaphore('wrong-types', { limit: 2 });
      const refused = [
        [() => sem.resize('3'), /resize: limit must be a number, not string/],
        [() => sem.addPermits(null), /addPermits: delta must be a number, not null/],
        [() => sem.stats('5'), /stats: listed must be a number, not string/],
        [() => sem.forceRelease(7), /forceRelease: holderId must be a string, not number/],
        [() => client.semaphore(123, { limit: 1 }), /semaphore: name must be a string, not number/],
        [() => client.inspect('wrong-types', NaN), /inspect: listed must be a number, not NaN/],
        [() => client.resizeExisting(['wrong-types'], 3), /resizeExisting: name must be a string, not object/],
      ];
      for (const [f, message] of refused) {
        await assert.rejects(f(), (e) => {
          assert.ok(e instanceof redsem.InvalidArgumentError, String(e));
          assert.match(e.message, message);
          return true;
        });
      }
      assert.equal((await client.inspect('wrong-types')).limit, 2, 'nothing changed');
    });

    test('connect() without a URL takes $REDSEM_URL, else $REDIS_URL; a URL that is no string is refused', async () => {
      const saved = { REDSEM_URL: process.env.REDSEM_URL, REDIS_URL: process.env.REDIS_URL };
      try {
        delete process.env.REDSEM_URL;
        process.env.REDIS_URL = server.url;
        const a = await redsem.connect();
        await a.ping();
        await a.close();
        process.env.REDSEM_URL = server.url;
        process.env.REDIS_URL = 'redis://127.0.0.1:1/';
        const b = await redsem.connect(null);
        await b.ping();
        await b.close();
      } finally {
        for (const [k, v] of Object.entries(saved)) {
          if (v === undefined) delete process.env[k]; else process.env[k] = v;
        }
      }
      await assert.rejects(redsem.connect(6379), (e) => {
        assert.ok(e instanceof redsem.InvalidArgumentError);
        assert.match(e.message, /must be a string such as "redis:\/\/host:6379\/", not number/);
        return true;
      });
    });

    test('errors carry a code, the semaphore name and their fields', async () => {
      await client.semaphore('conflict', { limit: 2 });
      await assert.rejects(client.semaphore('conflict', { limit: 3 }), (e) => {
        assert.ok(e instanceof redsem.LimitConflictError);
        assert.equal(e.code, 'ERR_REDSEM_LIMIT_CONFLICT');
        assert.equal(e.semaphore, 'conflict');
        assert.equal(e.requested, 3);
        assert.equal(e.stored, 2);
        assert.match(e.message, /already exists with limit 2, not 3/);
        return true;
      });
      for (const bad of [{ limit: 0 }, { limit: -1 }, { limit: 1.5 }, { limit: 'x' },
        { limit: 1, leaseMs: 5 }, { limit: 1, leaseMs: -1 }, { limit: 1, typo: 1 }, undefined]) {
        await assert.rejects(client.semaphore('bad', bad), (e) => {
          assert.ok(e instanceof redsem.InvalidArgumentError, `${JSON.stringify(bad)}: ${e}`);
          assert.equal(e.code, 'ERR_REDSEM_INVALID_ARGUMENT');
          return true;
        });
      }
      // a number option given something else names the option (not napi's conversion words)
      await assert.rejects(client.semaphore('bad', { limit: '2' }), (e) =>
        e instanceof redsem.InvalidArgumentError &&
        e.message === 'semaphore: options.limit must be a number, not string');
      const typed = await client.semaphore('typed', { limit: 1 });
      await assert.rejects(typed.acquire({ permits: '2' }), (e) =>
        e instanceof redsem.InvalidArgumentError &&
        e.message === 'acquire: options.permits must be a number, not string');
      await assert.rejects(typed.tryAcquire({ leaseMs: NaN }), (e) =>
        e instanceof redsem.InvalidArgumentError && /options.leaseMs must be a number, not NaN/.test(e.message));
      // timeoutMs: Infinity is no timeout
      await (await typed.acquire({ timeoutMs: Infinity })).release();
      // one wording for the limit's range on every path (the library's), negatives included
      for (const limit of [0, -3, 100001]) {
        await assert.rejects(client.semaphore('bad', { limit }), (e) =>
          e instanceof redsem.InvalidArgumentError &&
          e.message.includes(`limit ${limit} is outside 1..=100000`));
      }
      await assert.rejects(client.semaphore('bad', { limit: 1, label: 'two\nlines' }), (e) =>
        e instanceof redsem.InvalidArgumentError && /control character/.test(e.message));
      await assert.rejects(client.inspect('nobody'), (e) => {
        assert.ok(e instanceof redsem.UnknownSemaphoreError);
        assert.equal(e.code, 'ERR_REDSEM_UNKNOWN_SEMAPHORE');
        assert.equal(e.semaphore, 'nobody');
        assert.equal(e.prefix, 'redsem');
        return true;
      });
      const sem = await client.semaphore('in-use', { limit: 1 });
      const p = await sem.acquire();
      await assert.rejects(client.deleteSemaphore('in-use'), (e) => {
        assert.ok(e instanceof redsem.InUseError);
        assert.equal(e.holders, 1);
        assert.equal(e.waiters, 0);
        return true;
      });
      assert.equal(await client.deleteSemaphore('in-use', { force: true }), 1);
      await p.release();
      sem.close();
      assert.equal(sem.isClosed, true);
      await assert.rejects(sem.acquire(), (e) => e instanceof redsem.ClosedError
        && e.code === 'ERR_REDSEM_CLOSED' && e.semaphore === 'in-use');
      await server.cmd('SET', 'redsem:{foreign}:cfg', 'x');
      await assert.rejects(client.semaphore('foreign', { limit: 1 }),
        (e) => e instanceof redsem.WrongTypeError && e.code === 'ERR_REDSEM_WRONG_TYPE');
      await assert.rejects(
        redsem.connect('redis://127.0.0.1:1/', { connectTimeoutMs: 300 }),
        (e) => e instanceof redsem.UnreachableError && e.code === 'ERR_REDSEM_UNREACHABLE' && e.retryable,
      );
      await assert.rejects(redsem.connect('http://nope'), redsem.InvalidArgumentError);
      await assert.rejects(client.fencedStore('f').check('nonsense'), redsem.InvalidArgumentError);
    });

    test('addPermitsExisting, and foreign data: deleteSemaphore refuses, purgeKeys removes', async () => {
      await (await client.semaphore('rel', { limit: 2 })).close();
      assert.equal((await client.addPermitsExisting('rel', 3)).limit, 5);
      assert.equal((await client.addPermitsExisting('rel', -4)).previous, 5);
      await assert.rejects(client.addPermitsExisting('rel', -1), redsem.InvalidArgumentError);
      await assert.rejects(client.addPermitsExisting('nope', 1), redsem.UnknownSemaphoreError);
      assert.equal((await client.inspect('rel')).limit, 1);
      await client.deleteSemaphore('rel');
      await server.cmd('HSET', 'redsem:{fruit}:cfg', 'limit', 'banana');
      await assert.rejects(client.deleteSemaphore('fruit', { force: true }),
        (e) => e instanceof redsem.NotASemaphoreError && e.code === 'ERR_REDSEM_NOT_A_SEMAPHORE');
      assert.equal(Number(await server.cmd('EXISTS', 'redsem:{fruit}:cfg')), 1);
      assert.equal(await client.purgeKeys('fruit'), 0);
      assert.equal(Number(await server.cmd('EXISTS', 'redsem:{fruit}:cfg')), 0);
    });

    test('an operator removes a waiter; a shrink rejects the larger requests', async () => {
      const sem = await client.semaphore('cancel', { limit: 2 });
      const p = await sem.acquire();
      const pair = sem.acquire({ permits: 2, label: 'two seats' });
      assert.ok(await eventually(async () => (await counts(sem)).waiters === 1));
      // (each rejection is awaited from before the call that causes it: it may arrive, by
      // its notification, before that call's own reply)
      const pairRejected = assert.rejects(pair,
        (e) => e instanceof redsem.TooManyPermitsError && e.limit === 1);
      const shrunk = await client.resizeExisting('cancel', 1);
      assert.equal(shrunk.previous, 2);
      assert.deepEqual(shrunk.rejected.map((w) => [w.permits, w.label]), [[2, 'two seats']]);
      await pairRejected;
      const waiter = sem.acquire({ timeoutMs: 30_000 });
      const waiterRemoved = assert.rejects(waiter, (e) => e instanceof redsem.RemovedFromQueueError
        && e.code === 'ERR_REDSEM_REMOVED_FROM_QUEUE' && e.semaphore === 'cancel');
      assert.ok(await eventually(async () => (await counts(sem)).waiters === 1));
      const id = (await sem.stats()).waiters[0].id;
      assert.equal(await client.forceReleaseExisting('cancel', id), 'waiter');
      await waiterRemoved;
      assert.equal((await sem.stats()).waiters.length, 0);
      await p.release();
    });

    test('a snapshot lists at most what it is asked', async () => {
      const sem = await client.semaphore('listing', { limit: 1 });
      const p = await sem.acquire();
      const waiting = [];
      for (let i = 0; i < 3; i += 1) {
        waiting.push(sem.acquire({ timeoutMs: 30_000 }));
        assert.ok(await eventually(async () => (await sem.stats()).waiters.length === i + 1));
      }
      const full = await sem.stats();
      const counts = await sem.stats(0);
      assert.deepEqual([counts.holderCount, counts.waiterCount], [1, 3]);
      assert.deepEqual([counts.holders.length, counts.waiters.length], [0, 0]);
      const head = await client.inspect('listing', 1);
      assert.deepEqual(head.waiters.map((w) => w.id), [full.waiters[0].id]);
      await assert.rejects(sem.stats(1001), (e) => e instanceof redsem.InvalidArgumentError);
      await assert.rejects(sem.stats(-1), (e) => e instanceof redsem.InvalidArgumentError);
      await p.release();
      for (const w of waiting) await (await w).release();
    });

    test('stats, resize, addPermits and the operator calls', async () => {
      const sem = await client.semaphore('ops', { limit: 2, label: 'node-test' });
      const p = await sem.acquire();
      const q = await sem.acquire();
      const waiting = sem.acquire({ label: 'third', permits: 2 });
      assert.ok(await eventually(async () => (await counts(sem)).waiters === 1));
      const s = await sem.stats();
      assert.equal(s.name, 'ops');
      assert.equal(s.limit, 2);
      assert.equal(s.inUse, 2);
      assert.equal(s.available, 0);
      assert.deepEqual(s.holders.map((h) => h.label), ['node-test', 'node-test']);
      assert.equal(s.waiters[0].label, 'third');
      assert.equal(s.waiters[0].permits, 2);
      assert.equal(s.waiters[0].position, 0);
      assert.ok(s.waiters[0].ticket > p.ticket);
      assert.ok(s.grantsTotal >= 2);
      assert.ok(s.serverTimeMs > 1.6e12);
      assert.ok(s.holders[0].fences[0].startsWith(`${s.holders[0].slots[0]}:`));
      assert.deepEqual(await client.inspect('ops').then((i) => i.holders.length), 2);
      assert.deepEqual(sem.localCounts(), { holders: 2, waiters: 1 });
      assert.equal((await sem.addPermits(2)).limit, 4); // the waiter of 2 permits is admitted
      const third = await waiting;
      assert.deepEqual(third.slots, [2, 3]);
      assert.deepEqual(await sem.resize(5), { previous: 4, limit: 5, rejected: [] });
      assert.equal((await client.resizeExisting('ops', 3)).previous, 5);
      assert.equal(sem.limit, 5); // as last seen by this handle
      assert.equal((await sem.stats()).limit, 3);
      await assert.rejects(sem.addPermits(-10), redsem.InvalidArgumentError);
      assert.equal(await sem.forceRelease(q.holderId), true);
      assert.equal(await sem.forceRelease('no-such-holder'), false);
      assert.equal(await client.forceReleaseExisting('ops', 'no-such-holder'), null);
      assert.ok((await client.listSemaphores()).includes('ops'));
      for (const x of [p, q, third]) await x.release();
      assert.equal(await client.deleteSemaphore('ops'), 0);
      assert.ok(!(await client.listSemaphores()).includes('ops'));
      await client.ping();
      assert.equal(client.prefix, 'redsem');
      assert.match(client.id, /./);
    });

    test('run() holds a permit for the work and releases it', async () => {
      const sem = await client.semaphore('run', { limit: 1 });
      const out = await sem.run(async (permit) => {
        assert.equal((await counts(sem)).holders, 1);
        return permit.slots[0] + 41;
      });
      assert.equal(out, 41);
      await assert.rejects(sem.run(async () => { throw new Error('work failed'); }), /work failed/);
      assert.equal((await counts(sem)).holders, 0);
    });

    test('fenced writes refuse a stale holder', async () => {
      const sem = await client.semaphore('fenced', { limit: 1, leaseMs: 900 });
      const store = client.fencedStore('{fenced}:fence');
      const old = await sem.acquire();
      assert.equal(await store.write(old.fences[0], '{fenced}:value', 'old'), true);
      await sem.forceRelease(old.holderId);
      const cur = await sem.acquire({ timeoutMs: 5000 });
      assert.equal(await store.write(cur.fences[0], '{fenced}:value', Buffer.from('new')), true);
      assert.equal(await store.write(old.fences[0], '{fenced}:value', 'stale'), false);
      assert.equal(await store.check(old.fences[0]), false);
      assert.equal(await store.check(cur.fences[0]), true);
      assert.equal(await server.cmd('GET', '{fenced}:value'), 'new');
      await cur.release();
      await old.release();
    });

    test('a burst of 3,000 concurrent acquires on one client all queue and complete', async () => {
      const sem = await client.semaphore('burst', { limit: 20, leaseMs: 30000 });
      let peak = 0;
      let now = 0;
      const tickets = new Set();
      const all = Array.from({ length: 3000 }, () => sem.acquire().then(async (p) => {
        now++;
        peak = Math.max(peak, now);
        tickets.add(p.ticket);
        await sleep(1);
        now--;
        await p.release();
      }));
      const results = await Promise.allSettled(all);
      const failed = results.filter((r) => r.status === 'rejected');
      assert.equal(failed.length, 0, `${failed.length} failed, e.g. ${failed[0]?.reason}`);
      assert.equal(tickets.size, 3000);
      assert.ok(peak <= 20, `peak ${peak}`);
      const s = await sem.stats();
      assert.equal(s.grantsTotal, 3000);
      assert.deepEqual([s.holders.length, s.waiters.length, s.inUse], [0, 0, 0]);
    });

    test('a key overwritten by another program: the permit is lost at once (overwritten), its signal aborted when first read', async () => {
      const sem = await client.semaphore('overwritten', { limit: 1, leaseMs: 60_000, renewEveryMs: 300 });
      const p = await sem.acquire();
      await server.cmd('DEL', 'redsem:{overwritten}:queue');
      await server.cmd('SET', 'redsem:{overwritten}:queue', 'written by another program');
      assert.ok(await eventually(() => p.isLost, 15_000), 'lost before its lease ran out');
      assert.equal(p.lostReason, 'overwritten');
      // read for the first time after the loss: already aborted, with the reason
      const { signal } = p;
      assert.equal(signal.aborted, true);
      assert.ok(signal.reason instanceof redsem.LeaseLostError);
      assert.equal(signal.reason.reason, 'overwritten');
      await p.release();
      await client.purgeKeys('overwritten');
    });

    test('close() gives up held permits (lost: shutdown) and refuses later calls', async () => {
      const connected = async () => Number(
        String(await server.cmd('INFO', 'clients')).match(/connected_clients:(\d+)/)[1]);
      const baseline = await connected();
      const own = await redsem.connect(server.url);
      const sem = await own.semaphore('shutdown', { limit: 1 });
      const p = await sem.acquire();
      const { signal } = p;
      const waiting = sem.acquire().then(() => null, (e) => e);
      assert.ok(await eventually(async () => (await counts(sem)).waiters === 1));
      await own.close();
      assert.equal(own.isClosed, true);
      assert.ok((await waiting) instanceof redsem.ClosedError);
      assert.ok(await eventually(() => signal.aborted));
      assert.equal(signal.reason.reason, 'shutdown');
      await assert.rejects(own.semaphore('shutdown2', { limit: 1 }), redsem.ClosedError);
      // and every other call of the closed client
      await assert.rejects(own.ping(), redsem.ClosedError);
      await assert.rejects(own.inspect('shutdown'), redsem.ClosedError);
      await assert.rejects(own.resizeExisting('shutdown', 2), redsem.ClosedError);
      await assert.rejects(own.deleteSemaphore('shutdown', { force: true }), redsem.ClosedError);
      // and of its handles
      await assert.rejects(sem.stats(), redsem.ClosedError);
      // both connections are closed while the client and the handle are still referenced
      assert.ok(await eventually(async () => (await connected()) === baseline),
        `${await connected()} connections, ${baseline} before the client`);
      // everything was released before close() returned
      const s = await client.inspect('shutdown');
      assert.deepEqual([s.holders.length, s.waiters.length], [0, 0]);
    });
  });
}

test('npx redsem runs the Rust CLI in-process', async () => {
  const { execFileSync } = await import('node:child_process');
  const out = execFileSync(process.execPath, [new URL('../bin/redsem.js', import.meta.url).pathname, '--version']);
  assert.match(out.toString(), /^redsem \d+\.\d+\.\d+/);
});
