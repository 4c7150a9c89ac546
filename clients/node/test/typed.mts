// Type-checked with `npm run typecheck` (tsc --noEmit): every call of index.d.ts used as a
// TypeScript program would use it. Not run (the tests in *.test.mjs run the same calls).
import * as redsem from '../index.js';

export async function example(url: string): Promise<number> {
  const client: redsem.Client = await redsem.connect(url, {
    prefix: 'redsem',
    connectTimeoutMs: 3000,
    responseTimeoutMs: 5000,
    scriptsOnly: false,
  });
  const sem: redsem.Semaphore = await client.semaphore('licensed-api', { limit: 4, leaseMs: 10_000, label: 'web-1' });
  const controller = new AbortController();
  const permit: redsem.Permit = await sem.acquire({
    timeoutMs: 5000, permits: 1, label: 'request 7', leaseMs: 30_000, maxHoldMs: 600_000,
    signal: controller.signal,
  });
  const slot: number = permit.slots[0];
  const fence: string = permit.fences[0];
  permit.onLost((e: redsem.LeaseLostError) => console.error(e.reason, e.semaphore));
  const signal: AbortSignal = permit.signal;
  const left: number = permit.leaseLeftMs;
  const reason: redsem.LostReason | null = permit.lostReason;
  if (reason === 'maxHold') console.error('held too long');
  await permit.setLease(20_000);
  await permit.release();
  try {
    (await sem.tryAcquire({ permits: 2 })).detach();
  } catch (e) {
    if (e instanceof redsem.NoPermitsError) console.log(e.code, e.reason, e.retryable);
    else if (e instanceof redsem.RedsemError) console.log(e.code, e.semaphore);
  }
  const out: string = await sem.run(async (p) => `${p.ticket}`, { timeoutMs: 1000 });
  const stats: redsem.Stats = await sem.stats();
  const waiting: number[] = stats.waiters.map((w) => w.position);
  const old: number = (await sem.resize(5)).previous;
  const resized: redsem.Resized = await sem.addPermits(-1);
  const now: number = resized.limit;
  const rejected: redsem.RejectedWaiter[] = resized.rejected;
  await sem.forceRelease(stats.holders[0]?.id ?? 'x');
  const token: string = await (await sem.acquire()).export();
  const adopted: redsem.Permit = await sem.adopt(token);
  await adopted.release();
  const existed: boolean = await sem.releaseHandoff(token);
  try {
    await sem.adopt(token);
  } catch (e) {
    if (e instanceof redsem.HandoffGoneError) console.log(e.code, e.holderId, existed);
  }
  const counts: redsem.LocalCounts = sem.localCounts();
  sem.close();
  const names: string[] = await client.listSemaphores();
  const library: string = await client.loadLibrary();
  const inspected: redsem.Stats = await client.inspect('licensed-api');
  await client.resizeExisting('licensed-api', 4);
  const found: 'holder' | 'waiter' | null = await client.forceReleaseExisting('licensed-api', 'holder');
  const added: redsem.Resized = await client.addPermitsExisting('licensed-api', 1);
  const evicted: number = await client.deleteSemaphore('licensed-api', { force: true });
  const purged: number = await client.purgeKeys('licensed-api');
  const store: redsem.FencedStore = client.fencedStore('{licensed-api}:fence');
  const current: boolean = await store.check(fence) && await store.write(fence, '{licensed-api}:v', 'x');
  await client.ping();
  await client.flushReleases();
  await client.close();
  const code: number = redsem.cliMain(['--version']);
  void [library, slot, signal, left, reason, out, waiting, old, now, rejected, found, added, purged, counts, names, inspected, evicted, current, client.id, client.prefix, client.isClosed, sem.availablePermits, sem.limit, sem.name, sem.isClosed];
  return code;
}
