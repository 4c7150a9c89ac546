//! What the runner's tasks share (the workers' supervisors, the fault schedule, the fenced
//! resource): the run's state in [`Shared`], the workers' slots, the replica, the resource's
//! registrations and stores; and the helpers more than one of them calls.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use redsem::fencing::FencedStore;
use test_support::{FakeClock, FaultProxy, Server};

use crate::config::Config;
use crate::events::Log;
use crate::proxy::ClientProxy;

/// The Redis incarnation that served a request sent at `from` and answered by `to`:
/// the number of restarts that were over (`dead`) before `from`, or `None` when a restart
/// (from its `start` to its `dead`) overlaps `[from, to]`. `restarts` is in start order,
/// `dead = i64::MAX` while unknown.
pub fn epoch_of(restarts: &[(i64, i64)], from: i64, to: i64) -> Option<u32> {
    let mut epoch = 0;
    for &(start, dead) in restarts {
        if to < start {
            break;
        }
        if from > dead {
            epoch += 1;
            continue;
        }
        return None;
    }
    Some(epoch)
}

/// The replica of the run's Redis (with `failover-replica`), and the link it replicates
/// through (a proxy to the master the runner can black-hole and sever).
pub(super) struct Replica {
    pub(super) server: Server,
    pub(super) link: FaultProxy,
}

/// Makes `server` a replica of `master` through a fresh link; waits (up to 10 s) for the
/// link to be up.
pub(super) fn attach_replica(
    server: &Server,
    master: std::net::SocketAddr,
) -> anyhow::Result<FaultProxy> {
    let link = FaultProxy::start(master);
    let port = link.addr().port().to_string();
    server
        .try_cmd(&["REPLICAOF", "127.0.0.1", &port])
        .context("REPLICAOF")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info = server.try_cmd(&["INFO", "replication"]);
        if let Ok(test_support::Reply::Bulk(text)) = &info
            && text.contains("master_link_status:up")
        {
            return Ok(link);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the replica did not sync: {info:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[derive(Default)]
pub(super) struct WorkerState {
    pub(super) id: u32,
    pub(super) pid: u32,
    pub(super) paused: bool,
    pub(super) killing: bool,
    /// op → (semaphore, holder id)
    pub(super) holding: BTreeMap<String, (usize, String)>,
    pub(super) waiting: HashSet<String>,
}

pub(super) struct Shared {
    pub(super) cfg: Config,
    pub(super) dir: PathBuf,
    pub(super) log: Log,
    pub(super) restarts: Mutex<Vec<(i64, i64)>>,
    pub(super) slots: Mutex<Vec<Option<WorkerState>>>,
    pub(super) resource: Mutex<ResourceState>,
    /// The `FencedStore`s that decide the writes, on their own Redis.
    pub(super) store: Store,
    pub(super) respawn: AtomicBool,
    pub(super) next_worker: AtomicU32,
    pub(super) acquisitions: AtomicU64,
    pub(super) faults: AtomicU64,
    /// An operator's redsem client, on a direct connection (for `force-release`).
    pub(super) operator: tokio::sync::Mutex<Option<redsem::Client>>,
    /// A direct connection, to tell which Redis incarnation holds a grant whose acquire
    /// overlapped a restart.
    pub(super) direct: tokio::sync::Mutex<Option<redis::aio::MultiplexedConnection>>,
    /// How the runner reaches Redis (the server, or with a replica, an unfaulted proxy that
    /// follows the failovers).
    pub(super) redis_url: String,
    /// With `failover-replica`: the replica, and the proxy behind `redis_url`.
    pub(super) replica: Mutex<Option<Replica>>,
    pub(super) direct_proxy: Option<Arc<ClientProxy>>,
    /// With `clock-step`: Redis's clock, and its offset from real time (ms).
    pub(super) clock: Option<FakeClock>,
    pub(super) clock_offset_ms: Mutex<i64>,
}

impl Shared {
    /// The state of a run of `cfg` writing into `dir`, its writes decided by `store`, its
    /// Redis reached at `redis_url` (with its `replica` and the `direct_proxy` to it, and its
    /// `clock`).
    pub(super) fn new(
        cfg: &Config,
        dir: &Path,
        store: Store,
        redis_url: String,
        replica: Option<Replica>,
        direct_proxy: Option<Arc<ClientProxy>>,
        clock: Option<FakeClock>,
    ) -> anyhow::Result<Shared> {
        Ok(Shared {
            cfg: cfg.clone(),
            dir: dir.to_owned(),
            log: Log::buffered(&dir.join("runner.log"))?,
            restarts: Mutex::new(Vec::new()),
            slots: Mutex::new((0..cfg.workers).map(|_| None).collect()),
            resource: Mutex::new(ResourceState::default()),
            store,
            respawn: AtomicBool::new(true),
            next_worker: AtomicU32::new(0),
            acquisitions: AtomicU64::new(0),
            faults: AtomicU64::new(0),
            operator: tokio::sync::Mutex::new(None),
            direct: tokio::sync::Mutex::new(None),
            redis_url,
            replica: Mutex::new(replica),
            direct_proxy,
            clock,
            clock_offset_ms: Mutex::new(0),
        })
    }

    pub(super) fn with_worker<R>(
        &self,
        id: u32,
        f: impl FnOnce(&mut WorkerState) -> R,
    ) -> Option<R> {
        let mut slots = self.slots.lock().unwrap();
        slots.iter_mut().flatten().find(|w| w.id == id).map(f)
    }
}

#[derive(Default)]
pub(super) struct ResourceState {
    /// op → (semaphore, epoch of its grant)
    pub(super) ops: HashMap<String, (usize, Option<u32>)>,
}

/// The store that decides the writes, one fence record per semaphore, and the lock that
/// orders decisions and their log lines.
pub(super) struct Store {
    pub(super) stores: Vec<FencedStore>,
    pub(super) order: tokio::sync::Mutex<()>,
}

impl Store {
    /// Fence records `chaos:{sem<i>}:fences` (written value `chaos:{sem<i>}:value`) on the
    /// store's own Redis.
    pub(super) fn new(client: &redsem::Client, sems: usize) -> Store {
        Store {
            stores: (0..sems)
                .map(|i| FencedStore::new(client, format!("chaos:{{sem{i}}}:fences")))
                .collect(),
            order: tokio::sync::Mutex::new(()),
        }
    }
}

pub(super) fn signal(pid: u32, sig: libc::c_int) {
    if pid > 0 {
        // SAFETY: kill(2) has no memory-safety preconditions. The pid is a worker of ours,
        // taken from the slot table, which its supervisor clears right after reaping it: in
        // that instant the pid could only reach another process if Linux recycled it at
        // once, which its sequential allocation (up to pid_max) does not do.
        unsafe { libc::kill(pid as libc::pid_t, sig) };
    }
}
