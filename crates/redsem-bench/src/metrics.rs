//! Figures computed from the workers' job lines and from Redis: peak overlap of holders,
//! latency percentiles (hdrhistogram), `INFO` snapshots and their deltas, client CPU, process
//! memory and the Redis connections a process holds.

use std::collections::{BTreeMap, HashSet};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Commands that are not the semaphore's work: the harness's own, and connection handshakes
/// (the same set as the peers' `driver.py`, plus `client|list` for the memory scenario).
pub const NOT_WORK: &[&str] = &[
    "info",
    "config|resetstat",
    "flushall",
    "flushdb",
    "hello",
    "select",
    "ping",
    "client|setinfo",
    "client|setname",
    "client|id",
    "client|list",
    "command",
    "command|docs",
    "command|info",
    "auth",
];

/// Script calls, each one client request (as `driver.py`'s `SCRIPT_CMDS`).
pub const SCRIPT_COMMANDS: &[&str] = &[
    "eval",
    "evalsha",
    "eval_ro",
    "evalsha_ro",
    "fcall",
    "fcall_ro",
    "script|load",
];

/// Commands that only a client sends (a script cannot call them), besides
/// [`SCRIPT_COMMANDS`]: handshakes, pub/sub, `WAIT`, `INFO`, `PING`, and every `CLIENT`,
/// `COMMAND` and `CONFIG` subcommand. With the script calls they are the requests that reached
/// Redis from outside; every other command in `INFO commandstats` ran inside a script (for
/// clients, like redsem's, that change state only through scripts).
const CLIENT_ONLY: &[&str] = &[
    "hello",
    "auth",
    "select",
    "ping",
    "echo",
    "info",
    "wait",
    "subscribe",
    "unsubscribe",
    "ssubscribe",
    "sunsubscribe",
    "psubscribe",
    "punsubscribe",
    "command",
];

/// Whether `INFO commandstats`' command `name` came from a client rather than from inside a
/// script (see `CLIENT_ONLY`).
pub fn sent_by_client(name: &str) -> bool {
    SCRIPT_COMMANDS.contains(&name)
        || CLIENT_ONLY.contains(&name)
        || ["client|", "command|", "config|"]
            .iter()
            .any(|p| name.starts_with(p))
}

/// One job line of the contract.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct JobRecord {
    /// Time inside acquire, ms.
    pub wait_ms: f64,
    /// When acquire returned, epoch ns.
    pub acq_ns: u64,
    /// End of the hold (just before release was called), epoch ns.
    pub rel_ns: u64,
    /// When acquire was called, epoch ns.
    #[serde(default)]
    pub req_ns: Option<u64>,
    /// When release returned, epoch ns.
    #[serde(default)]
    pub done_ns: Option<u64>,
    /// Failed acquire attempts of this job.
    #[serde(default)]
    pub errors: u64,
    /// Task index inside its process.
    #[serde(default)]
    pub worker: Option<u64>,
    /// Index of the process (set by the harness, not printed by workers).
    #[serde(default)]
    pub proc: usize,
}

/// Maximum number of simultaneously open `[start, end]` intervals; an end sorts before a
/// start at the same instant (as `driver.py`).
pub fn max_overlap(intervals: &[(u64, u64)]) -> usize {
    holders_timeline(intervals)
        .iter()
        .map(|&(_, n)| n)
        .max()
        .unwrap_or(0)
}

/// Number of holders after each event, in time order: `(t_ns, holders)`.
pub fn holders_timeline(intervals: &[(u64, u64)]) -> Vec<(u64, usize)> {
    let mut ev: Vec<(u64, i8)> = Vec::with_capacity(intervals.len() * 2);
    for &(s, e) in intervals {
        ev.push((s, 1));
        ev.push((e, -1));
    }
    ev.sort_unstable();
    let mut cur: i64 = 0;
    ev.into_iter()
        .map(|(t, d)| {
            cur += i64::from(d);
            (t, cur.max(0) as usize)
        })
        .collect()
}

/// Percentiles of a latency sample, ms.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Latency {
    /// Number of samples.
    pub count: u64,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Maximum (exact).
    pub max_ms: f64,
    /// Mean.
    pub mean_ms: f64,
}

/// Summarises latencies given in ms: recorded in microseconds into an hdrhistogram with 3
/// significant digits (so percentiles are within 0.1 %), the maximum exact.
pub fn latency(values_ms: &[f64]) -> Option<Latency> {
    if values_ms.is_empty() {
        return None;
    }
    let mut h = Histogram::<u64>::new_with_bounds(1, 24 * 3_600_000_000, 3).ok()?;
    let mut max: f64 = 0.0;
    let mut sum = 0.0;
    for &v in values_ms {
        let v = v.max(0.0);
        h.saturating_record(((v * 1000.0).round() as u64).max(1));
        max = max.max(v);
        sum += v;
    }
    let q = |p: f64| (h.value_at_quantile(p) as f64 / 1000.0).min(max);
    Some(Latency {
        count: values_ms.len() as u64,
        p50_ms: q(0.50),
        p99_ms: q(0.99),
        max_ms: max,
        mean_ms: sum / values_ms.len() as f64,
    })
}

/// What the harness reads from `INFO all`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RedisSnapshot {
    /// `calls` per command (`cmdstat_<name>`), since the last `CONFIG RESETSTAT`.
    pub commandstats: BTreeMap<String, u64>,
    /// `usec` per command (`cmdstat_<name>`): the time Redis spent executing it, those run
    /// inside a script included in the script call's too.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub commandstats_usec: BTreeMap<String, u64>,
    /// `used_cpu_user + used_cpu_sys` of redis-server, seconds (not reset by RESETSTAT).
    pub cpu_s: f64,
    /// `used_memory`, bytes.
    pub used_memory: u64,
    /// `total_net_input_bytes + total_net_output_bytes`.
    pub net_bytes: u64,
    /// `connected_clients`.
    pub connected_clients: u64,
    /// `redis_version`.
    pub redis_version: String,
}

impl RedisSnapshot {
    /// Parses the text of `INFO all`.
    pub fn parse(info: &str) -> RedisSnapshot {
        let mut s = RedisSnapshot::default();
        let mut cpu = 0.0;
        let mut net = 0;
        for line in info.lines() {
            let Some((k, v)) = line.trim_end().split_once(':') else {
                continue;
            };
            if let Some(name) = k.strip_prefix("cmdstat_") {
                let field = |f: &str| {
                    v.split(',')
                        .find_map(|kv| kv.strip_prefix(f))
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0)
                };
                s.commandstats.insert(name.to_string(), field("calls="));
                s.commandstats_usec.insert(name.to_string(), field("usec="));
                continue;
            }
            match k {
                "used_cpu_user" | "used_cpu_sys" => cpu += v.parse::<f64>().unwrap_or(0.0),
                "used_memory" => s.used_memory = v.parse().unwrap_or(0),
                "total_net_input_bytes" | "total_net_output_bytes" => {
                    net += v.parse::<u64>().unwrap_or(0)
                }
                "connected_clients" => s.connected_clients = v.parse().unwrap_or(0),
                "redis_version" => s.redis_version = v.to_string(),
                _ => {}
            }
        }
        s.cpu_s = cpu;
        s.net_bytes = net;
        s
    }

    /// Commands that were the semaphores' work: every command (also those run inside scripts
    /// and MULTI/EXEC) except [`NOT_WORK`].
    pub fn work_commands(&self) -> u64 {
        self.commandstats
            .iter()
            .filter(|(k, _)| !NOT_WORK.contains(&k.as_str()))
            .map(|(_, v)| v)
            .sum()
    }

    /// Script calls (`EVAL`, `EVALSHA`, ..., `SCRIPT LOAD`).
    pub fn script_calls(&self) -> u64 {
        SCRIPT_COMMANDS
            .iter()
            .filter_map(|k| self.commandstats.get(*k))
            .sum()
    }
}

/// User + system CPU seconds of all reaped children of this process.
pub fn children_cpu_s() -> f64 {
    // SAFETY: getrusage fills the struct we pass.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// User + system CPU seconds a live process has used so far (`utime` + `stime` of
/// `/proc/<pid>/stat`), or None when it is gone.
pub fn proc_cpu_s(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // the fields after the command name (which may hold spaces), from field 3 (state) on
    let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some(ticks as f64 / if hz > 0 { hz as f64 } else { 100.0 })
}

/// `VmRSS` and `VmHWM` (peak RSS) of a process, in KiB, from `/proc/<pid>/status`.
pub fn proc_rss_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status.lines().find_map(|l| {
            l.strip_prefix(name)?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// Local TCP ports of the sockets process `pid` has open (via its fds' socket inodes and
/// `/proc/<pid>/net/tcp{,6}`).
pub fn process_tcp_ports(pid: u32) -> HashSet<u16> {
    let mut inodes = HashSet::new();
    if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                let t = target.to_string_lossy();
                if let Some(ino) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                    inodes.insert(ino.to_string());
                }
            }
        }
    }
    let mut ports = HashSet::new();
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() > 9
                && inodes.contains(cols[9])
                && let Some(port) = cols[1]
                    .rsplit_once(':')
                    .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
            {
                ports.insert(port);
            }
        }
    }
    ports
}

/// How many entries of a `CLIENT LIST` reply come from one of `ports` (the client's
/// `addr=IP:PORT` is the process's local address).
pub fn count_clients_from(client_list: &str, ports: &HashSet<u16>) -> usize {
    client_list
        .lines()
        .filter(|l| {
            l.split(' ')
                .find_map(|kv| kv.strip_prefix("addr="))
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| p.parse::<u16>().ok())
                .is_some_and(|p| ports.contains(&p))
        })
        .count()
}

/// Median and range over repetitions.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Agg {
    /// Median (mean of the middle two for an even count).
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

/// Aggregates the present values; `None` when there are none.
pub fn agg(values: impl IntoIterator<Item = Option<f64>>) -> Option<Agg> {
    let mut v: Vec<f64> = values
        .into_iter()
        .flatten()
        .filter(|x| x.is_finite())
        .collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some(Agg {
        median,
        min: v[0],
        max: v[n - 1],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_cpu_s_reads_a_live_process_and_grows_with_work() {
        let me = std::process::id();
        let t0 = proc_cpu_s(me).expect("our own /proc/<pid>/stat");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut x = 0u64;
        while proc_cpu_s(me).unwrap() <= t0 && std::time::Instant::now() < deadline {
            for i in 0..100_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
        }
        assert!(proc_cpu_s(me).unwrap() > t0, "{x}");
        assert_eq!(proc_cpu_s(u32::MAX), None);
    }

    #[test]
    fn overlap_counts_ends_before_starts() {
        assert_eq!(max_overlap(&[]), 0);
        assert_eq!(max_overlap(&[(0, 10), (10, 20)]), 1);
        assert_eq!(max_overlap(&[(0, 10), (5, 20), (6, 7)]), 3);
        assert_eq!(max_overlap(&[(0, 10), (1, 2), (3, 4), (5, 6)]), 2);
    }

    #[test]
    fn latency_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let l = latency(&v).unwrap();
        assert!((l.p50_ms - 50.0).abs() < 0.1, "{l:?}");
        assert!((l.p99_ms - 99.0).abs() < 0.1, "{l:?}");
        assert_eq!(l.max_ms, 100.0);
        assert!(latency(&[]).is_none());
        let z = latency(&[0.0, 0.0]).unwrap();
        assert_eq!(z.p50_ms, 0.0);
    }

    #[test]
    fn parses_info() {
        let info = "# Server\r\nredis_version:7.0.15\r\n# CPU\r\nused_cpu_sys:1.5\r\nused_cpu_user:2.25\r\n\
                    # Commandstats\r\ncmdstat_evalsha:calls=12,usec=40,usec_per_call=3.33,rejected_calls=0,failed_calls=0\r\n\
                    cmdstat_info:calls=3,usec=1\r\ncmdstat_client|setinfo:calls=4,usec=1\r\ncmdstat_zadd:calls=5,usec=1\r\n";
        let s = RedisSnapshot::parse(info);
        assert_eq!(s.redis_version, "7.0.15");
        assert_eq!(s.cpu_s, 3.75);
        assert_eq!(s.commandstats["evalsha"], 12);
        assert_eq!(s.commandstats_usec["evalsha"], 40);
        assert!(sent_by_client("evalsha") && sent_by_client("client|setinfo"));
        assert!(!sent_by_client("zadd"));
        assert_eq!(s.work_commands(), 17);
        assert_eq!(s.script_calls(), 12);
    }

    #[test]
    fn counts_clients_by_port() {
        let list = "id=3 addr=127.0.0.1:40000 laddr=127.0.0.1:6379 fd=8 name=\n\
                    id=4 addr=127.0.0.1:40001 laddr=127.0.0.1:6379 fd=9 name=\n\
                    id=5 addr=127.0.0.1:40002 laddr=127.0.0.1:6379 fd=10 name=\n";
        let ports: HashSet<u16> = [40000, 40002].into_iter().collect();
        assert_eq!(count_clients_from(list, &ports), 2);
    }

    #[test]
    fn aggregates() {
        let a = agg([Some(3.0), None, Some(1.0), Some(2.0)]).unwrap();
        assert_eq!((a.median, a.min, a.max), (2.0, 1.0, 3.0));
        assert!(agg([None]).is_none());
        assert_eq!(agg([Some(1.0), Some(2.0)]).unwrap().median, 1.5);
    }

    #[test]
    fn own_process_memory_and_sockets() {
        let (rss, hwm) = proc_rss_kib(std::process::id()).unwrap();
        assert!(rss > 0 && hwm >= rss);
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(process_tcp_ports(std::process::id()).contains(&port));
    }
}
