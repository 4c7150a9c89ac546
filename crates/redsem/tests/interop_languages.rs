//! Rust, Python and Node.js processes share one semaphore: the Rust side is this test process,
//! the Python side `interop/python/worker.py` on the installed Python package (clients/python),
//! the Node.js side `interop/node/worker.mjs` on the npm package (clients/node). Both workers
//! speak one command line and print one JSON line per permit (ticket, slots, times; the Node
//! worker also its fences, and the Python one's are read when it prints them), so this test
//! does not depend on how either package is built. Checked: waiters of the three languages are
//! served in the order they queued, with tickets in that order; holders of one slot follow
//! each other with rising fences; the limit is never exceeded and slots held at the same time
//! are distinct.
//!
//! Python with the package is `$REDSEM_PYTHON`, else `.cache/interop-venv`
//! (`scripts/install-deps.sh interop-python`); Node.js is `node` on PATH with the package
//! built by `scripts/install-deps.sh node` (run here once per test process). Without either,
//! the tests are skipped with a message, unless `REDSEM_REQUIRE_INTEROP=1` (set by
//! `scripts/test.sh`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use serde_json::Value;

/// One permit as its holder saw it.
#[derive(Clone, Debug)]
struct Hold {
    who: String,
    ticket: u64,
    slots: Vec<u32>,
    /// `(slot, generation)` per slot, when the holder reported them.
    fences: Option<Vec<(u32, u64)>>,
    start: f64,
    end: f64,
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn root() -> PathBuf {
    test_support::workspace_root()
}

fn required() -> bool {
    std::env::var("REDSEM_REQUIRE_INTEROP").is_ok_and(|v| v == "1")
}

fn skip(why: &str) {
    if required() {
        panic!("REDSEM_REQUIRE_INTEROP=1 but {why}: run scripts/install-deps.sh");
    }
    eprintln!("interop_languages: SKIPPED: {why} (run scripts/install-deps.sh)");
}

/// Runs `scripts/install-deps.sh STEP`: installs or brings up to date (a no-op otherwise).
/// Without the variables Cargo sets for this test (`CARGO_PKG_*`, `CARGO_MANIFEST_DIR`, ...):
/// the `node` step runs `cargo build`, whose build scripts would see them as a changed
/// environment and rebuild (ring, rustls, redis and up: 20 s) at every test run.
fn install_step(step: &str) -> bool {
    let mut cmd = std::process::Command::new("bash");
    cmd.arg(root().join("scripts/install-deps.sh")).arg(step);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if (k.starts_with("CARGO_") && k != "CARGO_HOME" && k != "CARGO_TARGET_DIR")
            || k.starts_with("NEXTEST")
            || k == "CARGO"
            || k == "OUT_DIR"
        {
            cmd.env_remove(&*k);
        }
    }
    cmd.status().is_ok_and(|s| s.success())
}

fn python_imports_redsem(python: &Path) -> bool {
    std::process::Command::new(python)
        .args(["-c", "import redsem"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A Python interpreter that can `import redsem`, or `None`.
fn python() -> Option<PathBuf> {
    static PYTHON: OnceLock<Option<PathBuf>> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            if let Some(p) = std::env::var_os("REDSEM_PYTHON").filter(|p| !p.is_empty()) {
                let p = PathBuf::from(p);
                assert!(
                    python_imports_redsem(&p),
                    "REDSEM_PYTHON={p:?} cannot import redsem"
                );
                return Some(p);
            }
            let python = root().join(".cache/interop-venv/bin/python");
            (install_step("interop-python") && python_imports_redsem(&python)).then_some(python)
        })
        .clone()
}

/// Whether `node` can load the npm package (built by `install-deps.sh node`).
fn node() -> bool {
    static NODE: OnceLock<bool> = OnceLock::new();
    *NODE.get_or_init(|| {
        install_step("node")
            && std::process::Command::new("node")
                .arg("-e")
                .arg(format!(
                    "require({:?})",
                    root().join("clients/node").to_str().unwrap()
                ))
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
    })
}

/// Python and Node.js, or `None` (with the reason printed, or a panic when required).
fn workers() -> Option<PathBuf> {
    let Some(python) = python() else {
        skip("no Python with the redsem package");
        return None;
    };
    if !node() {
        skip("no node that loads clients/node");
        return None;
    }
    Some(python)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Lang {
    Python,
    Node,
}

/// Starts a worker of `lang` with these arguments.
fn worker(
    lang: Lang,
    python: &Path,
    server: &Server,
    name: &str,
    args: &[&str],
) -> tokio::process::Child {
    let mut cmd = match lang {
        Lang::Python => {
            let mut c = tokio::process::Command::new(python);
            c.arg(root().join("interop/python/worker.py"));
            c
        }
        Lang::Node => {
            let mut c = tokio::process::Command::new("node");
            c.arg(root().join("interop/node/worker.mjs"));
            c
        }
    };
    cmd.args(["--url", &server.url(), "--name", name])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

fn parse_fence(f: &Value) -> (u32, u64) {
    let (slot, generation) = f.as_str().unwrap().split_once(':').unwrap();
    (slot.parse().unwrap(), generation.parse().unwrap())
}

/// Waits for a worker and parses its JSON lines.
async fn finish(child: tokio::process::Child) -> Vec<Hold> {
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("worker hung")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "worker failed ({}): {}\n{stdout}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).unwrap();
            assert_eq!(v["lost"], false, "{line}");
            Hold {
                who: v["label"].as_str().unwrap().to_owned(),
                ticket: v["ticket"].as_u64().unwrap(),
                slots: v["slots"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s.as_u64().unwrap() as u32)
                    .collect(),
                fences: v["fences"]
                    .as_array()
                    .map(|fs| fs.iter().map(parse_fence).collect()),
                start: v["start"].as_f64().unwrap(),
                end: v["end"].as_f64().unwrap(),
            }
        })
        .collect()
}

/// A Rust holder: acquire, hold for `hold`, release; recorded like the workers' holders.
async fn rust_hold(sem: redsem::Semaphore, who: String, hold: Duration) -> Hold {
    let permit = sem.acquire().await.unwrap();
    let start = now();
    tokio::time::sleep(hold).await;
    assert!(!permit.is_lost());
    let end = now();
    let hold = Hold {
        who,
        ticket: permit.ticket(),
        slots: permit.slots(),
        fences: Some(
            permit
                .fences()
                .iter()
                .map(|f| (f.slot, f.generation))
                .collect(),
        ),
        start,
        end,
    };
    permit.release().await.unwrap();
    hold
}

/// Per slot, the holders in ticket order carry strictly rising generations (holders that
/// did not report their fences are left out); returns how many fences were compared.
fn assert_fences_rise(holds: &[Hold]) -> usize {
    let mut by_ticket: Vec<&Hold> = holds.iter().collect();
    by_ticket.sort_by_key(|h| h.ticket);
    let mut last: std::collections::HashMap<u32, (u64, &Hold)> = Default::default();
    let mut compared = 0;
    for h in by_ticket {
        let Some(fences) = &h.fences else { continue };
        assert_eq!(
            fences.iter().map(|f| f.0).collect::<Vec<_>>(),
            h.slots,
            "{h:?}"
        );
        for &(slot, generation) in fences {
            if let Some((prev, prev_hold)) = last.get(&slot) {
                assert!(
                    generation > *prev,
                    "slot {slot}: {h:?} has a fence below that of an earlier ticket {prev_hold:?}"
                );
                compared += 1;
            }
            last.insert(slot, (generation, h));
        }
    }
    compared
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_three_languages_are_served_in_ticket_order() {
    let Some(python) = workers() else { return };
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "turns", 1, Duration::from_secs(5)).await;
        let first = sem.acquire().await.unwrap();
        let mut order = Vec::new();
        let mut children = Vec::new();
        let rust_holds = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..9 {
            let who = format!("{}-{i}", ["py", "node", "rs"][i % 3]);
            match i % 3 {
                0 | 1 => {
                    let lang = if i % 3 == 0 { Lang::Python } else { Lang::Node };
                    let args = ["--limit", "1", "--count", "1", "--hold-ms", "30"];
                    let args: Vec<&str> = args.into_iter().chain(["--label", &who]).collect();
                    children.push(worker(lang, &python, &server, "turns", &args));
                }
                _ => {
                    let (sem, who, holds) = (sem.clone(), who.clone(), rust_holds.clone());
                    tasks.push(tokio::spawn(async move {
                        let hold = rust_hold(sem, who, Duration::from_millis(30)).await;
                        holds.lock().unwrap().push(hold);
                    }));
                }
            }
            // this waiter is queued before the next one starts
            assert!(
                eventually(Duration::from_secs(20), || card(&server, "turns", "queue")
                    == i as i64 + 1)
                .await,
                "waiter {who} did not queue on {}",
                server.flavor()
            );
            order.push(who);
        }
        let (first_fence, first_ticket) = (first.fences()[0], first.ticket());
        first.release().await.unwrap();
        for t in tasks {
            t.await.unwrap();
        }
        let mut holds = rust_holds.lock().unwrap().clone();
        for c in children {
            holds.extend(finish(c).await);
        }
        assert_eq!(holds.len(), 9);
        holds.sort_by(|a, b| a.start.total_cmp(&b.start));
        let served: Vec<&str> = holds.iter().map(|h| h.who.as_str()).collect();
        assert_eq!(
            served,
            order,
            "served in the order they queued on {}: {holds:#?}",
            server.flavor()
        );
        assert!(
            holds.windows(2).all(|w| w[0].ticket < w[1].ticket),
            "tickets in that order: {holds:#?}"
        );
        assert!(
            holds.windows(2).all(|w| w[0].end <= w[1].start),
            "one at a time: {holds:#?}"
        );
        assert!(holds.iter().all(|h| h.slots == [0]), "{holds:#?}");
        // the first holder's fence, then every reported one, rising in ticket order
        holds.push(Hold {
            who: "rs-first".into(),
            ticket: first_ticket,
            slots: vec![0],
            fences: Some(vec![(first_fence.slot, first_fence.generation)]),
            start: 0.0,
            end: 0.0,
        });
        let compared = assert_fences_rise(&holds);
        // Rust's three and Node's three at least
        assert!(compared >= 6, "{compared} fences compared: {holds:#?}");
        assert_nothing_left(&server, "turns").await;
    }
}

/// The most holders at once, from their intervals (an end before a start at equal times),
/// and whether two holders overlapping in time ever shared a slot.
fn peak_and_shared_slot(holds: &[Hold]) -> (usize, Option<(Hold, Hold)>) {
    let mut edges: Vec<(f64, i32)> = holds
        .iter()
        .flat_map(|h| [(h.start, 1), (h.end, -1)])
        .collect();
    edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut now, mut max) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        max = max.max(now);
    }
    for (i, a) in holds.iter().enumerate() {
        for b in &holds[i + 1..] {
            let overlap = a.start < b.end && b.start < a.end;
            if overlap && a.slots.iter().any(|s| b.slots.contains(s)) {
                return (max as usize, Some((a.clone(), b.clone())));
            }
        }
    }
    (max as usize, None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_languages_share_the_limit_with_unique_slots() {
    let Some(python) = workers() else { return };
    let server = Server::start(Flavor::Redis);
    let client = client(&server).await;
    let sem = open(&client, "mixed", 3, Duration::from_secs(2)).await;
    let args = [
        "--limit",
        "3",
        "--lease-ms",
        "2000",
        "--threads",
        "3",
        "--count",
        "6",
        "--hold-ms",
        "8",
    ];
    let children: Vec<_> = [(Lang::Python, "py"), (Lang::Node, "node")]
        .into_iter()
        .map(|(lang, label)| {
            let args: Vec<&str> = args.into_iter().chain(["--label", label]).collect();
            worker(lang, &python, &server, "mixed", &args)
        })
        .collect();
    let tasks: Vec<_> = (0..3)
        .map(|t| {
            let sem = sem.clone();
            tokio::spawn(async move {
                let mut holds = Vec::new();
                for _ in 0..6 {
                    let who = format!("rs-{t}");
                    holds.push(rust_hold(sem.clone(), who, Duration::from_millis(8)).await);
                }
                holds
            })
        })
        .collect();
    let mut holds = Vec::new();
    for t in tasks {
        holds.extend(t.await.unwrap());
    }
    for c in children {
        holds.extend(finish(c).await);
    }
    assert_eq!(holds.len(), 54);
    for who in ["py", "node", "rs"] {
        assert_eq!(
            holds.iter().filter(|h| h.who.starts_with(who)).count(),
            18,
            "{who}"
        );
    }
    let (peak, shared) = peak_and_shared_slot(&holds);
    assert!(peak <= 3, "limit exceeded: {peak}: {holds:#?}");
    assert!(shared.is_none(), "a slot held twice at once: {shared:#?}");
    let mut tickets: Vec<u64> = holds.iter().map(|h| h.ticket).collect();
    tickets.sort();
    assert_eq!(tickets, (1..=54).collect::<Vec<_>>(), "one ticket sequence");
    assert!(assert_fences_rise(&holds) > 0);
    assert_eq!(sem.stats().await.unwrap().grants_total, 54);
    assert_nothing_left(&server, "mixed").await;
}

/// Runs `program args...` to completion (with `REDSEM_NODE_PACKAGE`, the npm package's
/// folder); its stdout's lines (panics on a failure).
async fn run_lines(program: &Path, args: &[&str]) -> Vec<String> {
    let out = tokio::process::Command::new(program)
        .args(args)
        .env("REDSEM_NODE_PACKAGE", root().join("clients/node"))
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{program:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

const PYTHON_RELAY: &str = "
import asyncio, sys, redsem
async def main():
    c = await redsem.connect(sys.argv[1])
    sem = await c.semaphore(sys.argv[2], limit=1, lease=5)
    p = await sem.adopt(sys.argv[3])
    print(' '.join(str(f) for f in p.fences))
    print(await p.export())
    await c.close()
asyncio.run(main())
";

const NODE_RELAY: &str = "
const redsem = require(process.env.REDSEM_NODE_PACKAGE);
(async () => {
  const [url, name, token] = process.argv.slice(1);
  const c = await redsem.connect(url);
  const sem = await c.semaphore(name, { limit: 1, leaseMs: 5000 });
  const p = await sem.adopt(token);
  console.log(p.fences.join(' '));
  console.log(await p.export());
  await c.close();
})().catch((e) => { console.error(e); process.exit(1); });
";

/// A hand-off token is the same string in the three languages: a permit exported in Rust is
/// adopted in Python, exported again, adopted in Node.js, exported again and adopted back in
/// Rust, keeping its holder id and fences all the way.
#[tokio::test]
async fn a_permit_is_handed_from_rust_to_python_to_node_and_back() {
    let Some(python) = workers() else { return };
    let server = Server::start(Flavor::Redis);
    let client = client(&server).await;
    let name = "handoff-languages";
    let sem = open(&client, name, 1, Duration::from_secs(5)).await;
    let permit = sem.acquire().await.unwrap();
    let (id, fences) = (permit.holder_id().to_owned(), permit.fences().to_vec());
    let printed: Vec<String> = fences.iter().map(ToString::to_string).collect();
    let mut token = permit.export().await.unwrap().to_string();
    let url = server.url();
    for (program, script) in [
        (python.as_path(), PYTHON_RELAY),
        (Path::new("node"), NODE_RELAY),
    ] {
        let flag = if program == Path::new("node") {
            "-e"
        } else {
            "-c"
        };
        let lines = run_lines(program, &[flag, script, &url, name, &token]).await;
        assert_eq!(lines.len(), 2, "{program:?}: {lines:?}");
        assert_eq!(
            lines[0].split(' ').collect::<Vec<_>>(),
            printed,
            "{program:?}"
        );
        token = lines[1].clone();
        assert!(token.contains(&id), "{program:?}: {token}");
    }
    let back = sem.adopt(&token.parse().unwrap()).await.unwrap();
    assert_eq!(back.holder_id(), id);
    assert_eq!(back.fences(), &fences[..]);
    assert_eq!(sem.stats().await.unwrap().expired_total, 0);
    back.release().await.unwrap();
    assert_nothing_left(&server, name).await;
}
