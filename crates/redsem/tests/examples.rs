//! The README's example works as written: it is `examples/quickstart.rs`, built by
//! `cargo test` / `cargo nextest`, and run here against a private server.

mod common;

use std::process::Command;

use common::*;

#[test]
fn the_readme_quickstart_runs_and_never_exceeds_its_limit() {
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
        server
            .cmd(&["HGET", "redsem:{quickstart-api}:cfg", "grants"])
            .as_str(),
        Some("6")
    );
}
