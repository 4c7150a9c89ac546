//! The README's example works as written: it is `examples/quickstart.rs` (the README's copy
//! must be the same), built by `cargo test` / `cargo nextest`, and run here against a
//! private server, twice in a row.

mod common;

use std::process::Command;

use common::*;

/// The code block of the README's quick start that is the whole Rust program (after the
/// three languages side by side).
fn readme_quickstart() -> String {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let start = readme
        .find("## Quick start")
        .expect("a quick start section");
    let start = start
        + readme[start..]
            .find("The Rust program in full")
            .expect("the Rust program in the quick start");
    let code = &readme[start..];
    let code = &code[code.find("```rust\n").unwrap() + 8..];
    code[..code.find("```").unwrap()].to_owned()
}

#[test]
fn the_readme_quickstart_is_the_example() {
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/quickstart.rs"
    ))
    .unwrap();
    assert_eq!(readme_quickstart(), example);
}

/// Run twice in a row: the first run's releases are all done when it exits (it shuts its
/// client down), so the second run finds every slot free and no lease ever expires.
#[test]
fn the_readme_quickstart_runs_twice_without_waiting_for_a_lease() {
    let exe = std::env::current_exe().unwrap();
    let example = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples/quickstart");
    assert!(
        example.exists(),
        "build the examples first: {}",
        example.display()
    );
    let server = Server::start(Flavor::Redis);
    for run in 1..=2 {
        let out = Command::new(&example)
            .env("REDIS_URL", server.url())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), 6, "{stdout}");
        assert!(
            lines
                .iter()
                .all(|l| l.contains("slot 0") || l.contains("slot 1")),
            "{stdout}"
        );
        assert_eq!(
            entries(&server, "quickstart-api"),
            [0, 0, 0, 0],
            "run {run} left entries behind when it exited"
        );
        let cfg = |field: &str| {
            server
                .cmd(&["HGET", "redsem:{quickstart-api}:cfg", field])
                .as_str()
                .map(str::to_owned)
        };
        assert_eq!(
            cfg("grants").as_deref(),
            Some(if run == 1 { "6" } else { "12" })
        );
        assert_eq!(cfg("expired"), None, "run {run}: a lease expired");
    }
}
