//! What a crate's source files say about its structure, for structural tests (no server): the
//! graph of the imports between its files ([`import_graph`], [`import_cycles`],
//! [`assert_no_import_cycles`]) and its long functions ([`long_functions`],
//! [`assert_no_long_functions`]).
//!
//! ```no_run
//! use std::path::Path;
//!
//! let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
//! let graph = test_support::source::assert_no_import_cycles(&src);
//! assert!(graph["run.rs"].contains("common.rs"));
//! test_support::source::assert_no_long_functions(&src, 100);
//! ```
//!
//! The files are read as text, not compiled: comments and the contents of string and character
//! literals are blanked first, so that a `{` or a `crate::` in them counts for nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

/// The import graph of a crate: each file (its path under `src/`, `/`-separated) and the files
/// it imports.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// The import graph of the crate whose sources are in `src`.
///
/// A file imports the file that defines each module path it names: `crate::…`, `super::…`
/// and `self::…` paths, in `use` declarations or inline, braced groups (`crate::{a, b::C}`)
/// included; a path that names an item rather than a module file imports the file of the
/// module that holds it (`super::overlaps` in `checker/fifo.rs`: `checker/mod.rs`; `crate::X`
/// re-exported by a `pub use m::X` of the crate root: `m`'s file). A module file that
/// declares others (`mod x;`) imports them, except the crate root (`lib.rs`, `main.rs`), which
/// declares every top module: what the root defines (`crate::now`) is below the rest. So a
/// folder's `mod.rs` must not hold what its own files import, or they import each other.
/// `#[cfg(test)]` modules are not read.
pub fn import_graph(src: &Path) -> Graph {
    let files: BTreeMap<String, String> = rust_files(src)
        .into_iter()
        .map(|(rel, text)| (rel, without_test_modules(&blank(&text))))
        .collect();
    let names: BTreeSet<String> = files.keys().cloned().collect();
    let root = ["lib.rs", "main.rs"]
        .into_iter()
        .find(|r| names.contains(*r))
        .unwrap_or("lib.rs")
        .to_owned();
    let reexports = files
        .get(&root)
        .map_or_else(BTreeMap::new, |text| root_reexports(text, &names));
    let mut graph = Graph::new();
    for (file, text) in &files {
        let here = module_path(file);
        let mut to = BTreeSet::new();
        for keyword in ["crate::", "super::", "self::"] {
            for mut path in paths_after(text, keyword) {
                let mut base = match keyword {
                    "crate::" => Vec::new(),
                    "super::" => here[..here.len().saturating_sub(1)].to_vec(),
                    _ => here.clone(),
                };
                // `super::super::…`
                while keyword == "super::" && path.first().is_some_and(|s| s == "super") {
                    path.remove(0);
                    base.pop();
                }
                let reexported = || match (keyword, path.first()) {
                    ("crate::", Some(first)) => reexports.get(first).cloned(),
                    _ => None,
                };
                base.extend(path.iter().cloned());
                let target = resolve(&names, &base).or_else(reexported);
                to.insert(target.unwrap_or_else(|| root.clone()));
            }
        }
        if !matches!(file.as_str(), "lib.rs" | "main.rs") {
            for child in declared_modules(text) {
                let mut full = here.clone();
                full.push(child);
                to.extend(resolve(&names, &full));
            }
        }
        to.remove(file);
        graph.insert(file.clone(), to);
    }
    graph
}

/// The cycles of `graph`, one per edge that closes one, each as `a.rs -> b.rs -> a.rs`.
pub fn import_cycles(graph: &Graph) -> Vec<String> {
    fn visit(
        node: &str,
        graph: &Graph,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
        cycles: &mut Vec<String>,
    ) {
        state.insert(node.to_owned(), 1);
        stack.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            match state.get(next.as_str()).copied().unwrap_or(0) {
                0 => visit(next, graph, state, stack, cycles),
                1 => {
                    let start = stack.iter().position(|n| n == next).unwrap_or(0);
                    cycles.push(format!("{} -> {next}", stack[start..].join(" -> ")));
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(node.to_owned(), 2);
    }
    let mut state = BTreeMap::new();
    let mut cycles = Vec::new();
    for node in graph.keys() {
        if !state.contains_key(node) {
            visit(node, graph, &mut state, &mut Vec::new(), &mut cycles);
        }
    }
    cycles
}

/// Asserts that the files of the crate in `src` import each other in no cycle (see
/// [`import_graph`]); returns the graph, for a test to check that it sees what it should.
///
/// # Panics
/// On a cycle, naming each and showing the graph.
pub fn assert_no_import_cycles(src: &Path) -> Graph {
    let graph = import_graph(src);
    let cycles = import_cycles(&graph);
    assert!(
        cycles.is_empty(),
        "import cycles in {}:\n{}\n\nthe import graph:\n{}",
        src.display(),
        cycles.join("\n"),
        describe(&graph)
    );
    graph
}

/// Asserts that no function of the crate in `src` is longer than `max_lines` (see
/// [`long_functions`]).
///
/// # Panics
/// Naming each longer one.
pub fn assert_no_long_functions(src: &Path, max_lines: usize) {
    let long: Vec<String> = long_functions(src, max_lines)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        long.is_empty(),
        "functions longer than {max_lines} lines in {}, to split into named steps:\n{}",
        src.display(),
        long.join("\n")
    );
}

/// `graph`, one line per file: `a.rs -> b.rs, c.rs` (for a failure message).
pub fn describe(graph: &Graph) -> String {
    graph
        .iter()
        .map(|(from, to)| {
            let to: Vec<&str> = to.iter().map(String::as_str).collect();
            format!("{from} -> {}", to.join(", "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A function longer than asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LongFn {
    /// Its file, under `src/`.
    pub file: String,
    /// The line of its `fn` (from 1).
    pub line: usize,
    /// Its name.
    pub name: String,
    /// Its length in lines, from the line of `fn` to that of its closing brace.
    pub lines: usize,
}

impl fmt::Display for LongFn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{} fn {}: {} lines",
            self.file, self.line, self.name, self.lines
        )
    }
}

/// The functions (methods, nested and test functions included) of the crate in `src` longer
/// than `max_lines`, counted from the line of `fn` to the line of its closing brace.
pub fn long_functions(src: &Path, max_lines: usize) -> Vec<LongFn> {
    let mut long = Vec::new();
    for (file, text) in rust_files(src) {
        let code = blank(&text);
        for (start, name, lines) in functions(&code) {
            if lines > max_lines {
                let line = code[..start].matches('\n').count() + 1;
                long.push(LongFn {
                    file: file.clone(),
                    line,
                    name,
                    lines,
                });
            }
        }
    }
    long
}

/// Every `.rs` file under `src`: its path under `src` (`/`-separated) and its text.
fn rust_files(src: &Path) -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries =
            std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut paths = Vec::new();
    walk(src, &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let rel = p
                .strip_prefix(src)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            let text = std::fs::read_to_string(&p)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
            (rel, text)
        })
        .collect()
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `text` with its comments and the contents of its string and character literals replaced by
/// spaces (line breaks kept, so lines and byte offsets stay where they were).
pub fn blank(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    // copies chars[from..to] as spaces (line breaks and the byte length kept)
    let hide = |out: &mut String, from: usize, to: usize| {
        for &c in &chars[from..to.min(chars.len())] {
            if c == '\n' {
                out.push('\n');
            } else {
                out.extend(std::iter::repeat_n(' ', c.len_utf8()));
            }
        }
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let after_ident = i > 0 && is_ident(chars[i - 1]);
        let end = if c == '/' && next == Some('/') {
            Some(
                chars[i..]
                    .iter()
                    .position(|&c| c == '\n')
                    .map_or(chars.len(), |p| i + p),
            )
        } else if c == '/' && next == Some('*') {
            Some(block_comment_end(&chars, i))
        } else if c == '"' {
            Some(string_end(&chars, i))
        } else if c == 'r'
            && (!after_ident || raw_prefix(&chars, i))
            && matches!(next, Some('"' | '#'))
        {
            raw_string_end(&chars, i)
        } else if c == '\'' {
            char_literal_end(&chars, i)
        } else {
            None
        };
        match end {
            Some(end) => {
                // a literal keeps its delimiters' place as spaces too
                hide(&mut out, i, end);
                i = end;
            }
            None => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// Whether the `r` at `i` follows a `b` or `c` that starts a literal (`br"…"`, `cr"…"`).
fn raw_prefix(chars: &[char], i: usize) -> bool {
    i >= 1 && matches!(chars[i - 1], 'b' | 'c') && (i < 2 || !is_ident(chars[i - 2]))
}

fn block_comment_end(chars: &[char], start: usize) -> usize {
    let mut depth = 0;
    let mut i = start;
    while i + 1 < chars.len() {
        match (chars[i], chars[i + 1]) {
            ('/', '*') => {
                depth += 1;
                i += 2;
            }
            ('*', '/') => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return i;
                }
            }
            _ => i += 1,
        }
    }
    chars.len()
}

fn string_end(chars: &[char], start: usize) -> usize {
    let mut i = start + 1;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    chars.len()
}

/// The end of the raw string starting with the `r` at `start`, `None` if it is no raw string
/// (`r#ident`, a raw identifier).
fn raw_string_end(chars: &[char], start: usize) -> Option<usize> {
    let hashes = chars[start + 1..].iter().take_while(|&&c| c == '#').count();
    let open = start + 1 + hashes;
    if chars.get(open) != Some(&'"') {
        return None;
    }
    let mut i = open + 1;
    while i < chars.len() {
        if chars[i] == '"'
            && chars[i + 1..]
                .iter()
                .take(hashes)
                .filter(|&&c| c == '#')
                .count()
                == hashes
        {
            return Some(i + 1 + hashes);
        }
        i += 1;
    }
    Some(chars.len())
}

/// The end of the character literal starting at `start`, `None` for a lifetime or a label.
fn char_literal_end(chars: &[char], start: usize) -> Option<usize> {
    match chars.get(start + 1) {
        Some('\\') => {
            let close = chars[start + 2..]
                .iter()
                .take(12)
                .position(|&c| c == '\'')?;
            Some(start + 2 + close + 1)
        }
        Some(_) if chars.get(start + 2) == Some(&'\'') => Some(start + 3),
        _ => None,
    }
}

/// The byte offset of the brace that closes the one at `open` (in blanked code).
fn closing_brace(code: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in code[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(open + i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Blanked `code` without its `#[cfg(test)]` modules.
fn without_test_modules(code: &str) -> String {
    let mut out = code.to_owned();
    const ATTR: &str = "#[cfg(test)]";
    // the item the attribute applies to ends at its first `;`, unless a body opens before
    while let Some(at) = out.find(ATTR) {
        let item = at + ATTR.len();
        let end = match out[item..].find(['{', ';']).map(|i| item + i) {
            Some(b) if out[b..].starts_with('{') => closing_brace(&out, b).map(|e| e + 1),
            Some(semi) => Some(semi + 1),
            None => None,
        };
        out.replace_range(at..end.unwrap_or(out.len()), "");
    }
    out
}

/// The identifier segments of a path at the start of `s`: `a::b::C` → `[a, b, C]`, and for
/// a braced group every path in it: `{a, b::{C, D}}` → `[a]`, `[b, C]`, `[b, D]`.
fn segments(s: &str) -> Vec<Vec<String>> {
    let s = s.trim_start();
    if let Some(group) = s.strip_prefix('{') {
        let mut paths = Vec::new();
        let mut depth = 0;
        let mut item_start = 0;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    paths.extend(segments(&group[item_start..i]));
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    paths.extend(segments(&group[item_start..i]));
                    item_start = i + 1;
                }
                _ => {}
            }
        }
        return paths;
    }
    let ident: String = s.chars().take_while(|&c| is_ident(c)).collect();
    if ident.is_empty() {
        return Vec::new();
    }
    let rest = &s[ident.len()..];
    match rest.strip_prefix("::") {
        Some(rest) => {
            let tails = segments(rest);
            if tails.is_empty() {
                return vec![vec![ident]];
            }
            tails
                .into_iter()
                .map(|mut tail| {
                    tail.insert(0, ident.clone());
                    tail
                })
                .collect()
        }
        None => vec![vec![ident]],
    }
}

/// Every path that follows `keyword` (`crate::`, `super::`, `self::`) in `code`, where the
/// keyword starts a path (`redsem_crate::` does not).
fn paths_after(code: &str, keyword: &str) -> Vec<Vec<String>> {
    code.match_indices(keyword)
        .filter(|(i, _)| !code[..*i].ends_with(|c: char| is_ident(c) || c == ':'))
        .flat_map(|(i, _)| segments(&code[i + keyword.len()..]))
        .map(|mut path| {
            // `self` in a group (`crate::m::{self, X}`) names the module itself
            path.retain(|s| s != "self");
            path
        })
        .collect()
}

/// The modules `code` declares in files of their own (`mod x;`, with any visibility).
fn declared_modules(code: &str) -> Vec<String> {
    code.lines()
        .filter_map(|line| {
            let mut l = line.trim();
            if let Some(rest) = l.strip_prefix("pub") {
                l = rest.trim_start();
                if l.starts_with('(') {
                    l = l.split_once(')')?.1.trim_start();
                }
            }
            let name = l.strip_prefix("mod ")?.trim().strip_suffix(';')?.trim();
            name.chars().all(is_ident).then(|| name.to_owned())
        })
        .collect()
}

/// The module path of a file: `a/b.rs` → `[a, b]`, `a/mod.rs` → `[a]`, `lib.rs` → `[]`.
fn module_path(file: &str) -> Vec<String> {
    let mut parts: Vec<String> = file
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_owned)
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod"))
        || parts.len() == 1 && matches!(parts[0].as_str(), "lib" | "main")
    {
        parts.pop();
    }
    parts
}

/// The file that defines the deepest module of `path` (segments from the crate root), if any.
fn resolve(files: &BTreeSet<String>, path: &[String]) -> Option<String> {
    let mut dir = String::new();
    let mut found = None;
    for seg in path {
        let file = format!("{dir}{seg}.rs");
        let folder = format!("{dir}{seg}/mod.rs");
        let sub = format!("{dir}{seg}/");
        if files.contains(&file) {
            found = Some(file);
        } else if files.contains(&folder) {
            found = Some(folder);
        } else {
            break;
        }
        if !files.iter().any(|f| f.starts_with(&sub)) {
            break;
        }
        dir = sub;
    }
    found
}

/// The names the crate root re-exports from its modules (`pub use m::{A, B}`: `A` → `m`'s
/// file).
fn root_reexports(root: &str, files: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for line in root.lines() {
        let Some(rest) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        let rest = rest.strip_prefix("crate::").unwrap_or(rest);
        for path in segments(rest) {
            let Some((name, module)) = path.split_last() else {
                continue;
            };
            if let Some(file) = resolve(files, module) {
                names.insert(name.clone(), file);
            }
        }
    }
    names
}

/// The functions with a body in blanked `code`: the byte offset of each `fn`, its name and
/// its length in lines.
fn functions(code: &str) -> Vec<(usize, String, usize)> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices("fn") {
        if code[..at].ends_with(is_ident) {
            continue;
        }
        let after = &code[at + 2..];
        if !after.starts_with(char::is_whitespace) {
            continue; // `fn(…)`, a function pointer type, or `fnord`
        }
        let name: String = after
            .trim_start()
            .chars()
            .take_while(|&c| is_ident(c))
            .collect();
        if name.is_empty() {
            continue;
        }
        // the body opens at the first `{` before any `;` (a declaration without a body)
        let Some(open) = after
            .find(['{', ';'])
            .filter(|&i| after[i..].starts_with('{'))
        else {
            continue;
        };
        let open = at + 2 + open;
        let Some(close) = closing_brace(code, open) else {
            continue;
        };
        let lines = code[at..=close].matches('\n').count() + 1;
        found.push((at, name, lines));
    }
    found
}
