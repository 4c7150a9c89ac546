//! `synced`: what the library's synced mode costs (`ClientBuilder::synced_replicas`: a grant
//! counts once enough replicas have it, one more script call plus `WAIT`). One process, one
//! task, sequential uncontended acquire + release cycles, against a private master with one
//! replica started for each repetition (so that no other scenario pays for replication, and
//! also when `REDIS_URL` is set); rows: plain, and `synced_replicas(1)` (1 s timeout). Run by
//! the shared job run ([`super::jobs`]).
//!
//! Only the `redsem` design (the reference's designs have no synced mode).

use std::time::Duration;

use test_support::{Reply, Server};

use super::{RepResult, RunArgs, ScenarioKind, ScenarioParams, jobs};
use crate::designs::DesignKind;
use crate::harness::Harness;

/// One workload per row: plain, then synced with one replica.
pub(super) fn variants(n: impl Fn(f64, u64) -> u64) -> Vec<ScenarioParams> {
    [0, 1]
        .into_iter()
        .map(|replicas| ScenarioParams {
            procs: 1,
            workers: 1,
            jobs_per_proc: n(1000.0, 10),
            limit: 64,
            hold_ms: 0.0,
            lease_ms: 5000,
            run_timeout_s: 60.0,
            synced_replicas: Some(replicas),
            ..ScenarioParams::default()
        })
        .collect()
}

/// One line for reports (the table heading: the rows differ in the mode).
pub(super) fn describe(p: &ScenarioParams) -> String {
    format!(
        "1 process x 1 task, {} sequential acquire+release cycles, uncontended (limit {}), \
         against a private master with one replica; rows: plain and synced_replicas(1)",
        p.jobs_per_proc, p.limit
    )
}

/// The row's mode, for the table.
pub fn mode(p: &ScenarioParams) -> String {
    match p.synced_replicas.unwrap_or(0) {
        0 => "plain".into(),
        n => format!("synced_replicas({n})"),
    }
}

/// One repetition on a fresh master + replica pair.
pub async fn run_once(
    a: &RunArgs,
    design: DesignKind,
    p: &ScenarioParams,
    rep: u32,
) -> anyhow::Result<RepResult> {
    let (master, replica) = start_pair()?;
    let h = Harness::new(&master.url()).await?;
    let r = jobs::run_once(&h, a, ScenarioKind::Synced, design, p, rep).await;
    drop(h);
    drop(replica);
    drop(master);
    r
}

/// A private master and one replica in sync with it.
fn start_pair() -> anyhow::Result<(Server, Server)> {
    let master = crate::start_private_redis(Vec::new())?;
    let replica = crate::start_private_redis(vec![
        "--replicaof".into(),
        "127.0.0.1".into(),
        master.port().to_string(),
    ])?;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(Reply::Bulk(t)) = replica.try_cmd(&["INFO", "replication"])
            && t.contains("master_link_status:up")
        {
            return Ok((master, replica));
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the replica did not sync with its master within 20 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
