//! The parameters of one chaos run, saved as `config.json` beside its logs.

use std::fmt;
use std::str::FromStr;

use redsem::internals::Keys;
use serde::{Deserialize, Serialize};

/// The key prefix of every run: the workers connect with it, and the runner and the
/// snapshotter read the semaphores' keys under it (see [`Config::keys`]).
pub const PREFIX: &str = redsem::DEFAULT_PREFIX;

/// One semaphore the workers share.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SemSpec {
    /// Name in Redis (under the key prefix [`PREFIX`]).
    pub name: String,
    /// Its limit.
    pub limit: u32,
    /// Largest number of permits one acquisition asks for (`acquire_many`).
    pub max_n: u32,
    /// Relative frequency with which a worker picks it.
    pub weight: u32,
}

/// The kinds of fault the runner injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// SIGKILL of a worker that holds a permit.
    KillHolder,
    /// SIGKILL of a worker that waits for a permit (and, if possible, holds none).
    KillWaiter,
    /// SIGSTOP, then SIGCONT after less than the lease.
    PauseShort,
    /// SIGSTOP, then SIGCONT after more than the lease.
    PauseLong,
    /// Reset of a worker's command connection (and, sometimes, refusal of its reconnections
    /// for a while).
    CutCmd,
    /// Reset of a worker's pub/sub (notification) connection.
    CutPubsub,
    /// A worker's command connection forwards nothing for a while (bytes are held, as TCP
    /// would retransmit them).
    BlackholeCmd,
    /// A worker's pub/sub connection forwards nothing for a while.
    BlackholePubsub,
    /// Added latency on both of a worker's connections for a while.
    Latency,
    /// `CLIENT KILL TYPE pubsub` on the server: every worker loses its subscriber connection.
    ClientKillPubsub,
    /// Redis killed and started again, empty (data loss).
    RestartDataLoss,
    /// `DEBUG SLEEP`: Redis answers nothing for a while.
    DebugSleep,
    /// An operator's `force_release` of a holder (it learns at its next renewal).
    ForceRelease,
    /// A failover to a replica that lags: Redis saves its data (`SAVE`), runs on for less
    /// than one renewal interval, is killed, and comes back from that save, so the writes
    /// of that last stretch (grants, renewals, releases) are lost, as when a replica that
    /// missed them is promoted.
    FailoverLagging,
    /// One key of one semaphore deleted, as an eviction would: its records (`meta`; the
    /// holders learn at their next renewal, like a `force_release` of each), its free-slot
    /// set, its session index (`own`), its configuration (`cfg`), its queue, its lease set
    /// (`exp`), or its configuration and queue together. The scripts detect the loss at
    /// their next call, repair what they can from what survives, never grant beyond the
    /// limit and keep FIFO order.
    KeyLoss,
    /// A real failover to a replica that lags (chaos-managed, no Sentinel): the run's Redis
    /// has a replica that replicates through a link the runner controls. The runner waits
    /// until the replica has every write so far (`WAIT`, and the replica follows the master's
    /// current replication stream: not one still loading a full sync after a restart, whose
    /// acknowledgements count in the old stream), black-holes the link, lets the
    /// master run on for less than one renewal interval, SIGKILLs it, drops what the link
    /// held, promotes the replica (`REPLICAOF NO ONE`), re-points every proxy (the workers',
    /// and the one the runner reads Redis through) at it, and brings the old master back,
    /// empty, as the new master's replica. Failovers of both kinds come at least one lease +
    /// one renewal interval after the previous restart (the documented bound).
    FailoverReplica,
    /// Redis's clock stepped forward (`libfaketime`; the run uses Valkey, since Redis 7.0.15
    /// hangs under it): every lease in Redis ends early by the step. Steps up to the safety
    /// margin are covered always, up to margin + one renewal interval while no renewal was
    /// lost (the documented bound); larger ones, which only fencing covers, are drawn too.
    ClockStep,
}

impl FaultKind {
    /// Every kind, in a fixed order.
    pub const ALL: [FaultKind; 17] = [
        FaultKind::KillHolder,
        FaultKind::KillWaiter,
        FaultKind::PauseShort,
        FaultKind::PauseLong,
        FaultKind::CutCmd,
        FaultKind::CutPubsub,
        FaultKind::BlackholeCmd,
        FaultKind::BlackholePubsub,
        FaultKind::Latency,
        FaultKind::ClientKillPubsub,
        FaultKind::RestartDataLoss,
        FaultKind::DebugSleep,
        FaultKind::ForceRelease,
        FaultKind::FailoverLagging,
        FaultKind::KeyLoss,
        FaultKind::FailoverReplica,
        FaultKind::ClockStep,
    ];

    /// The kinds a run injects unless told otherwise: all but [`FaultKind::ClockStep`], which
    /// needs Valkey (Redis 7.0.15 hangs under libfaketime) and is asked for by name.
    pub fn defaults() -> Vec<FaultKind> {
        FaultKind::ALL
            .into_iter()
            .filter(|&k| k != FaultKind::ClockStep)
            .collect()
    }

    /// The kebab-case name used on the command line and in the logs.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillHolder => "kill-holder",
            FaultKind::KillWaiter => "kill-waiter",
            FaultKind::PauseShort => "pause-short",
            FaultKind::PauseLong => "pause-long",
            FaultKind::CutCmd => "cut-cmd",
            FaultKind::CutPubsub => "cut-pubsub",
            FaultKind::BlackholeCmd => "blackhole-cmd",
            FaultKind::BlackholePubsub => "blackhole-pubsub",
            FaultKind::Latency => "latency",
            FaultKind::ClientKillPubsub => "client-kill-pubsub",
            FaultKind::RestartDataLoss => "restart-data-loss",
            FaultKind::DebugSleep => "debug-sleep",
            FaultKind::ForceRelease => "force-release",
            FaultKind::FailoverLagging => "failover-lagging",
            FaultKind::KeyLoss => "key-loss",
            FaultKind::FailoverReplica => "failover-replica",
            FaultKind::ClockStep => "clock-step",
        }
    }

    /// Relative frequency in the schedule (restarts are rare: each one costs every holder
    /// its permit).
    pub fn weight(self) -> u32 {
        match self {
            FaultKind::KillHolder => 12,
            FaultKind::KillWaiter => 8,
            FaultKind::PauseShort => 10,
            FaultKind::PauseLong => 8,
            FaultKind::CutCmd => 8,
            FaultKind::CutPubsub => 8,
            FaultKind::BlackholeCmd => 8,
            FaultKind::BlackholePubsub => 8,
            FaultKind::Latency => 6,
            FaultKind::ClientKillPubsub => 3,
            FaultKind::RestartDataLoss => 1,
            FaultKind::DebugSleep => 4,
            FaultKind::ForceRelease => 4,
            FaultKind::FailoverLagging => 1,
            FaultKind::KeyLoss => 3,
            FaultKind::FailoverReplica => 1,
            FaultKind::ClockStep => 2,
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FaultKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FaultKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = FaultKind::ALL.iter().map(|k| k.name()).collect();
                format!("unknown fault kind {s:?} (known: {})", names.join(", "))
            })
    }
}

/// Everything that defines a run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Config {
    /// Seed of the fault schedule and of every worker's choices.
    pub seed: u64,
    /// Length of the fault phase, in seconds.
    pub seconds: u64,
    /// Worker slots (processes running at once; a killed worker is replaced).
    pub workers: u32,
    /// Concurrent acquire loops per worker process.
    pub tasks: u32,
    /// Lease of every holder and waiter.
    pub lease_ms: u64,
    /// Renewal interval.
    pub renew_ms: u64,
    /// Fallback poll interval of waiters.
    pub fallback_ms: u64,
    /// Tolerance added to every time bound the checker enforces.
    pub slack_ms: u64,
    /// Period of the snapshots of the semaphores in Redis.
    pub snapshot_ms: u64,
    /// Shortest and longest gap between two injected faults.
    pub fault_gap_ms: (u64, u64),
    /// The fault kinds injected.
    pub faults: Vec<FaultKind>,
    /// The semaphores.
    pub sems: Vec<SemSpec>,
    /// `redis` or `valkey`.
    pub flavor: String,
    /// A worker's stalled scheduler (no timer fired for this long) is logged as a stall.
    pub stall_ms: u64,
    /// The workers run redsem's scripts (`ClientBuilder::scripts_only`) instead of its
    /// Functions library: the fallback path.
    #[serde(default)]
    pub scripts_only: bool,
}

impl Config {
    /// The semaphores of every run: a mutex, two small pools, and a wide pool taken in
    /// multi-permit bites.
    pub fn default_sems() -> Vec<SemSpec> {
        let s = |name: &str, limit, max_n, weight| SemSpec {
            name: name.to_owned(),
            limit,
            max_n,
            weight,
        };
        vec![
            s("chaos-mutex", 1, 1, 20),
            s("chaos-pair", 2, 1, 25),
            s("chaos-pool", 4, 2, 30),
            s("chaos-wide", 8, 3, 25),
        ]
    }

    /// The keys of semaphore `name` under the run's prefix, named as in the library's layout
    /// (`cfg`, `queue`, `exp`, `meta`, `slots`, `free`, `own`; all seven in the scripts' order:
    /// `in_script_order()`).
    ///
    /// # Errors
    /// An invalid semaphore name.
    pub fn keys(&self, name: &str) -> Result<Keys, redsem::Error> {
        Keys::new(PREFIX, name)
    }

    /// The run's lease.
    pub fn lease(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.lease_ms)
    }

    /// Lease, renewal, fallback and slack in microseconds (the checker's unit).
    pub fn us(&self) -> Timing {
        Timing {
            lease: self.lease_ms as i64 * 1000,
            renew: self.renew_ms as i64 * 1000,
            fallback: self.fallback_ms as i64 * 1000,
            slack: self.slack_ms as i64 * 1000,
            snapshot: self.snapshot_ms as i64 * 1000,
        }
    }
}

/// The timing parameters in microseconds.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Lease.
    pub lease: i64,
    /// Renewal interval.
    pub renew: i64,
    /// Fallback poll interval.
    pub fallback: i64,
    /// Tolerance.
    pub slack: i64,
    /// Snapshot period.
    pub snapshot: i64,
}
