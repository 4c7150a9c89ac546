//! A private Sentinel deployment: one master, its replicas, and three sentinels watching it,
//! with helpers to fail over (`SENTINEL FAILOVER`) and to kill the master.
//!
//! ```no_run
//! use test_support::{Flavor, Sentinels};
//!
//! let mut set = Sentinels::start(Flavor::Redis);
//! println!("{}", set.url()); // redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/mymaster
//! let old = set.master();
//! let new = set.kill_master(); // the sentinels promote the replica
//! assert_ne!(old, new);
//! ```

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::resp::{Conn, Reply};
use crate::server::{spawn, tail};
use crate::{Flavor, PortLease, Server, ServerOptions, TlsCerts, reserve_port, server_binary};

const READY_TIMEOUT: Duration = Duration::from_secs(30);
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(40);

/// How to build [`Sentinels`].
#[derive(Clone, Debug)]
pub struct SentinelOptions {
    /// The name the sentinels monitor the master under.
    pub master_name: String,
    /// Replicas of the master.
    pub replicas: usize,
    /// Sentinels (the quorum is a majority of them).
    pub sentinels: usize,
    /// `down-after-milliseconds`: how long the master may not answer before a failover.
    pub down_after_ms: u64,
    /// `failover-timeout` in milliseconds.
    pub failover_timeout_ms: u64,
    /// Options of the data nodes (master and replicas): ACL users, password, extra args.
    pub server: ServerOptions,
    /// TLS: data nodes and sentinels also listen for TLS (client certificates required),
    /// and talk to each other over TLS; the sentinels name the TLS ports. The plain ports
    /// stay open for the test's own checks; [`Sentinels::tls_url`] names the TLS ports.
    pub tls: Option<Arc<TlsCerts>>,
}

impl Default for SentinelOptions {
    fn default() -> Self {
        SentinelOptions {
            master_name: "mymaster".into(),
            replicas: 1,
            sentinels: 3,
            down_after_ms: 1000,
            failover_timeout_ms: 3000,
            server: ServerOptions::default(),
            tls: None,
        }
    }
}

/// One `redis-server --sentinel` process, killed on drop.
pub struct SentinelNode {
    lease: PortLease,
    tls: Option<PortLease>,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl SentinelNode {
    fn start(flavor: Flavor, config: &str, tls: Option<&TlsCerts>) -> SentinelNode {
        let binary = server_binary(flavor)
            .unwrap_or_else(|| panic!("{flavor} server not found: {}", flavor.install_hint()));
        let dir = tempfile::Builder::new()
            .prefix(&format!("redsem-{flavor}-sentinel-"))
            .tempdir()
            .expect("cannot create a temp dir for a sentinel");
        let mut node = SentinelNode {
            lease: reserve_port(),
            tls: tls.map(|_| reserve_port()),
            dir,
            child: None,
        };
        for _ in 0..10 {
            let mut conf = format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {dir}/sentinel.log\n{config}",
                port = node.port(),
                dir = node.dir().display(),
            );
            if let (Some(certs), Some(lease)) = (tls, &node.tls) {
                let args = certs.server_args(lease.port, true);
                for pair in args.chunks(2) {
                    conf.push_str(&format!(
                        "{} {}\n",
                        pair[0].trim_start_matches("--"),
                        pair[1]
                    ));
                }
                conf.push_str("tls-replication yes\n");
            }
            let path = node.dir().join("sentinel.conf");
            std::fs::write(&path, conf).expect("cannot write sentinel.conf");
            let stdio = File::create(node.dir().join("stdio.log")).unwrap();
            let mut cmd = Command::new(&binary);
            cmd.arg(&path)
                .arg("--sentinel")
                .current_dir(node.dir())
                .stdin(Stdio::null())
                .stdout(stdio.try_clone().unwrap())
                .stderr(stdio);
            node.child = Some(spawn(cmd).expect("cannot start a sentinel"));
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Some(Ok(Some(_))) = node.child.as_mut().map(Child::try_wait) {
                    node.child = None;
                    break; // exited: port taken? try another
                }
                if node
                    .try_cmd(&["PING"])
                    .is_ok_and(|r| r.as_str() == Some("PONG"))
                {
                    return node;
                }
                assert!(
                    Instant::now() < deadline,
                    "sentinel did not start:\n{}",
                    node.log()
                );
                thread::sleep(Duration::from_millis(20));
            }
            if !node.log().contains("Address already in use") {
                panic!("sentinel exited at start:\n{}", tail(&node.log(), 30));
            }
            node.lease = reserve_port();
        }
        panic!("no port for a sentinel after 10 attempts");
    }

    pub fn port(&self) -> u16 {
        self.lease.port
    }

    /// The TLS port, for a set started with [`SentinelOptions::tls`].
    pub fn tls_port(&self) -> Option<u16> {
        self.tls.as_ref().map(|l| l.port)
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port()))
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// One command on a new connection; I/O errors come back.
    pub fn try_cmd(&self, args: &[&str]) -> io::Result<Reply> {
        Conn::connect(self.addr(), Duration::from_secs(10))?.call(args)
    }

    /// One command on a new connection; I/O errors panic.
    pub fn cmd(&self, args: &[&str]) -> Reply {
        self.try_cmd(args)
            .unwrap_or_else(|e| panic!("sentinel {}: {args:?}: {e}\n{}", self.port(), self.log()))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir().join("sentinel.log")).unwrap_or_default()
            + &std::fs::read_to_string(self.dir().join("stdio.log")).unwrap_or_default()
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for SentinelNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A master, its replicas and the sentinels that watch them; everything stops on drop.
pub struct Sentinels {
    flavor: Flavor,
    opts: SentinelOptions,
    data: Vec<Server>,
    /// TLS port of each data node (with [`SentinelOptions::tls`]).
    data_tls: Vec<PortLease>,
    killed: Vec<bool>,
    sentinels: Vec<SentinelNode>,
}

impl Sentinels {
    /// A master, one replica and three sentinels (quorum 2, down after 1 s).
    pub fn start(flavor: Flavor) -> Sentinels {
        Sentinels::start_with(flavor, SentinelOptions::default())
    }

    pub fn start_with(flavor: Flavor, opts: SentinelOptions) -> Sentinels {
        let mut base = opts.server.clone();
        base.extra_args.extend(
            [
                "--repl-diskless-sync",
                "yes",
                "--repl-diskless-sync-delay",
                "0",
            ]
            .map(String::from),
        );
        if let Some(pw) = &opts.server.password {
            base.extra_args
                .extend(["--masterauth".to_owned(), pw.clone()]);
        }
        let mut data_tls = Vec::new();
        let start = |mut o: ServerOptions, data_tls: &mut Vec<PortLease>| {
            if let Some(certs) = &opts.tls {
                let lease = reserve_port();
                o.extra_args.extend(certs.server_args(lease.port, true));
                o.extra_args
                    .extend(["--tls-replication".to_owned(), "yes".to_owned()]);
                data_tls.push(lease);
            }
            Server::start_with(flavor, o)
        };
        let master = start(base.clone(), &mut data_tls);
        let mut data = vec![];
        // the port the others reach the master on
        let master_port = match data_tls.first() {
            Some(lease) => lease.port,
            None => master.port(),
        };
        data.push(master);
        for _ in 0..opts.replicas {
            let mut o = base.clone();
            o.extra_args.extend([
                "--replicaof".to_owned(),
                "127.0.0.1".to_owned(),
                master_port.to_string(),
            ]);
            data.push(start(o, &mut data_tls));
        }
        let name = &opts.master_name;
        let mut conf = format!(
            "sentinel monitor {name} 127.0.0.1 {master_port} {quorum}\n\
             sentinel down-after-milliseconds {name} {down}\n\
             sentinel failover-timeout {name} {fo}\n\
             sentinel parallel-syncs {name} 1\n",
            quorum = opts.sentinels / 2 + 1,
            down = opts.down_after_ms,
            fo = opts.failover_timeout_ms,
        );
        if let Some(pw) = &opts.server.password {
            conf.push_str(&format!("sentinel auth-pass {name} {pw}\n"));
        }
        let sentinels = (0..opts.sentinels)
            .map(|_| SentinelNode::start(flavor, &conf, opts.tls.as_deref()))
            .collect();
        let set = Sentinels {
            flavor,
            killed: vec![false; data.len()],
            opts,
            data,
            data_tls,
            sentinels,
        };
        set.wait_ready(0);
        set
    }

    pub fn flavor(&self) -> Flavor {
        self.flavor
    }

    pub fn master_name(&self) -> &str {
        &self.opts.master_name
    }

    /// `redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/<master name>`
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        format!(
            "redis+sentinel://{}/{}",
            hosts.join(","),
            self.opts.master_name
        )
    }

    /// `rediss+sentinel://127.0.0.1:T1,.../<master name>` with the sentinels' TLS ports.
    pub fn tls_url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.tls_port().expect("started without TLS")))
            .collect();
        format!(
            "rediss+sentinel://{}/{}",
            hosts.join(","),
            self.opts.master_name
        )
    }

    /// The port the sentinels know data node `i` by (its TLS port with TLS).
    pub fn data_port(&self, i: usize) -> u16 {
        match self.data_tls.get(i) {
            Some(l) => l.port,
            None => self.data[i].port(),
        }
    }

    fn data_index(&self, port: u16) -> Option<usize> {
        (0..self.data.len()).find(|&i| self.data_port(i) == port)
    }

    /// The data node `i` (0 is the initial master).
    pub fn data(&self, i: usize) -> &Server {
        &self.data[i]
    }

    pub fn data_len(&self) -> usize {
        self.data.len()
    }

    pub fn sentinel(&self, i: usize) -> &SentinelNode {
        &self.sentinels[i]
    }

    pub fn sentinel_mut(&mut self, i: usize) -> &mut SentinelNode {
        &mut self.sentinels[i]
    }

    /// The index of the data node that the first answering sentinel names as master.
    pub fn master(&self) -> usize {
        for s in &self.sentinels {
            if let Some(port) = self.sentinel_master_port(s)
                && let Some(i) = self.data_index(port)
            {
                return i;
            }
        }
        panic!("no sentinel names a master");
    }

    fn sentinel_master_port(&self, s: &SentinelNode) -> Option<u16> {
        let r = s
            .try_cmd(&[
                "SENTINEL",
                "GET-MASTER-ADDR-BY-NAME",
                &self.opts.master_name,
            ])
            .ok()?;
        r.as_array()?.get(1)?.as_str()?.parse().ok()
    }

    /// `SENTINEL FAILOVER`: promotes a replica without waiting for agreement. Waits until
    /// every sentinel names the new master, it answers as master and its replicas are in
    /// sync. Returns the new master's index.
    pub fn failover(&self) -> usize {
        let old = self.master();
        let r = self.sentinels[0].cmd(&["SENTINEL", "FAILOVER", &self.opts.master_name]);
        assert!(r.is_ok(), "SENTINEL FAILOVER: {r}");
        self.wait_for_new_master(old)
    }

    /// Kills the master (SIGKILL) and waits until the sentinels have promoted a replica.
    /// Returns the new master's index; the old one stays down until [`Sentinels::restart`].
    pub fn kill_master(&mut self) -> usize {
        let old = self.master();
        self.data[old].kill();
        self.killed[old] = true;
        self.wait_for_new_master(old)
    }

    /// Starts a killed data node again, empty; the sentinels turn it into a replica of the
    /// current master (this waits for it).
    pub fn restart(&mut self, i: usize) {
        self.data[i].restart();
        self.killed[i] = false;
        let master = self.master();
        self.wait_ready(master);
    }

    fn wait_for_new_master(&self, old: usize) -> usize {
        let deadline = Instant::now() + FAILOVER_TIMEOUT;
        loop {
            let ports: Vec<Option<u16>> = self
                .sentinels
                .iter()
                .map(|s| self.sentinel_master_port(s))
                .collect();
            let agreed = ports[0].filter(|p| ports.iter().all(|q| *q == Some(*p)));
            if let Some(port) = agreed
                && let Some(i) = self.data_index(port)
                && i != old
                && role(&self.data[i]) == "master"
            {
                self.wait_ready(i);
                return i;
            }
            if Instant::now() > deadline {
                panic!(
                    "{} sentinels: no failover within {FAILOVER_TIMEOUT:?} (masters named: {ports:?})\n{}",
                    self.flavor,
                    self.report()
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until every sentinel knows the others and the live replicas, and the live
    /// replicas of `master` are in sync with it.
    fn wait_ready(&self, master: usize) {
        let deadline = Instant::now() + READY_TIMEOUT;
        let live_replicas = (0..self.data.len())
            .filter(|&i| i != master && !self.killed[i])
            .count();
        loop {
            let sentinels_ready = self.sentinels.iter().all(|s| {
                let Ok(r) = s.try_cmd(&["SENTINEL", "MASTER", &self.opts.master_name]) else {
                    return false;
                };
                let field = |name: &str| -> Option<String> {
                    let items = r.as_array()?;
                    let i = items.iter().position(|x| x.as_str() == Some(name))?;
                    Some(items.get(i + 1)?.as_str()?.to_owned())
                };
                field("port").and_then(|p| p.parse::<u16>().ok()) == Some(self.data_port(master))
                    && field("num-other-sentinels").as_deref()
                        == Some(&(self.sentinels.len() - 1).to_string())
                    && field("num-slaves")
                        .and_then(|n| n.parse::<usize>().ok())
                        .is_some_and(|n| n >= live_replicas)
                    && field("flags").is_some_and(|f| f == "master")
            });
            let replicas_synced = (0..self.data.len())
                .filter(|&i| i != master && !self.killed[i])
                .all(|i| {
                    matches!(self.data[i].try_cmd(&["INFO", "replication"]),
                        Ok(Reply::Bulk(t)) if t.contains("master_link_status:up")
                            && t.contains(&format!("master_port:{}", self.data_port(master))))
                });
            if sentinels_ready && replicas_synced {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "{} sentinels: not ready within {READY_TIMEOUT:?}\n{}",
                    self.flavor,
                    self.report()
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    fn report(&self) -> String {
        let mut out = String::new();
        for (i, s) in self.sentinels.iter().enumerate() {
            out.push_str(&format!(
                "--- sentinel {i} (port {}) ---\n{}\n",
                s.port(),
                tail(&s.log(), 15)
            ));
        }
        for (i, d) in self.data.iter().enumerate() {
            out.push_str(&format!(
                "--- data node {i} (port {}, killed: {}) ---\n{}\n",
                d.port(),
                self.killed[i],
                tail(&d.log(), 10)
            ));
        }
        out
    }

    /// Paths of the sentinels' working directories (they hold `sentinel.log`).
    pub fn sentinel_dirs(&self) -> Vec<PathBuf> {
        self.sentinels.iter().map(|s| s.dir().to_owned()).collect()
    }
}

impl std::fmt::Debug for Sentinels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sentinels")
            .field("flavor", &self.flavor)
            .field(
                "data_ports",
                &self.data.iter().map(Server::port).collect::<Vec<_>>(),
            )
            .field(
                "sentinel_ports",
                &self
                    .sentinels
                    .iter()
                    .map(SentinelNode::port)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

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
