//! `test_support::source` on small crates written for the test.

use std::path::Path;

use test_support::source::{blank, import_cycles, import_graph, long_functions};

fn write(root: &Path, files: &[(&str, &str)]) {
    for (path, text) in files {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
}

#[test]
fn blank_hides_comments_and_literals_and_keeps_lines_and_offsets() {
    let text = "let a = \"crate::x {\"; // crate::y {\n\
                let b = r#\"{ \"q\" }\"#; /* { /* } */ } */ let c = '{';\n\
                fn f<'a>(x: &'a str) -> char { '\\'' }\n";
    let code = blank(text);
    assert_eq!(code.len(), text.len());
    assert_eq!(code.lines().count(), text.lines().count());
    assert!(!code.contains("crate::"), "{code}");
    // the braces left are the body of f
    assert_eq!(code.matches('{').count(), 1, "{code}");
    assert_eq!(code.matches('}').count(), 1, "{code}");
    assert!(code.contains("fn f<'a>(x: &'a str)"), "{code}");
}

#[test]
fn the_graph_follows_crate_super_and_mod_paths_and_finds_a_cycle() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        &[
            (
                "lib.rs",
                "mod a;\nmod b;\npub use b::Thing;\nfn root_fn() {}\n",
            ),
            ("a/mod.rs", "mod x;\nmod y;\nfn helper() {}\n"),
            (
                "a/x.rs",
                "use super::y::Y;\nuse crate::{b::{self}, Thing};\n",
            ),
            ("a/y.rs", "pub struct Y;\nfn f() { super::helper() }\n"),
            (
                "b.rs",
                "pub struct Thing;\nfn g() { crate::root_fn(); let _ = \"crate::a::x\"; }\n\
                 // crate::a\n#[cfg(test)]\nmod tests {\n    use crate::a::x;\n}\n",
            ),
        ],
    );
    let graph = import_graph(dir.path());
    let to = |file: &str| graph[file].iter().cloned().collect::<Vec<_>>();
    assert_eq!(to("lib.rs"), Vec::<String>::new());
    assert_eq!(to("a/mod.rs"), ["a/x.rs", "a/y.rs"]);
    assert_eq!(to("a/x.rs"), ["a/y.rs", "b.rs"]);
    assert_eq!(to("a/y.rs"), ["a/mod.rs"]);
    assert_eq!(to("b.rs"), ["lib.rs"]);
    // one cycle per edge that closes one: a/y.rs -> a/mod.rs, reached through a/x.rs first
    assert_eq!(
        import_cycles(&graph),
        ["a/mod.rs -> a/x.rs -> a/y.rs -> a/mod.rs"]
    );
}

#[test]
fn long_functions_are_counted_from_fn_to_the_closing_brace() {
    let dir = tempfile::tempdir().unwrap();
    let long_body = "    let x = 1;\n".repeat(10);
    write(
        dir.path(),
        &[(
            "lib.rs",
            &format!(
                "type F = fn(u8) -> u8;\ntrait T {{\n    fn declared(&self);\n}}\n\
                 fn short() {{\n    let s = \"}}\";\n}}\n\n\
                 pub fn long() {{\n{long_body}}}\n"
            ),
        )],
    );
    let long = long_functions(dir.path(), 11);
    assert_eq!(long.len(), 1, "{long:?}");
    assert_eq!(long[0].to_string(), "lib.rs:9 fn long: 12 lines");
    assert!(long_functions(dir.path(), 12).is_empty());
}
