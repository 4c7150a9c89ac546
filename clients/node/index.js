// The npm package `redsem`: fair, crash-safe distributed semaphores on Redis and Valkey.
//
// A thin Promise API over the native module (native/redsem.node, napi-rs bindings of the
// redsem Rust crate, built from source at install by scripts/build.js). Every protocol rule
// lives in the Rust crate; this file only shapes the API: option objects, Error subclasses,
// AbortSignal plumbing. The types and documentation of every call are in index.d.ts.
'use strict';

const path = require('node:path');

let native;
try {
  native = require(path.join(__dirname, 'native', 'redsem.node'));
} catch (e) {
  throw new Error(
    `redsem: cannot load the native module ${path.join(__dirname, 'native', 'redsem.node')} ` +
      `(${e.message}). It is built from source when the package is installed: reinstall it ` +
      "with a Rust toolchain on PATH and install scripts allowed, or run 'npm run build' in " +
      'the package folder.',
  );
}

// ---------------------------------------------------------------------------------------
// Errors. The native module encodes each redsem::Error as a tagged JSON message (its
// `code`, message and fields; mapped in one place, src/lib.rs `to_js`); this table gives
// each code its class.

const TAG = '\u0001redsem-error:';

/** Base class of every error of redsem. */
class RedsemError extends Error {
  constructor(message, fields = {}) {
    super(message);
    this.name = new.target.name;
    this.code = fields.code ?? 'ERR_REDSEM';
    this.retryable = fields.retryable ?? false;
    for (const [k, v] of Object.entries(fields)) {
      if (k !== 'code' && k !== 'retryable' && k !== 'message') this[k] = v;
    }
  }
}
class InvalidArgumentError extends RedsemError {}
class LimitConflictError extends RedsemError {}
class TooManyPermitsError extends RedsemError {}
class NoPermitsError extends RedsemError {}
class TimeoutError extends RedsemError {}
class LeaseLostError extends RedsemError {}
class RemovedFromQueueError extends RedsemError {}
class HandoffGoneError extends RedsemError {}
class ClosedError extends RedsemError {}
class UnknownSemaphoreError extends RedsemError {}
class InUseError extends RedsemError {}
class WrongTypeError extends RedsemError {}
class NotASemaphoreError extends RedsemError {}
class ProtocolMismatchError extends RedsemError {}
class CorruptError extends RedsemError {}
class EvictingPolicyError extends RedsemError {}
class NoPermissionError extends RedsemError {}
class AuthError extends RedsemError {}
class NotReplicatedError extends RedsemError {}
class UnreachableError extends RedsemError {}
class BackendError extends RedsemError {}

const CLASSES = {
  ERR_REDSEM_INVALID_ARGUMENT: InvalidArgumentError,
  ERR_REDSEM_LIMIT_CONFLICT: LimitConflictError,
  ERR_REDSEM_TOO_MANY_PERMITS: TooManyPermitsError,
  ERR_REDSEM_NO_PERMITS: NoPermitsError,
  ERR_REDSEM_TIMEOUT: TimeoutError,
  ERR_REDSEM_LEASE_LOST: LeaseLostError,
  ERR_REDSEM_REMOVED_FROM_QUEUE: RemovedFromQueueError,
  ERR_REDSEM_HANDOFF_GONE: HandoffGoneError,
  ERR_REDSEM_CLOSED: ClosedError,
  ERR_REDSEM_UNKNOWN_SEMAPHORE: UnknownSemaphoreError,
  ERR_REDSEM_IN_USE: InUseError,
  ERR_REDSEM_WRONG_TYPE: WrongTypeError,
  ERR_REDSEM_NOT_A_SEMAPHORE: NotASemaphoreError,
  ERR_REDSEM_PROTOCOL_MISMATCH: ProtocolMismatchError,
  ERR_REDSEM_CORRUPT: CorruptError,
  ERR_REDSEM_EVICTING_POLICY: EvictingPolicyError,
  ERR_REDSEM_NO_PERMISSION: NoPermissionError,
  ERR_REDSEM_AUTH: AuthError,
  ERR_REDSEM_NOT_REPLICATED: NotReplicatedError,
  ERR_REDSEM_UNREACHABLE: UnreachableError,
  ERR_REDSEM_BACKEND: BackendError,
};

/** The RedsemError subclass of an error of the native module; other errors unchanged. */
function fromNative(e) {
  if (e && typeof e.message === 'string' && e.message.startsWith(TAG)) {
    const fields = JSON.parse(e.message.slice(TAG.length));
    const Class = CLASSES[fields.code] ?? RedsemError;
    return new Class(fields.message, fields);
  }
  if (e && typeof e.code === 'string' && /Expected$|^InvalidArg$/.test(e.code)) {
    // napi's conversion of an argument of the wrong type
    return new InvalidArgumentError(e.message, { code: 'ERR_REDSEM_INVALID_ARGUMENT' });
  }
  return e;
}

/** Runs a native call, sync or async, throwing RedsemErrors. */
async function call(f) {
  try {
    return await f();
  } catch (e) {
    throw fromNative(e);
  }
}

/**
 * `v` if it is of `type` ('number', 'string'; `optional`: undefined too), else an
 * InvalidArgumentError naming the argument `what` (napi would say "Failed to convert napi
 * value String into rust type 'f64'").
 */
function arg(what, v, type, optional = false) {
  if (optional && v === undefined) return v;
  if (typeof v !== type || (type === 'number' && Number.isNaN(v))) {
    const got = Number.isNaN(v) ? 'NaN' : v === null ? 'null' : typeof v;
    throw new InvalidArgumentError(`${what} must be a ${type}, not ${got}`, {
      code: 'ERR_REDSEM_INVALID_ARGUMENT',
    });
  }
  return v;
}

/** The options that take a number (the others take a string, a boolean or an AbortSignal). */
const NUMBERS = new Set([
  'permits', 'timeoutMs', 'leaseMs', 'priority', 'maxHoldMs', 'limit', 'renewEveryMs',
  'fallbackPollMs', 'localCap', 'connectTimeoutMs', 'responseTimeoutMs', 'syncedReplicas',
  'syncedTimeoutMs',
]);

/**
 * InvalidArgumentError for keys of an options object that the call does not know, and for a
 * number option given something else (which napi would report in its own words); a
 * `timeoutMs` of `Infinity` is no timeout. The ranges are the library's to check.
 */
function checkKeys(what, options, known) {
  if (options === undefined || options === null) return {};
  if (typeof options !== 'object') {
    throw new InvalidArgumentError(`${what}: options must be an object, not ${typeof options}`, {
      code: 'ERR_REDSEM_INVALID_ARGUMENT',
    });
  }
  const out = {};
  for (const [k, v] of Object.entries(options)) {
    if (!known.includes(k)) {
      throw new InvalidArgumentError(
        `${what}: unknown option ${JSON.stringify(k)} (known: ${known.join(', ')})`,
        { code: 'ERR_REDSEM_INVALID_ARGUMENT' },
      );
    }
    if (v === undefined || v === null) continue;
    if (NUMBERS.has(k) && (typeof v !== 'number' || Number.isNaN(v))) {
      throw new InvalidArgumentError(
        `${what}: options.${k} must be a number, not ${Number.isNaN(v) ? 'NaN' : typeof v}`,
        { code: 'ERR_REDSEM_INVALID_ARGUMENT' },
      );
    }
    if (k === 'timeoutMs' && v === Infinity) continue;
    out[k] = v;
  }
  return out;
}

// ---------------------------------------------------------------------------------------

const CONNECT_OPTIONS = [
  'prefix', 'connectTimeoutMs', 'responseTimeoutMs', 'tlsCa', 'tlsCert', 'tlsKey',
  'tlsCaPem', 'tlsCertPem', 'tlsKeyPem', 'syncedReplicas', 'syncedTimeoutMs', 'scriptsOnly',
];
const SEMAPHORE_OPTIONS = [
  'limit', 'leaseMs', 'renewEveryMs', 'fallbackPollMs', 'localCap', 'label',
  'allowEvictingPolicy', 'limitPolicy',
];
const ACQUIRE_OPTIONS = ['permits', 'timeoutMs', 'leaseMs', 'label', 'priority', 'maxHoldMs', 'signal'];
const TRY_ACQUIRE_OPTIONS = ['permits', 'leaseMs', 'label', 'priority', 'maxHoldMs'];

/** The URL a `connect()` without one uses: as the CLI and the Python package. */
const DEFAULT_URL = 'redis://127.0.0.1:6379/';

async function connect(url, options) {
  if (url === undefined || url === null) {
    url = process.env.REDSEM_URL || process.env.REDIS_URL || DEFAULT_URL;
  } else if (typeof url !== 'string') {
    throw new InvalidArgumentError(
      `connect: the URL must be a string such as "redis://host:6379/", not ${typeof url}`,
      { code: 'ERR_REDSEM_INVALID_ARGUMENT' },
    );
  }
  const o = checkKeys('connect', options, CONNECT_OPTIONS);
  return new Client(await call(() => native.connect(url, o)));
}

class Client {
  #native;

  constructor(n) {
    if (!(n instanceof native.Client)) throw new TypeError('use redsem.connect(url)');
    this.#native = n;
  }

  get prefix() { return this.#native.prefix; }
  get id() { return this.#native.id; }
  get isClosed() { return this.#native.isClosed; }

  ping() { return call(() => this.#native.ping()); }

  async semaphore(name, options) {
    arg('semaphore: name', name, 'string');
    if (options === undefined || options === null || options.limit === undefined) {
      throw new InvalidArgumentError(
        `semaphore ${JSON.stringify(name)}: options.limit is required (the permits shared by every process)`,
        { code: 'ERR_REDSEM_INVALID_ARGUMENT', semaphore: name },
      );
    }
    const o = checkKeys('semaphore', options, SEMAPHORE_OPTIONS);
    return new Semaphore(await call(() => this.#native.semaphore(name, o)));
  }

  close() { return call(() => this.#native.close()); }
  flushReleases() { return call(() => this.#native.flushReleases()); }
  listSemaphores() { return call(() => this.#native.listSemaphores()); }
  loadLibrary() { return call(() => this.#native.loadLibrary()); }
  inspect(name, listed) {
    return call(() => this.#native.inspect(arg('inspect: name', name, 'string'),
      arg('inspect: listed', listed, 'number', true)));
  }
  resizeExisting(name, limit) {
    return call(() => this.#native.resizeExisting(arg('resizeExisting: name', name, 'string'),
      arg('resizeExisting: limit', limit, 'number')));
  }
  forceReleaseExisting(name, holderId) {
    return call(() => this.#native.forceReleaseExisting(
      arg('forceReleaseExisting: name', name, 'string'),
      arg('forceReleaseExisting: holderId', holderId, 'string')));
  }
  addPermitsExisting(name, delta) {
    return call(() => this.#native.addPermitsExisting(
      arg('addPermitsExisting: name', name, 'string'),
      arg('addPermitsExisting: delta', delta, 'number')));
  }
  purgeKeys(name) { return call(() => this.#native.purgeKeys(arg('purgeKeys: name', name, 'string'))); }
  async deleteSemaphore(name, options) {
    const { force = false } = checkKeys('deleteSemaphore', options, ['force']);
    return call(() => this.#native.deleteSemaphore(name, force));
  }
  fencedStore(fenceKey) { return new FencedStore(this.#native.fencedStore(fenceKey)); }
}

class Semaphore {
  #native;

  constructor(n) {
    if (!(n instanceof native.Semaphore)) throw new TypeError('use client.semaphore(name, options)');
    this.#native = n;
  }

  get name() { return this.#native.name; }
  get limit() { return this.#native.limit; }
  get availablePermits() { return this.#native.availablePermits; }
  get isClosed() { return this.#native.isClosed; }
  localCounts() { return this.#native.localCounts(); }

  async acquire(options) {
    return this.#acquire(checkKeys('acquire', options, ACQUIRE_OPTIONS), false);
  }

  async tryAcquire(options) {
    return this.#acquire(checkKeys('tryAcquire', options, TRY_ACQUIRE_OPTIONS), true);
  }

  async #acquire({ signal, ...options }, tryOnly) {
    if (signal === undefined) {
      return new Permit(await call(() => this.#native.acquire(options, tryOnly)));
    }
    if (typeof signal.aborted !== 'boolean' || typeof signal.addEventListener !== 'function') {
      throw new InvalidArgumentError('acquire: options.signal must be an AbortSignal', {
        code: 'ERR_REDSEM_INVALID_ARGUMENT',
      });
    }
    signal.throwIfAborted();
    const token = new native.CancelToken();
    const onAbort = () => token.cancel();
    signal.addEventListener('abort', onAbort, { once: true });
    try {
      let n;
      try {
        n = await this.#native.acquire(options, tryOnly, token);
      } catch (e) {
        signal.throwIfAborted();
        throw fromNative(e);
      }
      const permit = new Permit(n);
      if (signal.aborted) {
        // granted as the signal fired: an aborted acquire never returns a permit
        permit.release().catch(() => {});
        signal.throwIfAborted();
      }
      return permit;
    } finally {
      signal.removeEventListener('abort', onAbort);
    }
  }

  async run(work, options) {
    const permit = await this.acquire(options);
    try {
      return await work(permit);
    } finally {
      // as the crate's Permit::run: a failed release is retried in the background
      await permit.release().catch(() => {});
    }
  }

  stats(listed) { return call(() => this.#native.stats(arg('stats: listed', listed, 'number', true))); }
  resize(limit) { return call(() => this.#native.resize(arg('resize: limit', limit, 'number'))); }
  addPermits(delta) { return call(() => this.#native.addPermits(arg('addPermits: delta', delta, 'number'))); }
  forceRelease(holderId) {
    return call(() => this.#native.forceRelease(arg('forceRelease: holderId', holderId, 'string')));
  }
  async adopt(token) { return new Permit(await call(() => this.#native.adopt(String(token)))); }
  releaseHandoff(token) { return call(() => this.#native.releaseHandoff(String(token))); }
  close() { this.#native.close(); }
}

class Permit {
  #native;
  #watch;
  #controller;

  constructor(n) {
    if (!(n instanceof native.Permit)) throw new TypeError('use semaphore.acquire()');
    this.#native = n;
  }

  get semaphore() { return this.#native.semaphore; }
  get holderId() { return this.#native.holderId; }
  get ticket() { return this.#native.ticket; }
  get numPermits() { return this.#native.numPermits; }
  get slots() { return this.#native.slots; }
  get fences() { return this.#native.fences; }
  get isReleased() { return this.#native.isReleased; }
  get isLost() { return this.#native.isLost; }
  get lostReason() { return this.#native.lostReason ?? null; }
  get leaseLeftMs() { return this.#native.leaseLeftMs; }
  get leaseMs() { return this.#native.leaseMs; }

  /** The native watch of the loss, started once: resolves with the LeaseLostError or null. */
  #lost() {
    this.#watch ??= this.#native.watchLost().then((m) => (m ? fromNative({ message: m }) : null));
    return this.#watch;
  }

  onLost(callback) {
    if (typeof callback !== 'function') {
      throw new InvalidArgumentError('onLost: the callback must be a function', {
        code: 'ERR_REDSEM_INVALID_ARGUMENT',
      });
    }
    this.#lost().then((e) => {
      if (e) callback(e);
    });
    return this;
  }

  get signal() {
    if (!this.#controller) {
      const controller = new AbortController();
      this.#controller = controller;
      // already lost: aborted before it is returned (not one tick later)
      const now = this.#native.lostError();
      if (now) {
        controller.abort(fromNative({ message: now }));
      } else {
        this.#lost().then((e) => {
          if (e) controller.abort(e);
        });
      }
    }
    return this.#controller.signal;
  }

  setLease(leaseMs) { return call(() => this.#native.setLease(leaseMs)); }
  release() { return call(() => this.#native.release()); }
  detach() { this.#native.detach(); }
  export() { return call(() => this.#native.export()); }
  [Symbol.asyncDispose]() { return this.release(); }
}

class FencedStore {
  #native;

  constructor(n) {
    if (!(n instanceof native.FencedStore)) throw new TypeError('use client.fencedStore(key)');
    this.#native = n;
  }

  check(fence) { return call(() => this.#native.check(fence)); }
  write(fence, key, value) {
    const bytes = typeof value === 'string' ? Buffer.from(value) : value;
    return call(() => this.#native.write(fence, key, bytes));
  }
}

/** Runs the redsem command line in this process; returns its exit status (bin/redsem.js). */
function cliMain(args) {
  return native.cliMain(args);
}

module.exports = {
  connect,
  Client,
  Semaphore,
  Permit,
  FencedStore,
  cliMain,
  RedsemError,
  InvalidArgumentError,
  LimitConflictError,
  TooManyPermitsError,
  NoPermitsError,
  TimeoutError,
  LeaseLostError,
  RemovedFromQueueError,
  HandoffGoneError,
  ClosedError,
  UnknownSemaphoreError,
  InUseError,
  WrongTypeError,
  NotASemaphoreError,
  ProtocolMismatchError,
  CorruptError,
  EvictingPolicyError,
  NoPermissionError,
  AuthError,
  NotReplicatedError,
  UnreachableError,
  BackendError,
};
