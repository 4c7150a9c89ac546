//! A private Redis Cluster: masters and replicas on reserved loopback ports, created with
//! `redis-cli --cluster create`, with helpers to fail over, kill and restart nodes.
//!
//! ```no_run
//! use test_support::{Cluster, Flavor};
//!
//! let cluster = Cluster::start(Flavor::Redis); // 3 masters + 3 replicas
//! let master = cluster.master_for_key("redsem:{jobs}:cfg");
//! let replica = cluster.replica_of(master).unwrap();
//! let new_master = cluster.failover(master); // CLUSTER FAILOVER on its replica
//! assert_eq!(new_master, replica);
//! println!("seed URL: {}", cluster.url());
//! ```

use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use std::sync::Arc;

use crate::resp::Reply;
use crate::server::{tail, wait_timeout};
use crate::{Flavor, PortLease, Server, ServerOptions, TlsCerts, reserve_port};

const FORM_TIMEOUT: Duration = Duration::from_secs(60);
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);

/// How to build a [`Cluster`].
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// Number of masters (at least 3: Redis Cluster needs a majority of masters to fail over).
    pub masters: usize,
    /// Replicas per master.
    pub replicas_per_master: usize,
    /// `cluster-node-timeout` in milliseconds: how long a node may be unreachable before it
    /// is considered failing. Failure detection and promotion take about twice this.
    pub node_timeout_ms: u64,
    /// Options of every node (ACL users, password, extra arguments).
    pub server: ServerOptions,
    /// TLS: every node also listens for TLS (client certificates required), and the nodes
    /// talk to each other over TLS (`tls-cluster`, `tls-replication`). The plain ports stay
    /// open for the test's own checks; [`Cluster::tls_url`] names the TLS ports.
    pub tls: Option<Arc<TlsCerts>>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            masters: 3,
            replicas_per_master: 1,
            node_timeout_ms: 2000,
            server: ServerOptions::default(),
            tls: None,
        }
    }
}

/// One node as a live node sees it in `CLUSTER NODES`.
#[derive(Clone, Debug)]
struct NodeView {
    id: String,
    port: u16,
    master: bool,
    failed: bool,
    master_id: Option<String>,
    slots: Vec<(u16, u16)>,
}

/// What a node thinks of another: port, master?, its master's id, its slots.
type Assignment = (u16, bool, Option<String>, Vec<(u16, u16)>);

/// A private Redis Cluster (each node a [`Server`]), stopped on drop.
pub struct Cluster {
    flavor: Flavor,
    nodes: Vec<Server>,
    killed: Vec<bool>,
    opts: ClusterOptions,
    tls_ports: Vec<PortLease>,
    _bus_ports: Vec<PortLease>,
}

impl Cluster {
    /// 3 masters, each with 1 replica, node timeout 2 s.
    pub fn start(flavor: Flavor) -> Cluster {
        Cluster::start_with(flavor, ClusterOptions::default())
    }

    pub fn start_with(flavor: Flavor, opts: ClusterOptions) -> Cluster {
        assert!(opts.masters >= 3, "a cluster needs at least 3 masters");
        let total = opts.masters * (1 + opts.replicas_per_master);
        let mut server_opts = opts.server.clone();
        server_opts.extra_args.extend(
            [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                &opts.node_timeout_ms.to_string(),
                // a replica may always be promoted, however long it was disconnected
                "--cluster-replica-validity-factor",
                "0",
                // fast initial sync of the replicas (the default waits 5 s for more replicas)
                "--repl-diskless-sync",
                "yes",
                "--repl-diskless-sync-delay",
                "0",
            ]
            .map(String::from),
        );
        // replicas authenticate to their master as the default user
        if let Some(pw) = &opts.server.password {
            server_opts
                .extra_args
                .extend(["--masterauth".to_owned(), pw.clone()]);
        }
        let mut tls_ports = Vec::new();
        let mut bus_ports = Vec::new();
        let nodes: Vec<Server> = (0..total)
            .map(|_| {
                let mut o = server_opts.clone();
                // the bus port defaults to port + 10000, which may be taken or above 65535
                let bus = reserve_port();
                o.extra_args
                    .extend(["--cluster-port".to_owned(), bus.port.to_string()]);
                bus_ports.push(bus);
                if let Some(certs) = &opts.tls {
                    let lease = reserve_port();
                    o.extra_args.extend(certs.server_args(lease.port, true));
                    o.extra_args.extend(
                        ["--tls-cluster", "yes", "--tls-replication", "yes"].map(String::from),
                    );
                    tls_ports.push(lease);
                }
                Server::start_with(flavor, o)
            })
            .collect();
        let cluster = Cluster {
            flavor,
            killed: vec![false; nodes.len()],
            nodes,
            opts,
            tls_ports,
            _bus_ports: bus_ports,
        };
        cluster.create();
        cluster.wait_healthy();
        cluster
    }

    fn create(&self) {
        let mut cmd = Command::new(redis_cli());
        cmd.arg("--cluster").arg("create");
        for n in &self.nodes {
            cmd.arg(format!("127.0.0.1:{}", n.port()));
        }
        cmd.args([
            "--cluster-replicas",
            &self.opts.replicas_per_master.to_string(),
            "--cluster-yes",
        ]);
        if let Some(pw) = &self.opts.server.password {
            cmd.args(["-a", pw, "--no-auth-warning"]);
        }
        // redis-cli waits forever for nodes that cannot meet: bound it
        let log = self.nodes[0].dir().join("cluster-create.log");
        let file = std::fs::File::create(&log).expect("cannot create cluster-create.log");
        cmd.stdin(std::process::Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run redis-cli --cluster create: {e}"));
        let finished = wait_timeout(&mut child, FORM_TIMEOUT);
        if !finished {
            let _ = child.kill();
            let _ = child.wait();
        }
        let status = child.wait().ok();
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            finished
                && status.is_some_and(|s| s.success())
                && text.contains("All 16384 slots covered"),
            "redis-cli --cluster create failed ({}):\n{}",
            if finished {
                format!("{status:?}")
            } else {
                format!("no result within {FORM_TIMEOUT:?}")
            },
            tail(&text, 40)
        );
    }

    pub fn flavor(&self) -> Flavor {
        self.flavor
    }

    /// Number of nodes (masters and replicas, killed ones included).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn node(&self, i: usize) -> &Server {
        &self.nodes[i]
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,...` with every node as a seed.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// `rediss+cluster://127.0.0.1:T1,...` with every node's TLS port (a cluster started with
    /// [`ClusterOptions::tls`]).
    pub fn tls_url(&self) -> String {
        assert!(
            !self.tls_ports.is_empty(),
            "this cluster was started without TLS"
        );
        let seeds: Vec<String> = self
            .tls_ports
            .iter()
            .map(|l| format!("127.0.0.1:{}", l.port))
            .collect();
        format!("rediss+cluster://{}", seeds.join(","))
    }

    /// The index of the node with this port (plain or TLS).
    pub fn index_of_port(&self, port: u16) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .or_else(|| self.tls_ports.iter().position(|l| l.port == port))
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`).
    pub fn slot_of(&self, key: &str) -> u16 {
        let reply = self.any_live().cmd(&["CLUSTER", "KEYSLOT", key]);
        reply.as_int().expect("CLUSTER KEYSLOT") as u16
    }

    /// The index of the master that serves `key` now.
    pub fn master_for_key(&self, key: &str) -> usize {
        let slot = self.slot_of(key);
        self.view()
            .iter()
            .find(|v| v.master && !v.failed && v.slots.iter().any(|&(a, b)| a <= slot && slot <= b))
            .and_then(|v| self.index_of_port(v.port))
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
    }

    /// The indices of the current (live) masters that serve slots.
    pub fn masters(&self) -> Vec<usize> {
        self.view()
            .iter()
            .filter(|v| v.master && !v.failed && !v.slots.is_empty())
            .filter_map(|v| self.index_of_port(v.port))
            .collect()
    }

    /// A live replica of the master `master`, if it has one.
    pub fn replica_of(&self, master: usize) -> Option<usize> {
        let view = self.view();
        let port = self.nodes[master].port();
        let id = view.iter().find(|v| v.port == port)?.id.clone();
        view.iter()
            .filter(|v| !v.failed && v.master_id.as_deref() == Some(id.as_str()))
            .filter_map(|v| self.index_of_port(v.port))
            .find(|&i| !self.killed[i])
    }

    /// Sends a command to the master that serves `key`.
    pub fn cmd_for_key(&self, key: &str, args: &[&str]) -> Reply {
        self.nodes[self.master_for_key(key)].cmd(args)
    }

    /// A manual failover of `master`: `CLUSTER FAILOVER` on one of its replicas. Waits until
    /// the replica is master, the old master its replica, and the cluster healthy. Returns the
    /// index of the new master.
    pub fn failover(&self, master: usize) -> usize {
        let replica = self
            .replica_of(master)
            .unwrap_or_else(|| panic!("node {master} has no live replica to fail over to"));
        let r = self.nodes[replica].cmd(&["CLUSTER", "FAILOVER"]);
        assert!(r.is_ok(), "CLUSTER FAILOVER on node {replica}: {r}");
        self.wait_until("the manual failover", FAILOVER_TIMEOUT, || {
            role(&self.nodes[replica]) == "master" && role(&self.nodes[master]) == "slave"
        });
        self.wait_healthy();
        replica
    }

    /// Kills `master` (SIGKILL) and waits until one of its replicas has been promoted and the
    /// cluster is healthy again. Returns the index of the new master.
    pub fn kill_master(&mut self, master: usize) -> usize {
        let replica = self
            .replica_of(master)
            .unwrap_or_else(|| panic!("node {master} has no live replica to take over"));
        self.kill(master);
        self.wait_until("the promotion of a replica", FAILOVER_TIMEOUT, || {
            role(&self.nodes[replica]) == "master"
        });
        self.wait_healthy();
        replica
    }

    /// SIGKILL one node; it stays down until [`Cluster::restart`].
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
        self.killed[i] = true;
    }

    /// Starts a killed node again (empty data, its `nodes.conf` kept: it rejoins the cluster,
    /// as a replica if its slots were taken over) and waits until the cluster is healthy.
    pub fn restart(&mut self, i: usize) {
        self.nodes[i].restart();
        self.killed[i] = false;
        self.wait_healthy();
    }

    /// Waits until every live node reports `cluster_state:ok`, knows every live node, and
    /// every live replica's link to its master is up.
    pub fn wait_healthy(&self) {
        self.wait_until("a healthy cluster", FORM_TIMEOUT, || {
            // every live node has the same view of who is master of what
            let views: Vec<Vec<Assignment>> = self
                .live()
                .map(|n| {
                    let mut v: Vec<_> = n
                        .try_cmd(&["CLUSTER", "NODES"])
                        .map(|r| parse_nodes(&r))
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|v| !v.failed)
                        .map(|v| (v.port, v.master, v.master_id, v.slots))
                        .collect();
                    v.sort();
                    v
                })
                .collect();
            if views.windows(2).any(|w| w[0] != w[1]) {
                return false;
            }
            self.live().all(|n| {
                let Ok(Reply::Bulk(info)) = n.try_cmd(&["CLUSTER", "INFO"]) else {
                    return false;
                };
                if !info.contains("cluster_state:ok") {
                    return false;
                }
                let Ok(Reply::Bulk(repl)) = n.try_cmd(&["INFO", "replication"]) else {
                    return false;
                };
                let view = parse_nodes(&n.cmd(&["CLUSTER", "NODES"]));
                let live_ports: Vec<u16> = self.live().map(Server::port).collect();
                let sees_all_live = live_ports
                    .iter()
                    .all(|p| view.iter().any(|v| v.port == *p && !v.failed));
                let slots_owned = view
                    .iter()
                    .filter(|v| v.master && !v.failed)
                    .flat_map(|v| v.slots.iter().map(|(a, b)| (*b - *a) as usize + 1))
                    .sum::<usize>()
                    == 16384;
                sees_all_live
                    && slots_owned
                    && (repl.contains("role:master") || repl.contains("master_link_status:up"))
            })
        });
    }

    fn live(&self) -> impl Iterator<Item = &Server> {
        self.nodes
            .iter()
            .zip(&self.killed)
            .filter(|(_, k)| !**k)
            .map(|(n, _)| n)
    }

    fn any_live(&self) -> &Server {
        self.live()
            .next()
            .expect("every node of the cluster is down")
    }

    fn view(&self) -> Vec<NodeView> {
        // ask a live master: it has the freshest view of the slots
        for n in self.live() {
            if let Ok(reply @ Reply::Bulk(_)) = n.try_cmd(&["CLUSTER", "NODES"]) {
                let view = parse_nodes(&reply);
                let me = view.iter().find(|v| v.port == n.port());
                if me.is_some_and(|m| m.master && !m.slots.is_empty()) {
                    return view;
                }
            }
        }
        parse_nodes(&self.any_live().cmd(&["CLUSTER", "NODES"]))
    }

    fn wait_until(&self, what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + timeout;
        while !cond() {
            if Instant::now() > deadline {
                let mut report = String::new();
                for (i, n) in self.nodes.iter().enumerate() {
                    report.push_str(&format!(
                        "--- node {i} (port {}, killed: {}) ---\n",
                        n.port(),
                        self.killed[i]
                    ));
                    if !self.killed[i] {
                        report.push_str(&format!(
                            "{}\n{}\n",
                            n.try_cmd(&["CLUSTER", "NODES"])
                                .map(|r| r.to_string())
                                .unwrap_or_default(),
                            tail(&n.log(), 15)
                        ));
                    }
                }
                panic!(
                    "{} cluster: no {what} within {timeout:?}\n{report}",
                    self.flavor
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ports: Vec<u16> = self.nodes.iter().map(Server::port).collect();
        f.debug_struct("Cluster")
            .field("flavor", &self.flavor)
            .field("ports", &ports)
            .field("killed", &self.killed)
            .finish()
    }
}

/// `redis-cli` (also used for Valkey: the cluster protocol is the same).
fn redis_cli() -> String {
    std::env::var("REDSEM_REDIS_CLI").unwrap_or_else(|_| "redis-cli".into())
}

/// The role of a node (`master`, `slave`), or `down`.
fn role(n: &Server) -> String {
    match n.try_cmd(&["ROLE"]) {
        Ok(Reply::Array(items)) => items
            .first()
            .and_then(Reply::as_str)
            .unwrap_or("?")
            .to_owned(),
        _ => "down".into(),
    }
}

fn parse_nodes(reply: &Reply) -> Vec<NodeView> {
    let text = reply.as_str().unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            // ip:port@cport[,hostname]
            let port = f[1].split('@').next()?.rsplit(':').next()?.parse().ok()?;
            let flags = f[2];
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|x| (x, x)),
                })
                .collect();
            Some(NodeView {
                id: f[0].to_owned(),
                port,
                master: flags.contains("master"),
                failed: flags.contains("fail") && !flags.contains("fail?")
                    || flags.contains("noaddr")
                    || flags.contains("handshake"),
                master_id: (f[3] != "-").then(|| f[3].to_owned()),
                slots,
            })
        })
        .collect()
}
