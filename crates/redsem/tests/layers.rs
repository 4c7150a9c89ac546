//! The library's structure, read from its sources (no server). Imports point down only, and
//! no files import each other in a loop; the layer order is documented in
//! `docs/ARCHITECTURE.md`:
//!
//! public API → engine → core → protocol → backend → metrics → error
//!
//! A file may import files of its own layer or below, never above. Also here, the other
//! structural rules of docs/ARCHITECTURE.md: the core does no I/O (`the_core_is_pure`), and no
//! function of the library is over 100 lines (`no_function_is_over_100_lines`). The import
//! graph and the function scan are `test_support::source`'s, shared with the other crates.

use std::path::{Path, PathBuf};

use test_support::source::{
    assert_no_long_functions, blank, describe, import_cycles, import_graph,
};

/// Rank of each file (by its path under `src/`): higher layers have higher ranks.
fn rank(file: &str) -> Option<u32> {
    let top = file.split('/').next().unwrap();
    Some(match top {
        "error.rs" | "codes.rs" | "backoff.rs" => 0,
        "metrics.rs" => 1,
        "backend" => 2,
        "protocol" => 3,
        "core" => 4,
        "engine" => 5,
        "lib.rs" | "semaphore.rs" | "builder.rs" | "permit.rs" | "client.rs" | "admin.rs"
        | "tower.rs" | "fencing.rs" | "stats.rs" | "guide.rs" | "options.rs" | "blocking.rs"
        | "handoff.rs" | "bindings.rs" => 6,
        _ => return None,
    })
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn imports_point_down_and_do_not_loop() {
    let graph = import_graph(&src());
    let mut problems = import_cycles(&graph);
    for (from, tos) in &graph {
        let Some(r) = rank(from) else {
            problems.push(format!("{from}: not in any layer (add it to rank())"));
            continue;
        };
        for to in tos {
            if rank(to).is_some_and(|t| t > r) {
                problems.push(format!("{from} imports {to}, a higher layer"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{}\n\nthe import graph:\n{}",
        problems.join("\n"),
        describe(&graph)
    );
    // the check sees the imports it is meant to see
    assert!(graph["engine/heartbeat.rs"].contains("engine/table.rs"));
    assert!(graph["engine/table.rs"].contains("core/mod.rs"));
    assert!(graph["core/state.rs"].contains("core/lease.rs"));
    assert!(graph["engine/batch.rs"].contains("protocol/mod.rs"));
    assert!(graph["protocol/mod.rs"].contains("backend/mod.rs"));
    assert!(graph["tower.rs"].contains("permit.rs"));
}

/// The core (`src/core/`) decides and keeps state, nothing else: no Redis type, no task, no
/// socket, no lock, no `.await`, and it never reads the clock (every `now` is an argument).
/// Its one use of tokio is the `Instant` type (so that tests drive it in paused time).
#[test]
fn the_core_is_pure() {
    let forbidden = [
        "redis::",
        "async ",
        ".await",
        "tokio::spawn",
        "tokio::sync",
        "tokio::net",
        "tokio::io",
        "tokio::task",
        "tokio::select",
        "std::net",
        "std::fs",
        "std::thread",
        "Mutex",
        "RwLock",
        "Instant::now()",
        "SystemTime",
        "crate::engine",
        "crate::backend",
    ];
    let dir = src().join("core");
    let mut problems = Vec::new();
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        // the code, without comments, literals and the unit tests
        let text = blank(&text);
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap();
        seen += 1;
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        for (n, line) in code.lines().enumerate() {
            for f in forbidden.iter().filter(|f| line.contains(*f)) {
                problems.push(format!("core/{file}:{}: {f:?} in {line:?}", n + 1));
            }
            if line.contains("tokio::") && !line.contains("tokio::time::Instant") {
                problems.push(format!(
                    "core/{file}:{}: tokio beyond Instant: {line:?}",
                    n + 1
                ));
            }
        }
    }
    assert!(seen >= 5, "the core's files were not found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// No function of the library is over 100 lines: each step has a name.
#[test]
fn no_function_is_over_100_lines() {
    assert_no_long_functions(&src(), 100);
}
