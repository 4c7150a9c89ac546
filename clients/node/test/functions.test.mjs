// redsem's Lua code as a Redis Functions library (FCALL, the default) or as scripts (EVALSHA,
// `scriptsOnly`), and `client.loadLibrary()`, each test on a server of its own (so that the
// library and the command counts are the test's alone), on Redis and Valkey.
import { afterEach, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';

import { flavors, startServer } from './servers.mjs';

const require = createRequire(import.meta.url);
const redsem = require('../index.js');

/** The names of the redsem libraries in `FUNCTION LIST`. */
async function libraries(server) {
  const reply = await server.cmd('FUNCTION', 'LIST');
  assert.ok(Array.isArray(reply), String(reply));
  const names = [];
  for (const lib of reply) {
    const at = lib.indexOf('library_name');
    const name = at >= 0 ? lib[at + 1] : undefined;
    if (typeof name === 'string' && name.startsWith('redsem_')) names.push(name);
  }
  return names;
}

/** How many times `command` ran (`INFO commandstats`; 0 when it never did). */
async function calls(server, command) {
  const info = await server.cmd('INFO', 'commandstats');
  assert.equal(typeof info, 'string', String(info));
  for (const line of info.split('\r\n')) {
    const [key, stats] = line.split(':');
    if (key === `cmdstat_${command}`) {
      return Number(/(?:^|,)calls=(\d+)/.exec(stats)[1]);
    }
  }
  return 0;
}

async function acquireAndRelease(client, name) {
  const sem = await client.semaphore(name, { limit: 2 });
  const permit = await sem.acquire({ timeoutMs: 10_000 });
  assert.deepEqual(permit.slots, [0]);
  await permit.release();
  assert.equal((await sem.stats()).inUse, 0);
}

for (const { flavor, binary, skip } of flavors()) {
  describe(flavor, { skip, timeout: 120_000 }, () => {
    let server;
    let client;
    beforeEach(async () => {
      server = await startServer(binary);
    });
    afterEach(async () => {
      await client?.close();
      client = undefined;
      server?.stop();
    });

    test('by default the library is loaded and its functions called', async () => {
      assert.deepEqual(await libraries(server), []);
      client = await redsem.connect(server.url);
      await acquireAndRelease(client, 'fn-default');
      const [library, ...more] = await libraries(server);
      assert.match(library, /^redsem_/);
      assert.deepEqual(more, []);
      assert.ok((await calls(server, 'fcall')) > 0);
      assert.equal(await calls(server, 'evalsha'), 0);
    });

    test('scriptsOnly runs EVALSHA and no FCALL', async () => {
      client = await redsem.connect(server.url, { scriptsOnly: true });
      await acquireAndRelease(client, 'fn-scripts');
      assert.ok((await calls(server, 'evalsha')) > 0);
      assert.equal(await calls(server, 'fcall'), 0);
      assert.deepEqual(await libraries(server), []);
    });

    test('clients of both kinds share a semaphore', async () => {
      client = await redsem.connect(server.url);
      const scripts = await redsem.connect(server.url, { scriptsOnly: true });
      try {
        const a = await client.semaphore('fn-mixed', { limit: 1 });
        const b = await scripts.semaphore('fn-mixed', { limit: 1 });
        const held = await a.acquire();
        await assert.rejects(b.tryAcquire(), redsem.NoPermitsError);
        await held.release();
        const other = await b.acquire({ timeoutMs: 10_000 });
        await assert.rejects(a.tryAcquire(), redsem.NoPermitsError);
        await other.release();
      } finally {
        await scripts.close();
      }
      assert.ok((await calls(server, 'fcall')) > 0);
      assert.ok((await calls(server, 'evalsha')) > 0);
    });

    test('loadLibrary resolves with the name of the library it loaded', async () => {
      client = await redsem.connect(server.url);
      const library = await client.loadLibrary();
      assert.equal(typeof library, 'string');
      assert.match(library, /^redsem_/);
      assert.deepEqual(await libraries(server), [library]);
      assert.equal(await client.loadLibrary(), library, 'idempotent');
      await acquireAndRelease(client, 'fn-loaded');
      assert.deepEqual(await libraries(server), [library], 'the clients call the library it loaded');
      assert.ok((await calls(server, 'fcall')) > 0);
    });

    test('loadLibrary needs FUNCTION LOAD: NoPermissionError', async () => {
      // the loader rule of docs/security.md without +function|load
      assert.equal(
        await server.cmd('ACL', 'SETUSER', 'nofn', 'on', '>pw', 'resetkeys', 'resetchannels', '-@all', '+ping'),
        'OK',
      );
      client = await redsem.connect(`redis://nofn:pw@127.0.0.1:${server.port}/`);
      await assert.rejects(client.loadLibrary(), (e) => {
        assert.ok(e instanceof redsem.NoPermissionError, `${e}`);
        assert.equal(e.code, 'ERR_REDSEM_NO_PERMISSION');
        return true;
      });
      assert.deepEqual(await libraries(server), []);
    });

    test('scriptsOnly must be a boolean', async () => {
      await assert.rejects(
        redsem.connect(server.url, { scriptsOnly: 'yes' }),
        redsem.InvalidArgumentError,
      );
    });
  });
}
