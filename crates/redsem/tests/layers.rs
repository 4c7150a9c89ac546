//! The library's imports point down only, and no files import each other in a loop.
//!
//! Reads every `.rs` file of `src/`, takes the module paths it names (`use crate::…`,
//! inline `crate::…` paths, `super::…` inside a folder, and the `mod` declarations of a
//! folder's `mod.rs`), resolves each to the file that defines it, and checks the edges
//! against the layer order documented in `docs/ARCHITECTURE.md`:
//!
//! public API → engine → core → protocol → backend → metrics → error
//!
//! A file may import files of its own layer or below, never above, and the file graph has no
//! cycle. Comments and `#[cfg(test)]` modules are not read. No server needed.
//!
//! Also here, the other structural rules of docs/ARCHITECTURE.md: the core does no I/O
//! (`the_core_is_pure`), and no function of the library is over 100 lines
//! (`no_function_is_over_100_lines`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Rank of each file (by its path under `src/`): higher layers have higher ranks.
fn rank(file: &str) -> Option<u32> {
    let top = file.split('/').next().unwrap();
    Some(match top {
        "error.rs" => 0,
        "keys.rs" | "metrics.rs" => 1,
        "backend" => 2,
        "protocol" => 3,
        "core" => 4,
        "engine" => 5,
        "codes.rs" | "backoff.rs" => 0,
        "lib.rs" | "semaphore.rs" | "builder.rs" | "permit.rs" | "client.rs" | "admin.rs"
        | "tower.rs" | "fencing.rs" | "stats.rs" | "guide.rs" | "options.rs" | "blocking.rs"
        | "handoff.rs" => 6,
        _ => return None,
    })
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without comments and without its `#[cfg(test)]` module.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Identifier segments following `at` in `s`: `a::b::C` → [a, b, C].
fn segments(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = s;
    loop {
        let ident: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if ident.is_empty() {
            break;
        }
        rest = &rest[ident.len()..];
        out.push(ident);
        match rest.strip_prefix("::") {
            Some(r) => rest = r,
            None => break,
        }
    }
    out
}

/// The file (relative to `src/`) that module path `segs`, starting in folder `dir`, names.
fn resolve(files: &BTreeSet<String>, dir: &str, segs: &[String]) -> Option<String> {
    let mut dir = dir.to_owned();
    let mut found = None;
    for seg in segs {
        let file = format!("{dir}{seg}.rs");
        let folder = format!("{dir}{seg}/mod.rs");
        if files.contains(&file) {
            found = Some(file);
            break;
        } else if files.contains(&folder) {
            found = Some(folder);
            dir = format!("{dir}{seg}/");
        } else {
            break;
        }
    }
    found
}

#[test]
fn imports_point_down_and_do_not_loop() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    let rel = |p: &Path| {
        p.strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/")
    };
    let files: BTreeSet<String> = paths.iter().map(|p| rel(p)).collect();

    // `pub use module::{A, B}` at the crate root: `crate::A` is defined in `module`.
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let mut root_names: BTreeMap<String, String> = BTreeMap::new();
    for line in code(&lib).lines() {
        let Some(rest) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        let rest = rest.strip_prefix("crate::").unwrap_or(rest);
        let module = segments(rest)[0].clone();
        let file = resolve(&files, "", std::slice::from_ref(&module)).unwrap();
        let names = rest.split_once('{').map_or(rest, |(_, n)| n);
        for name in names.split([',', '}', ';', ':']) {
            let name = name.trim();
            if !name.is_empty() && name != module {
                root_names.insert(name.to_owned(), file.clone());
            }
        }
    }

    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for path in &paths {
        let file = rel(path);
        let dir = file
            .rsplit_once('/')
            .map_or(String::new(), |(d, _)| format!("{d}/"));
        let text = code(&std::fs::read_to_string(path).unwrap());
        let mut to = BTreeSet::new();
        for (i, _) in text.match_indices("crate::") {
            // not `redsem_crate::` or the like
            if text[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let segs = segments(&text[i + "crate::".len()..]);
            let target = resolve(&files, "", &segs)
                .or_else(|| segs.first().and_then(|s| root_names.get(s).cloned()));
            if let Some(t) = target {
                to.insert(t);
            }
        }
        if file.ends_with("/mod.rs") || file == "lib.rs" {
            // a folder's mod.rs depends on the files it declares
            for line in text.lines() {
                let l = line.trim();
                let l = l
                    .strip_prefix("pub(crate) ")
                    .or_else(|| l.strip_prefix("pub "))
                    .unwrap_or(l);
                if let Some(m) = l.strip_prefix("mod ").and_then(|m| m.strip_suffix(';'))
                    && file != "lib.rs"
                {
                    to.extend(resolve(&files, &dir, &[m.to_owned()]));
                }
            }
        }
        if !dir.is_empty() {
            let parent = if file.ends_with("/mod.rs") {
                // `super` of a folder's mod.rs is the folder's parent
                dir.trim_end_matches('/')
                    .rsplit_once('/')
                    .map_or(String::new(), |(d, _)| format!("{d}/"))
            } else {
                dir.clone()
            };
            for (i, _) in text.match_indices("super::") {
                if text[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                    continue;
                }
                let segs = segments(&text[i + "super::".len()..]);
                let target = resolve(&files, &parent, &segs).or_else(|| {
                    let own = format!("{parent}mod.rs");
                    files.contains(&own).then_some(own)
                });
                to.extend(target);
            }
        }
        to.remove(&file);
        edges.insert(file, to);
    }

    let mut problems = Vec::new();
    for (from, tos) in &edges {
        let Some(r) = rank(from) else {
            problems.push(format!("{from}: not in any layer (add it to rank())"));
            continue;
        };
        for to in tos {
            match rank(to) {
                Some(t) if t > r => problems.push(format!("{from} imports {to}, a higher layer")),
                _ => {}
            }
        }
    }

    // cycles: depth-first search, reporting one loop per back edge
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
        problems: &mut Vec<String>,
    ) {
        state.insert(node.to_owned(), 1);
        stack.push(node.to_owned());
        for next in edges.get(node).into_iter().flatten() {
            match state.get(next.as_str()).copied().unwrap_or(0) {
                0 => visit(next, edges, state, stack, problems),
                1 => {
                    let start = stack.iter().position(|n| n == next).unwrap();
                    problems.push(format!(
                        "import cycle: {} -> {next}",
                        stack[start..].join(" -> ")
                    ));
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(node.to_owned(), 2);
    }
    let mut state = BTreeMap::new();
    for node in edges.keys() {
        if state.get(node.as_str()).copied().unwrap_or(0) == 0 {
            visit(node, &edges, &mut state, &mut Vec::new(), &mut problems);
        }
    }

    let graph: Vec<String> = edges
        .iter()
        .map(|(f, t)| {
            format!(
                "{f} -> {}",
                t.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        })
        .collect();
    assert!(
        problems.is_empty(),
        "{}\n\nthe import graph:\n{}",
        problems.join("\n"),
        graph.join("\n")
    );
    // the check sees the imports it is meant to see
    assert!(edges["engine/heartbeat.rs"].contains("engine/table.rs"));
    assert!(edges["engine/batch.rs"].contains("protocol/mod.rs"));
    assert!(edges["protocol/mod.rs"].contains("backend/mod.rs"));
    assert!(edges["tower.rs"].contains("permit.rs"));
}

/// Every `.rs` file under `src/`, relative path and text.
fn sources() -> Vec<(String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let rel = p
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            (rel, std::fs::read_to_string(p).unwrap())
        })
        .collect()
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
    let mut problems = Vec::new();
    let mut seen = 0;
    for (file, text) in sources().iter().filter(|(f, _)| f.starts_with("core/")) {
        seen += 1;
        for (n, line) in code(text).lines().enumerate() {
            for f in forbidden.iter().filter(|f| line.contains(*f)) {
                problems.push(format!("{file}:{}: {f:?} in {line:?}", n + 1));
            }
            if line.contains("tokio::") && !line.contains("tokio::time::Instant") {
                problems.push(format!("{file}:{}: tokio beyond Instant: {line:?}", n + 1));
            }
        }
    }
    assert!(seen >= 4, "the core's files were not found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The functions of a file's text (test modules included) longer than `max` lines, from the
/// `fn` line to its closing brace: `(name, first line, lines)`. Strings, chars and
/// comments are skipped when counting braces.
fn long_functions(text: &str, max: usize) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        if t.starts_with("//") {
            continue;
        }
        let Some(at) = t.find("fn ").filter(|&at| {
            let before = &t[..at];
            before.is_empty() || before.ends_with(' ') || before.ends_with('(')
        }) else {
            continue;
        };
        let name: String = t[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue;
        }
        let (mut depth, mut opened) = (0i64, false);
        for (j, l) in lines.iter().enumerate().skip(i) {
            for c in braces(l) {
                depth += if c == '{' { 1 } else { -1 };
                opened = true;
            }
            if !opened && l.trim_end().ends_with(';') {
                break; // a declaration without a body
            }
            if opened && depth <= 0 {
                if j + 1 - i > max {
                    out.push((name.clone(), i + 1, j + 1 - i));
                }
                break;
            }
        }
    }
    out
}

/// The braces of one line of code, outside strings, chars and `//` comments.
fn braces(line: &str) -> Vec<char> {
    let mut out = Vec::new();
    let mut chars = line.chars().peekable();
    let mut in_str = false;
    while let Some(c) = chars.next() {
        match c {
            '\\' if in_str => {
                chars.next();
            }
            '"' => in_str = !in_str,
            '/' if !in_str && chars.peek() == Some(&'/') => break,
            '\'' if !in_str => {
                // a char literal ('{', '\'', '\\') or a lifetime ('a)
                let rest: String = chars.clone().take(3).collect();
                if rest.starts_with("\\") {
                    chars.nth(2);
                } else if rest.chars().nth(1) == Some('\'') {
                    chars.nth(1);
                }
            }
            '{' | '}' if !in_str => out.push(c),
            _ => {}
        }
    }
    out
}

/// No function of the library is over 100 lines (issue 25: long functions mixed I/O with
/// state changes; each step now has a name).
#[test]
fn no_function_is_over_100_lines() {
    let mut problems = Vec::new();
    for (file, text) in sources() {
        for (name, line, n) in long_functions(&text, 100) {
            problems.push(format!("{file}:{line}: fn {name} has {n} lines"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // the scanner sees what it is meant to see
    let body = "fn big() {\n".to_owned() + &"    let s = \"}\"; let c = '{';\n".repeat(101) + "}\n";
    assert_eq!(long_functions(&body, 100), [("big".to_owned(), 1, 103)]);
    assert!(long_functions("fn small() {}\nfn decl();\n", 100).is_empty());
}
