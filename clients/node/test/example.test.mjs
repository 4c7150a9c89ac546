// The README's example is examples/quickstart.mjs, and it runs as written against a
// private server.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import { promisify } from 'node:util';

import { flavors, startServer } from './servers.mjs';

const example = new URL('../examples/quickstart.mjs', import.meta.url);
let server;
before(async () => { server = await startServer(flavors()[0].binary); });
after(() => server?.stop());

test("the README's example is examples/quickstart.mjs", () => {
  const readme = fs.readFileSync(new URL('../README.md', import.meta.url), 'utf8');
  const block = readme.match(/```js\n(import redsem[\s\S]*?)```/);
  assert.ok(block, 'README.md has the example');
  assert.equal(block[1], fs.readFileSync(example, 'utf8'));
});

test('the example runs: six calls, two slots, one fence each', async () => {
  const { stdout } = await promisify(execFile)(process.execPath, [example.pathname], {
    env: { ...process.env, REDIS_URL: server.url },
  });
  const lines = stdout.trim().split('\n');
  assert.equal(lines.length, 6, stdout);
  for (const line of lines) assert.match(line, /^call \d: slot [01], fencing token [01]:\d+$/);
});
