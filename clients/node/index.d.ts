// Types of the npm package `redsem` (index.js): fair, crash-safe distributed semaphores on
// Redis and Valkey, over the redsem Rust crate. Durations are milliseconds.

/** Options of {@link connect}. */
export interface ConnectOptions {
  /** Key prefix (default `"redsem"`): keys are `<prefix>:{<name>}:<suffix>`. Replicas that share a semaphore use the same one. */
  prefix?: string;
  /** How long connecting may take, both connections and retries included (default 3000). */
  connectTimeoutMs?: number;
  /** How long one command may take (default 5000). Renewals that time out are retried until the lease could have expired. */
  responseTimeoutMs?: number;
  /** TLS (`rediss…` URLs): trust only the CA certificates of this PEM file. */
  tlsCa?: string;
  /** TLS: present this client certificate (PEM file), with {@link tlsKey}. */
  tlsCert?: string;
  /** TLS: the client certificate's private key (PEM file). */
  tlsKey?: string;
  /** {@link tlsCa} from PEM contents. */
  tlsCaPem?: string;
  /** {@link tlsCert} from PEM contents. */
  tlsCertPem?: string;
  /** {@link tlsKey} from PEM contents. */
  tlsKeyPem?: string;
  /** Synced mode: after every grant, wait (Redis `WAIT`) for this many replicas, at most {@link syncedTimeoutMs}; fewer fail the acquire with {@link NotReplicatedError} (permit released). Both or neither. */
  syncedReplicas?: number;
  /** Synced mode: how long a grant waits for its replicas. */
  syncedTimeoutMs?: number;
  /**
   * Run redsem's Lua code as scripts (`EVALSHA`) instead of its Redis Functions library
   * (`FCALL`; default false). The library's helpers are created once, when it is loaded
   * (`FUNCTION LOAD`, once per server and redsem version, by the first client that finds it
   * missing), where a script re-creates them on every call: scripts cost Redis more CPU per
   * call. A client falls back to the scripts by itself, with one log line, where the library
   * cannot be used (Redis before 7.0, an ACL or a managed service that refuses `FCALL` or
   * `FUNCTION LOAD`; docs/security.md): set this only to skip the attempt. Clients of either
   * kind share a semaphore.
   */
  scriptsOnly?: boolean;
}

/**
 * Connects to Redis or Valkey. The URL chooses the deployment: `redis://[user:pass@]host:port[/db]`,
 * `unix:///path`, `redis+cluster://host:port[,host:port…]` (Redis Cluster, seeds),
 * `redis+sentinel://host:port[,…]/master-name[/db]` (the master Sentinel names, followed across
 * failovers); `rediss…` for TLS. Without one (`undefined` or `null`): `$REDSEM_URL`, else
 * `$REDIS_URL`, else `redis://127.0.0.1:6379/` (as the CLI). Two connections per client whatever
 * the number of semaphores.
 *
 * @throws {InvalidArgumentError} a URL that does not parse, bad options.
 * @throws {UnreachableError} no connection within `connectTimeoutMs`.
 * @throws {AuthError} wrong credentials.
 */
export function connect(url?: string | null, options?: ConnectOptions): Promise<Client>;

/** Options of {@link Client.semaphore}. */
export interface SemaphoreOptions {
  /** Permits shared by every process that opens the semaphore (1 to 100,000). Must match the stored limit unless `limitPolicy` says otherwise. */
  limit: number;
  /** Lease of each holder and waiter (default 10000, at least 250: a shorter lease leaves its renewals too little room): a crashed holder's slot is free again within one lease. Renewed in the background. */
  leaseMs?: number;
  /** Renewal interval (default a third of the lease; at most a third). */
  renewEveryMs?: number;
  /** Longest time a waiter relies on notifications alone (default 1000). */
  fallbackPollMs?: number;
  /** Most permits this process may hold or queue for at once. */
  localCap?: number;
  /** Label shown in {@link Stats} for this handle's holders and waiters (default `host:pid`; at most 200 bytes, no control characters). */
  label?: string;
  /** Open even if Redis's `maxmemory-policy` can evict the keys (default false: {@link EvictingPolicyError}). */
  allowEvictingPolicy?: boolean;
  /**
   * What a stored limit other than `limit` does (default 'require': {@link LimitConflictError}).
   * 'adopt': use the stored one ({@link UnknownSemaphoreError} if the semaphore does not exist; nothing is created);
   * 'createOrAdopt': create with `limit` if absent, else use the stored one (for rolling deploys);
   * 'resize': create, or set the stored limit to `limit` for every process. See the Rust crate's `LimitPolicy`.
   */
  limitPolicy?: 'require' | 'adopt' | 'createOrAdopt' | 'resize';
}

/** Holders and waiters of one handle in this process. */
export interface LocalCounts {
  holders: number;
  waiters: number;
}

/** A connection to one Redis/Valkey deployment, shared by the semaphores of a process. */
export class Client {
  private constructor();
  /** The key prefix. */
  readonly prefix: string;
  /** This client's unique id (names its notification channel; part of its holder ids). */
  readonly id: string;
  /** Whether {@link close} was called. */
  readonly isClosed: boolean;
  /** `PING`: a cheap health check. @throws {UnreachableError} */
  ping(): Promise<void>;
  /**
   * Opens the semaphore `name` (creating it in Redis with `options.limit` if it does not exist).
   * Three round trips, once per handle.
   * @throws {InvalidArgumentError} bad name or options. @throws {LimitConflictError} stored with another limit.
   * @throws {EvictingPolicyError} @throws {WrongTypeError} @throws {ClosedError} after {@link close}.
   */
  semaphore(name: string, options: SemaphoreOptions): Promise<Semaphore>;
  /**
   * Shuts down gracefully; call it before exiting. Closes every handle (pending acquires fail
   * with {@link ClosedError}), gives up held permits (lost, reason `"shutdown"`), waits for every
   * release, then stops the background tasks and closes both connections. Idempotent. From then
   * on every call of the client (`ping`, `inspect`, the other operator calls) and of its handles
   * (`stats`, ...) rejects with {@link ClosedError} and sends nothing.
   */
  close(): Promise<void>;
  /** Waits until every release handed to the background (dropped permits, cancelled acquires) is done. */
  flushReleases(): Promise<void>;
  /** Names of every semaphore under the prefix, sorted (a `SCAN` of the keyspace: for operators). */
  listSemaphores(): Promise<string[]>;
  /**
   * Loads redsem's Redis Functions library (`FUNCTION LOAD`; on a cluster, on every master) and
   * resolves with its name, `redsem_<hash of its text>` (each redsem version has its own): for a
   * separate loader user where the applications' user may not load code (the rules are in
   * docs/security.md; the CLI's `redsem load-library`). Idempotent; one round trip per master.
   * Not needed otherwise: a client whose call finds the library missing loads it itself, or runs
   * the scripts where it may not.
   * @throws {NoPermissionError} the user may not run `FUNCTION LOAD`.
   * @throws {BackendError} the server has no Functions (Redis before 7.0) or refuses the library.
   */
  loadLibrary(): Promise<string>;
  /**
   * A snapshot of an existing semaphore, without opening it, listing at most `listed` holders
   * and waiters (default 100; 0: the counts alone; at most 1000). @throws {UnknownSemaphoreError}
   * @throws {InvalidArgumentError}
   */
  inspect(name: string, listed?: number): Promise<Stats>;
  /** Changes the limit of an existing semaphore, never creating it; see {@link Resized}. @throws {UnknownSemaphoreError} @throws {InvalidArgumentError} */
  resizeExisting(name: string, limit: number): Promise<Resized>;
  /**
   * An operator's release by id (see {@link Stats}): `'holder'` (its slots go to the queue; it
   * learns it at its next renewal), `'waiter'` (removed from the queue: its acquire rejects with
   * {@link RemovedFromQueueError}), or `null` (no such entry). @throws {UnknownSemaphoreError}
   */
  forceReleaseExisting(name: string, holderId: string): Promise<'holder' | 'waiter' | null>;
  /**
   * Deletes every key of the semaphore. Refused with {@link InUseError} while anyone holds or
   * waits, unless `force` (which evicts them). Returns how many entries were evicted.
   * @throws {UnknownSemaphoreError}
   */
  deleteSemaphore(name: string, options?: { force?: boolean }): Promise<number>;
  /** An atomic relative change of an existing semaphore's limit (concurrent changes all count), never creating it. @throws {UnknownSemaphoreError} @throws {InvalidArgumentError} outside 1..=100,000 (nothing changed). */
  addPermitsExisting(name: string, delta: number): Promise<Resized>;
  /**
   * Deletes every key the semaphore would use, another program's data included (what
   * `deleteSemaphore` with `force` refuses with {@link NotASemaphoreError}). Holders and waiters
   * are evicted as by a forced delete; returns how many. Only for an operator who has checked
   * that the data may go. @throws {UnknownSemaphoreError}
   */
  purgeKeys(name: string): Promise<number>;
  /** Fencing-token checks and fenced writes for a resource stored in Redis (the fence record is the hash `fenceKey`). No I/O. */
  fencedStore(fenceKey: string): FencedStore;
}

/** Options of {@link Semaphore.acquire}. */
export interface AcquireOptions {
  /** Permits to take at once (default 1), granted together in FIFO order. */
  permits?: number;
  /** Give up after this long with {@link TimeoutError}, leaving the queue (default, or `Infinity`: no limit). */
  timeoutMs?: number;
  /** This holder's lease (default the handle's; at least three renewal intervals). */
  leaseMs?: number;
  /** This holder's label in {@link Stats} (default the handle's; at most 200 bytes, no control characters). */
  label?: string;
  /**
   * Priority class, 0 (the default) to 9: higher classes are served first, FIFO within a
   * class; a request is overtaken by at most 1000 later requests per class above its own
   * (aging: nothing starves). Without priorities the queue is plain FIFO.
   */
  priority?: number;
  /**
   * The longest the permits may be held, counted from the grant (as this process learns it;
   * default: as long as the permit lives). Then the permit is lost with reason `'maxHold'`
   * (its `signal` aborts, `run`'s work is told to stop) and Redis stops renewing it: its slots
   * free within one lease even if the permit is kept, and at once when it is released.
   * Costs one timer per such permit. Zero or above 365 days: {@link InvalidArgumentError}.
   */
  maxHoldMs?: number;
  /** Cancels the wait: the acquire rejects with `signal.reason` and leaves the queue (a grant that arrived meanwhile is released). */
  signal?: AbortSignal;
}

/** Options of {@link Semaphore.tryAcquire}. */
export type TryAcquireOptions = Pick<AcquireOptions, 'permits' | 'leaseMs' | 'label' | 'priority' | 'maxHoldMs'>;

/** A fair (FIFO), crash-safe counting semaphore shared by every process that opens it. */
export class Semaphore {
  private constructor();
  readonly name: string;
  /** The limit as last seen in Redis (use {@link stats} for the current one). */
  readonly limit: number;
  /** Permits free as last seen in Redis (a snapshot; no I/O). */
  readonly availablePermits: number;
  /** Whether {@link close} (or the client's close) was called. */
  readonly isClosed: boolean;
  /** Holders and waiters of this handle in this process, without I/O. */
  localCounts(): LocalCounts;
  /**
   * Waits for permits in FIFO order. At most one script call (shared with concurrent acquires).
   * @throws {TimeoutError} @throws {TooManyPermitsError} more permits than the limit.
   * @throws {InvalidArgumentError} @throws {ClosedError} @throws {UnreachableError}
   */
  acquire(options?: AcquireOptions): Promise<Permit>;
  /** Takes permits only if free now and nobody is queued; never queues. @throws {NoPermitsError} */
  tryAcquire(options?: TryAcquireOptions): Promise<Permit>;
  /** Acquires, runs `work`, releases (also when `work` throws). Watch `permit.signal` to stop on loss. */
  run<T>(work: (permit: Permit) => Promise<T> | T, options?: AcquireOptions): Promise<T>;
  /**
   * A consistent snapshot: limit, use, counts of every holder and waiter, and at most `listed`
   * of each (default 100; 0: the counts alone; 1: the head of the queue; at most 1000). One
   * read-only round trip, whose Redis time grows with the entries listed, never with the queue.
   * @throws {InvalidArgumentError}
   */
  stats(listed?: number): Promise<Stats>;
  /** Changes the limit for every replica, live; a shrink rejects the queued requests larger than the new limit. See {@link Resized}. */
  resize(limit: number): Promise<Resized>;
  /** Changes the limit by `delta` atomically (concurrent changes all count). @throws {InvalidArgumentError} outside 1..=100,000 (nothing changed). */
  addPermits(delta: number): Promise<Resized>;
  /** An operator's release of a holder or queued ticket by id (see {@link Stats}); whether it existed. */
  forceRelease(holderId: string): Promise<boolean>;
  /**
   * Takes over a permit another process exported ({@link Permit.export}'s token, the same string in Rust, Python and Node.js): this handle renews it from now on, with the token's slots, fences, holder id and lease. One script call. Adopted twice, the last adopter holds it; an earlier one finds it lost (`lostReason` `'handedOff'`) at its next renewal.
   * @throws {HandoffGoneError} the permit is no longer in Redis (its lease ran out before adoption, or it was released): acquire a new one.
   * @throws {InvalidArgumentError} a token of another semaphore, or text that is not a token.
   */
  adopt(token: string): Promise<Permit>;
  /** Releases the permit of a hand-off token without adopting it (its slots go to the queue at once). Idempotent: whether it was still there. One script call. @throws {InvalidArgumentError} a token of another semaphore. */
  releaseHandoff(token: string): Promise<boolean>;
  /** Closes this handle in this process: pending and later acquires fail with {@link ClosedError}. Held permits stay valid. */
  close(): void;
}

/** Why a permit was lost (`'maxHold'`: the acquisition's {@link AcquireOptions.maxHoldMs} was reached; `'handedOff'`: another handle adopted its hand-off token; `'overwritten'`: a key of the semaphore was overwritten by another program's data, which the renewal found: the permit is given up at once). */
export type LostReason = 'notHolder' | 'unreachable' | 'shutdown' | 'refused' | 'deleted' | 'handedOff' | 'maxHold' | 'overwritten' | 'unknown';

/** What a change of the limit did ({@link Semaphore.resize}, {@link Semaphore.addPermits}, {@link Client.resizeExisting}). */
export interface Resized {
  /** The limit before the change. */
  previous: number;
  /** The limit now. */
  limit: number;
  /** The queued requests the change rejected, in queue order (each asked for more permits than the new limit; its acquire rejects with {@link TooManyPermitsError}). Empty unless the limit shrank. */
  rejected: RejectedWaiter[];
}

/** A queued request a shrink of the limit rejected. */
export interface RejectedWaiter {
  id: string;
  permits: number;
  label: string;
}

/**
 * A held permit. Its lease is renewed in the background until {@link release}. Release it
 * explicitly (a permit only garbage-collected is released then, which may be much later).
 */
export class Permit {
  private constructor();
  /** The semaphore's name. */
  readonly semaphore: string;
  /** The holder id in Redis (as in {@link Stats}). */
  readonly holderId: string;
  /** The ticket it was granted under: tickets are numbered in arrival order across all processes. */
  readonly ticket: number;
  /** Permits held. */
  readonly numPermits: number;
  /** Slots held, in `0..limit`, ascending; no other live holder has them. */
  readonly slots: number[];
  /** Fencing token per slot, `"slot:generation"`; generations of a slot rise with every grant. */
  readonly fences: string[];
  /** Whether {@link release} or {@link detach} was called. */
  readonly isReleased: boolean;
  /** Whether the lease is lost, or could have run out in Redis (no I/O). */
  readonly isLost: boolean;
  /** Why it is lost, or null. */
  readonly lostReason: LostReason | null;
  /** Time left before the lease could run out if no renewal succeeded from now. */
  readonly leaseLeftMs: number;
  /** The lease length each renewal extends it by. */
  readonly leaseMs: number;
  /** An AbortSignal aborted (with a {@link LeaseLostError}) when the permit is lost; never after release. Pass it to the work the permit guards. */
  readonly signal: AbortSignal;
  /** Calls `callback` with a {@link LeaseLostError} once the permit is lost (never after release). Until then a pending watch keeps Node.js running. */
  onLost(callback: (error: LeaseLostError) => void): this;
  /** Changes the lease length for this and later renewals. One script call. @throws {LeaseLostError} */
  setLease(leaseMs: number): Promise<void>;
  /** Releases and waits for Redis to confirm; a no-op once released. A failed release is retried in the background. */
  release(): Promise<void>;
  /** Stops renewing without releasing: the slot frees when the lease expires. */
  detach(): void;
  /**
   * Hands the permit to another process: resolves with a hand-off token (`redsem-handoff-1:…`, the same string in Rust, Python and Node.js) that {@link Semaphore.adopt} takes over or {@link Semaphore.releaseHandoff} releases. This process stops renewing it and detaches it in Redis (one script call) without releasing it: a token nobody adopts frees its slots within one lease. The permit counts as released here.
   * @throws {LeaseLostError} already lost. On any error the permit is released in the background and no token exists.
   */
  export(): Promise<string>;
  /** {@link release}, for `await using`. */
  [Symbol.asyncDispose](): Promise<void>;
}

/** One holder in {@link Stats}. */
export interface HolderInfo {
  id: string;
  label: string;
  permits: number;
  slots: number[];
  fences: string[];
  heldMs: number;
  leaseLeftMs: number;
}

/** One waiter in {@link Stats}. */
export interface WaiterInfo {
  id: string;
  label: string;
  permits: number;
  /** 0 = next to be granted. */
  position: number;
  ticket: number;
  /** Its priority class (0 by default). */
  priority: number;
  waitedMs: number;
  leaseLeftMs: number;
}

/** A consistent snapshot of one semaphore, taken by one read-only call (entries whose lease has passed are left out, and counted as expired). */
export interface Stats {
  name: string;
  limit: number;
  inUse: number;
  available: number;
  /** Oldest grant first; at most 100, or the `listed` asked (`holderCount` counts them all). */
  holders: HolderInfo[];
  /** In queue order, from the head; at most 100, or the `listed` asked (`waiterCount` counts them all). */
  waiters: WaiterInfo[];
  /** Every holder, listed or not. */
  holderCount: number;
  /** Every queued waiter, listed or not. */
  waiterCount: number;
  grantsTotal: number;
  expiredTotal: number;
  /** Times the scripts repaired inconsistent keys (non-zero: Redis lost some of the semaphore's data). */
  repairsTotal: number;
  /** Redis server time of the snapshot, ms since the Unix epoch. */
  serverTimeMs: number;
}

/** Fencing for a resource stored in Redis (on a cluster, the fence key and written keys share a hash tag). */
export class FencedStore {
  private constructor();
  /** Atomically checks and records `fence` (`"slot:generation"`): true when it is the highest seen for its slot. */
  check(fence: string): Promise<boolean>;
  /** Sets `key` to `value` only if `fence` is current; whether it wrote. */
  write(fence: string, key: string, value: string | Uint8Array): Promise<boolean>;
}

/** Runs the redsem command line in this process with these arguments (after the program name); returns its exit status. Blocks until done. */
export function cliMain(args: string[]): number;

/** Base class of redsem's errors. */
export class RedsemError extends Error {
  /** `ERR_REDSEM_…`, one per class. */
  readonly code: string;
  /** The semaphore's name, when the error is about one. */
  readonly semaphore?: string;
  /** Whether the same call may succeed later (unreachable, timeout, no permits, not replicated). */
  readonly retryable: boolean;
}
/** `ERR_REDSEM_INVALID_ARGUMENT`: a bad argument; the message says which. */
export class InvalidArgumentError extends RedsemError {}
/** `ERR_REDSEM_LIMIT_CONFLICT`: the semaphore exists with another limit. */
export class LimitConflictError extends RedsemError { readonly requested: number; readonly stored: number; }
/** `ERR_REDSEM_TOO_MANY_PERMITS`: more permits at once than the limit. */
export class TooManyPermitsError extends RedsemError { readonly requested: number; readonly limit: number; }
/** `ERR_REDSEM_NO_PERMITS`: tryAcquire would have to wait. */
export class NoPermitsError extends RedsemError { readonly reason: 'noneFree' | 'queuedFirst' | 'localCap' | 'unknown'; }
/** `ERR_REDSEM_TIMEOUT`: not granted within `timeoutMs`. */
export class TimeoutError extends RedsemError { readonly timeoutMs: number; }
/** `ERR_REDSEM_LEASE_LOST`: the permit's slot is lost. */
export class LeaseLostError extends RedsemError { readonly reason: LostReason; }
/** `ERR_REDSEM_REMOVED_FROM_QUEUE`: an operator removed this request from the queue before it was granted (cancelled on purpose: do not simply retry). */
export class RemovedFromQueueError extends RedsemError {}
/** `ERR_REDSEM_HANDOFF_GONE`: {@link Semaphore.adopt}: the token's permit (`holderId`) is no longer in Redis (its lease ran out before adoption, or it was released); acquire a new one. */
export class HandoffGoneError extends RedsemError { readonly holderId: string; }
/** `ERR_REDSEM_CLOSED`: the handle or client was closed. */
export class ClosedError extends RedsemError {}
/** `ERR_REDSEM_UNKNOWN_SEMAPHORE`: no such semaphore under the prefix. */
export class UnknownSemaphoreError extends RedsemError { readonly prefix: string; }
/** `ERR_REDSEM_IN_USE`: delete refused while held or waited for. */
export class InUseError extends RedsemError { readonly holders: number; readonly waiters: number; }
/** `ERR_REDSEM_WRONG_TYPE`: a key of the semaphore holds a foreign value. */
export class WrongTypeError extends RedsemError {}
/** `ERR_REDSEM_NOT_A_SEMAPHORE`: the configuration key holds another program's hash; nothing changed. */
export class NotASemaphoreError extends RedsemError {}
/** `ERR_REDSEM_PROTOCOL_MISMATCH`: created under another protocol version. */
export class ProtocolMismatchError extends RedsemError {}
/** `ERR_REDSEM_CORRUPT`: the keys contradict each other beyond repair. */
export class CorruptError extends RedsemError {}
/** `ERR_REDSEM_EVICTING_POLICY`: Redis may evict the keys. */
export class EvictingPolicyError extends RedsemError { readonly policy: string; }
/** `ERR_REDSEM_NO_PERMISSION`: an ACL refused a command, key or channel. */
export class NoPermissionError extends RedsemError {}
/** `ERR_REDSEM_AUTH`: authentication failed. */
export class AuthError extends RedsemError {}
/** `ERR_REDSEM_NOT_REPLICATED`: synced mode, too few replicas acknowledged; the permit was released. */
export class NotReplicatedError extends RedsemError { readonly acked: number; readonly wanted: number; readonly timeoutMs: number; }
/** `ERR_REDSEM_UNREACHABLE`: Redis unreachable or too slow; retryable. */
export class UnreachableError extends RedsemError {}
/** `ERR_REDSEM_BACKEND`: another error from Redis. */
export class BackendError extends RedsemError {}
