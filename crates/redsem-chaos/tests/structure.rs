//! The chaos crate's structure, read from its sources (no server): its files import each other
//! in no cycle (a folder's `mod.rs` declares its files and holds nothing they import), and no
//! function is longer than 100 lines.

use std::path::Path;

use test_support::source::{assert_no_import_cycles, assert_no_long_functions};

#[test]
fn the_files_import_each_other_in_no_cycle() {
    let graph = assert_no_import_cycles(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    // the scan sees the imports it is meant to see
    let imports = |from: &str, to: &str| graph[from].contains(to);
    assert!(imports("checker/fifo.rs", "checker/snapshots.rs"));
    assert!(imports("checker/snapshots.rs", "checker/time.rs"));
    assert!(imports("checker/mod.rs", "checker/scan.rs"));
    assert!(imports("runner/faults.rs", "runner/state.rs"));
    assert!(imports("runner/mod.rs", "snapshot.rs"));
    assert!(imports("snapshot.rs", "lib.rs"));
}

#[test]
fn no_function_is_longer_than_100_lines() {
    assert_no_long_functions(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), 100);
}
