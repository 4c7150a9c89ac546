// Private Redis and Valkey servers for the tests: each started on a free loopback port in a
// temporary folder, killed (and its folder removed) when the test file ends.
//
// Redis is `redis-server` on PATH (or $REDSEM_REDIS_SERVER); Valkey is
// $REDSEM_VALKEY_SERVER, else the repository's .cache/valkey/valkey-server (made by
// `bash scripts/install-deps.sh valkey`), else valkey-server on PATH. A missing Valkey skips its tests with a message,
// unless REDSEM_REQUIRE_VALKEY=1.
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const repoValkey = path.resolve(here, '../../../.cache/valkey/valkey-server');

function onPath(cmd) {
  try {
    execFileSync('sh', ['-c', `command -v ${cmd}`], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

/** The flavors to test: [{ flavor, binary }] or, for a missing one, { flavor, skip }. */
export function flavors() {
  const out = [];
  const redis = process.env.REDSEM_REDIS_SERVER || 'redis-server';
  out.push(onPath(redis) || fs.existsSync(redis)
    ? { flavor: 'redis', binary: redis }
    : { flavor: 'redis', skip: 'redis-server is not on PATH' });
  const valkey = process.env.REDSEM_VALKEY_SERVER
    || (fs.existsSync(repoValkey) || !onPath('valkey-server') ? repoValkey : 'valkey-server');
  if (fs.existsSync(valkey) || onPath(valkey)) {
    out.push({ flavor: 'valkey', binary: valkey });
  } else if (process.env.REDSEM_REQUIRE_VALKEY === '1') {
    throw new Error(`REDSEM_REQUIRE_VALKEY=1 but there is no ${valkey}: run scripts/install-deps.sh valkey`);
  } else {
    out.push({ flavor: 'valkey', skip: `no ${valkey} (bash scripts/install-deps.sh valkey)` });
  }
  return out;
}

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/** Opens a TCP connection to talk RESP to a server (raw commands for the tests' checks). */
export async function command(port, ...args) {
  const req = `*${args.length}\r\n${args.map((a) => `$${Buffer.byteLength(String(a))}\r\n${a}\r\n`).join('')}`;
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1');
    let buf = '';
    sock.on('error', reject);
    sock.on('data', (d) => {
      buf += d.toString();
      const parsed = parseReply(buf);
      if (parsed) {
        sock.end();
        resolve(parsed.value);
      }
    });
    sock.write(req);
  });
}

function parseReply(s, i = 0) {
  const nl = s.indexOf('\r\n', i);
  if (nl < 0) return null;
  const head = s[i];
  const body = s.slice(i + 1, nl);
  const next = nl + 2;
  switch (head) {
    case '+': return { value: body, end: next };
    case '-': return { value: new Error(body), end: next };
    case ':': return { value: Number(body), end: next };
    case '$': {
      const n = Number(body);
      if (n < 0) return { value: null, end: next };
      if (s.length < next + n + 2) return null;
      return { value: s.slice(next, next + n), end: next + n + 2 };
    }
    case '*': {
      const n = Number(body);
      const items = [];
      let at = next;
      for (let k = 0; k < n; k++) {
        const r = parseReply(s, at);
        if (!r) return null;
        items.push(r.value);
        at = r.end;
      }
      return { value: items, end: at };
    }
    default: throw new Error(`unexpected reply ${JSON.stringify(s)}`);
  }
}

/** Starts a private server of `binary`; `stop()` kills it. */
export async function startServer(binary) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'redsem-node-test-'));
  const port = await freePort();
  const child = spawn(binary, [
    '--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no',
    '--dir', dir, '--logfile', path.join(dir, 'server.log'),
  ], { stdio: 'ignore' });
  const deadline = Date.now() + 20000;
  for (;;) {
    try {
      if ((await command(port, 'PING')) === 'PONG') break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline || child.exitCode !== null) {
      child.kill('SIGKILL');
      throw new Error(`${binary} did not start on port ${port}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    port,
    url: `redis://127.0.0.1:${port}/`,
    cmd: (...args) => command(port, ...args),
    stop() {
      child.kill('SIGKILL');
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Polls `check` (sync or async) until it is true or `ms` pass; returns the last result. */
export async function eventually(check, ms = 10000) {
  const deadline = Date.now() + ms;
  for (;;) {
    if (await check()) return true;
    if (Date.now() > deadline) return false;
    await new Promise((r) => setTimeout(r, 20));
  }
}
