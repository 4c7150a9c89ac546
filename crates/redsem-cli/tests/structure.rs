//! The CLI crate's structure, read from its sources (no server): its files import each other
//! in no cycle, and no function is longer than 100 lines.

use std::path::Path;

use test_support::source::{assert_no_import_cycles, assert_no_long_functions};

#[test]
fn the_files_import_each_other_in_no_cycle() {
    let graph = assert_no_import_cycles(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    // the scan sees the imports it is meant to see
    assert!(graph["watch.rs"].contains("show.rs"));
    assert!(graph["run.rs"].contains("common.rs"));
    assert!(graph["run.rs"].contains("lib.rs"));
}

#[test]
fn no_function_is_longer_than_100_lines() {
    assert_no_long_functions(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), 100);
}
