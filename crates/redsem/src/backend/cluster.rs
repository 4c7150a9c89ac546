//! Redis Cluster specifics: the client builder, and the commands that must reach one node
//! or every master (`SCAN` over the whole keyspace, the synced-mode pipeline).
//!
//! Scripts need nothing special: the cluster connection routes each one to the master of its
//! hash slot (a semaphore's keys and channels share one hash tag) and follows `MOVED` after a
//! failover. Grants travel on sharded pub/sub (`SSUBSCRIBE`; the scripts `SPUBLISH`).

use std::time::Duration;

use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{ConnectionInfo, Pipeline, RedisResult, Value};

use super::tls::Certs;

/// A cluster client builder for the seed `nodes`, with redsem's timeouts and retries.
pub(super) fn builder(
    nodes: &[ConnectionInfo],
    connect_timeout: Duration,
    response_timeout: Duration,
    certs: &Option<Certs>,
) -> ClusterClientBuilder {
    let b = ClusterClientBuilder::new(nodes.to_vec())
        .connection_timeout(connect_timeout)
        .response_timeout(response_timeout)
        .retries(3)
        .min_retry_wait(50)
        .max_retry_wait(1000);
    #[cfg(feature = "tls")]
    let b = match certs {
        Some(c) => b.certs(c.clone()),
        None => b,
    };
    #[cfg(not(feature = "tls"))]
    let _ = certs;
    b
}

/// `SCAN MATCH pattern` on every master (one page at a time per master).
pub(super) async fn scan_masters(
    c: &mut ClusterConnection,
    pattern: &str,
) -> RedisResult<Vec<String>> {
    let mut out = Vec::new();
    for (host, port) in masters(c).await? {
        let mut cursor: u64 = 0;
        loop {
            let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                host: host.clone(),
                port,
            });
            let reply = c.route_command(scan_page(cursor, pattern), routing).await?;
            let (next, keys): (u64, Vec<String>) = redis::from_redis_value(reply)?;
            out.extend(keys);
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    Ok(out)
}

/// One `SCAN cursor MATCH pattern COUNT 1000` (on a cluster, sent to one master).
pub(super) fn scan_page(cursor: u64, pattern: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(1000);
    cmd
}

/// Sends `pipeline` to the master that holds `key` (the node a script on `key` runs on).
pub(super) async fn pipeline_on_key(
    c: &mut ClusterConnection,
    key: &str,
    pipeline: &Pipeline,
) -> RedisResult<Vec<Value>> {
    let route = SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master));
    c.route_pipeline(pipeline.clone(), 0, pipeline.len(), route)
        .await
}

/// The (host, port) of every master of the cluster, from `CLUSTER SLOTS`.
async fn masters(c: &mut ClusterConnection) -> RedisResult<Vec<(String, u16)>> {
    let reply = c
        .route_command(
            redis::cmd("CLUSTER").arg("SLOTS").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await?;
    let mut masters = Vec::new();
    if let Value::Array(ranges) = reply {
        for range in ranges {
            if let Value::Array(items) = range
                && let Some(Value::Array(master)) = items.get(2)
                && let (Some(host), Some(port)) = (master.first(), master.get(1))
            {
                let host: String = redis::from_redis_value_ref(host)?;
                let port: u16 = redis::from_redis_value_ref(port)?;
                if !masters.contains(&(host.clone(), port)) {
                    masters.push((host, port));
                }
            }
        }
    }
    Ok(masters)
}
