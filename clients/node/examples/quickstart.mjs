import redsem from 'redsem';

const url = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379/';
const client = await redsem.connect(url);
// At most 2 calls at once, across every process that opens "quickstart-api"
const sem = await client.semaphore('quickstart-api', { limit: 2, leaseMs: 10_000 });
try {
  await Promise.all([0, 1, 2, 3, 4, 5].map(async (i) => {
    const permit = await sem.acquire({ timeoutMs: 30_000 }); // FIFO across all processes
    try {
      // permit.signal aborts if the slot is lost (its lease could not be renewed)
      console.log(`call ${i}: slot ${permit.slots[0]}, fencing token ${permit.fences[0]}`);
      await new Promise((resolve) => setTimeout(resolve, 100));
    } finally {
      await permit.release();
    }
  }));
} catch (e) {
  if (e instanceof redsem.TimeoutError) console.error(`${e.code}: ${e.message}`);
  else throw e;
} finally {
  await client.close(); // every release done before the process exits
}
