//! The monitoring docs stay true: `docs/metrics.md`'s table lists exactly what the library
//! records and what a running exporter serves, with the right types, and the shipped Grafana
//! dashboard and Prometheus alert rules are valid and use only those names.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use common::*;
use serde::Deserialize;

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo_file(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `docs/metrics.md`'s table: name → (type, emitted by).
fn documented() -> BTreeMap<String, (String, String)> {
    let doc = read("docs/metrics.md");
    let mut table = BTreeMap::new();
    for line in doc.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // ["", name, type, labels, emitted by, what, ""]
        assert!(cells.len() >= 7, "a short row in docs/metrics.md: {line}");
        let name = cells[1].trim_matches('`').to_owned();
        let previous = table.insert(name.clone(), (cells[2].to_owned(), cells[4].to_owned()));
        assert!(
            previous.is_none(),
            "{name} appears twice in docs/metrics.md"
        );
    }
    assert!(!table.is_empty(), "no rows found in docs/metrics.md");
    table
}

/// Every `redsem_…` metric name in a PromQL expression, with a histogram's
/// `_bucket`/`_sum`/`_count` series mapped to the histogram's name.
fn names_in(expr: &str, histograms: &BTreeSet<String>) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("redsem_") {
        let starts_word = at == 0
            || !rest.as_bytes()[at - 1].is_ascii_alphanumeric() && rest.as_bytes()[at - 1] != b'_';
        let token: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        rest = &rest[at + token.len()..];
        if !starts_word {
            continue;
        }
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| token.strip_suffix(s).filter(|b| histograms.contains(*b)))
            .map(str::to_owned)
            .unwrap_or(token);
        names.push(base);
    }
    names
}

/// Brackets balance and quotes close: the cheapest syntax check of a PromQL expression
/// that catches a truncated or mis-edited one.
fn assert_balanced(expr: &str, whose: &str) {
    let mut stack = Vec::new();
    let mut in_quote = false;
    let mut escaped = false;
    for c in expr.chars() {
        if in_quote {
            match (escaped, c) {
                (false, '\\') => escaped = true,
                (false, '"') => in_quote = false,
                _ => escaped = false,
            }
            continue;
        }
        match c {
            '"' => in_quote = true,
            '(' | '[' | '{' => stack.push(c),
            ')' | ']' | '}' => {
                let open = stack.pop();
                let want = match c {
                    ')' => '(',
                    ']' => '[',
                    _ => '{',
                };
                assert_eq!(open, Some(want), "{whose}: unbalanced {c:?} in {expr}");
            }
            _ => {}
        }
    }
    assert!(!in_quote, "{whose}: an unclosed quote in {expr}");
    assert!(stack.is_empty(), "{whose}: unclosed {stack:?} in {expr}");
}

fn histograms(table: &BTreeMap<String, (String, String)>) -> BTreeSet<String> {
    table
        .iter()
        .filter(|(_, (kind, _))| kind == "histogram")
        .map(|(name, _)| name.clone())
        .collect()
}

/// The table lists exactly the library's names (`redsem::metrics::ALL`) and the names a running
/// exporter serves, each with the type the exporter declares.
#[test]
fn the_metrics_table_matches_the_library_and_a_running_exporter() {
    let table = documented();

    let library: BTreeSet<String> = redsem::metrics::ALL.iter().map(|s| s.to_string()).collect();
    let documented_library: BTreeSet<String> = table
        .iter()
        .filter(|(_, (_, by))| by == "library")
        .map(|(name, _)| name.clone())
        .collect();
    assert_eq!(
        documented_library, library,
        "docs/metrics.md's library rows differ from redsem::metrics::ALL"
    );
    for name in &library {
        assert!(name.starts_with("redsem_client_"), "{name}");
    }

    let server = Server::start(Flavor::Redis);
    let out = run(redsem(&server).args(["run", "seen", "--limit", "2", "--", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let (_exporter, addr) = spawn_exporter(&server);
    let response = http_get(&addr, "/metrics");
    let body = response.split_once("\r\n\r\n").unwrap().1;

    let mut served = BTreeMap::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            served.insert(name.to_owned(), kind.to_owned());
        }
    }
    // every sample belongs to a declared metric
    for line in body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name = line.split(['{', ' ']).next().unwrap();
        assert!(served.contains_key(name), "{name} is served without # TYPE");
    }
    let documented_exporter: BTreeMap<String, String> = table
        .iter()
        .filter(|(_, (_, by))| by == "exporter")
        .map(|(name, (kind, _))| (name.clone(), kind.clone()))
        .collect();
    assert_eq!(
        documented_exporter, served,
        "docs/metrics.md's exporter rows (name, type) differ from what the exporter serves"
    );
    for name in served.keys() {
        assert!(
            name.starts_with("redsem_semaphore_") || name.starts_with("redsem_exporter_"),
            "{name}"
        );
    }
    assert!(
        library.is_disjoint(&served.keys().cloned().collect()),
        "a name is both the library's and the exporter's"
    );
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    groups: Vec<RuleGroup>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleGroup {
    name: String,
    #[serde(default)]
    interval: Option<String>,
    rules: Vec<AlertRule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AlertRule {
    alert: String,
    expr: String,
    #[serde(default, rename = "for")]
    for_: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

/// A Prometheus duration: one or more `<number><unit>` with unit ms, s, m, h, d, w or y.
fn is_prometheus_duration(s: &str) -> bool {
    let mut rest = s;
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        let unit = ["ms", "s", "m", "h", "d", "w", "y"]
            .into_iter()
            .find(|u| rest.starts_with(u));
        match unit {
            Some(u) => rest = &rest[u.len()..],
            None => return false,
        }
    }
    true
}

/// `docs/monitoring/alerts.yml` parses as Prometheus rule groups, each rule complete, and uses
/// only documented metrics.
#[test]
fn the_alert_rules_are_valid_and_use_documented_metrics() {
    let table = documented();
    let histograms = histograms(&table);
    let file: RuleFile = serde_yaml::from_str(&read("docs/monitoring/alerts.yml"))
        .expect("docs/monitoring/alerts.yml is not a Prometheus rule file");
    assert!(!file.groups.is_empty());
    let mut alerts = BTreeSet::new();
    for group in &file.groups {
        assert!(!group.name.is_empty());
        if let Some(interval) = &group.interval {
            assert!(is_prometheus_duration(interval), "{interval}");
        }
        assert!(!group.rules.is_empty(), "group {} has no rules", group.name);
        for rule in &group.rules {
            assert!(alerts.insert(rule.alert.clone()), "{} twice", rule.alert);
            assert!(
                rule.alert
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "{}: not a valid alert name",
                rule.alert
            );
            if let Some(d) = &rule.for_ {
                assert!(is_prometheus_duration(d), "{}: for: {d}", rule.alert);
            }
            assert!(rule.labels.contains_key("severity"), "{}", rule.alert);
            for key in ["summary", "description"] {
                assert!(
                    rule.annotations.contains_key(key),
                    "{}: no {key}",
                    rule.alert
                );
            }
            assert_balanced(&rule.expr, &rule.alert);
            let names = names_in(&rule.expr, &histograms);
            assert!(!names.is_empty(), "{} uses no redsem metric", rule.alert);
            for name in names {
                assert!(
                    table.contains_key(&name),
                    "alert {} uses {name}, which docs/metrics.md does not list",
                    rule.alert
                );
            }
        }
    }
}

/// `docs/monitoring/grafana-dashboard.json` is a dashboard whose every query uses only documented
/// metrics, with unique panel ids and a `semaphore` variable.
#[test]
fn the_dashboard_is_valid_and_uses_documented_metrics() {
    let table = documented();
    let histograms = histograms(&table);
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("docs/monitoring/grafana-dashboard.json"))
            .expect("the dashboard is not JSON");
    assert!(dashboard["title"].is_string());
    assert!(dashboard["schemaVersion"].is_u64());
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert!(variables.contains(&"semaphore"), "{variables:?}");
    assert!(variables.contains(&"datasource"), "{variables:?}");

    let panels = dashboard["panels"].as_array().unwrap();
    let mut ids = BTreeSet::new();
    let mut queries = 0;
    for panel in panels {
        let id = panel["id"].as_u64().expect("a panel without an id");
        assert!(ids.insert(id), "panel id {id} twice");
        assert!(panel["type"].is_string());
        for pos in ["h", "w", "x", "y"] {
            assert!(panel["gridPos"][pos].is_u64(), "panel {id}: gridPos.{pos}");
        }
        let Some(targets) = panel["targets"].as_array() else {
            assert_eq!(panel["type"], "row", "panel {id} has no queries");
            continue;
        };
        for target in targets {
            let expr = target["expr"].as_str().expect("a target without expr");
            let whose = format!("panel {id}");
            assert_balanced(expr, &whose);
            let names = names_in(expr, &histograms);
            assert!(!names.is_empty(), "{whose} uses no redsem metric: {expr}");
            for name in names {
                assert!(
                    table.contains_key(&name),
                    "{whose} uses {name}, which docs/metrics.md does not list"
                );
            }
            queries += 1;
        }
    }
    // the variable's own query too
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(def) = variable["definition"].as_str() {
            for name in names_in(def, &histograms) {
                assert!(table.contains_key(&name), "variable query uses {name}");
            }
        }
    }
    assert!(queries >= 10, "only {queries} queries");
}

#[test]
fn metric_names_are_read_from_promql() {
    let h: BTreeSet<String> = ["redsem_client_hold_seconds".to_owned()].into();
    assert_eq!(
        names_in(
            "histogram_quantile(0.99, sum by (le) (rate(redsem_client_hold_seconds_bucket[5m]))) / x_redsem_other",
            &h
        ),
        ["redsem_client_hold_seconds"]
    );
    assert_eq!(
        names_in(
            "rate(redsem_semaphore_grants_total[1m]) > redsem_semaphore_limit",
            &h
        ),
        ["redsem_semaphore_grants_total", "redsem_semaphore_limit"]
    );
    assert!(is_prometheus_duration("1h30m"));
    assert!(!is_prometheus_duration("5 m"));
    assert!(!is_prometheus_duration("m"));
}

/// promtool, Prometheus's own checker: `$REDSEM_PROMTOOL`, else the one install-deps puts in
/// `.cache/promtool`, else one on `PATH`. `None` (the test is skipped, saying so) when there is
/// none, unless `REDSEM_REQUIRE_PROMTOOL=1` (CI), which makes a missing promtool a failure.
fn promtool() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("REDSEM_PROMTOOL").map(PathBuf::from),
        Some(repo_file(".cache/promtool/promtool")),
        Some(PathBuf::from("promtool")),
    ];
    let found = candidates.into_iter().flatten().find(|p| {
        std::process::Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if found.is_none() {
        assert!(
            std::env::var("REDSEM_REQUIRE_PROMTOOL").as_deref() != Ok("1"),
            "promtool not found (REDSEM_REQUIRE_PROMTOOL=1): run scripts/install-deps.sh promtool"
        );
        eprintln!("promtool not found: skipped (scripts/install-deps.sh promtool installs it)");
    }
    found
}

fn promtool_ok(promtool: &Path, dir: &Path, args: &[&str]) {
    let out = std::process::Command::new(promtool)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Prometheus's own checker accepts the alert rules, their unit tests
/// (`docs/monitoring/alerts.test.yml`: each alert fires on the series that should fire it and
/// not on the others) pass, and every query of the dashboard parses as PromQL (each one is
/// checked as a recording rule, with the dashboard's `$semaphore` variable filled in).
#[test]
fn prometheus_accepts_the_alert_rules_their_tests_and_the_dashboard_queries() {
    let Some(promtool) = promtool() else { return };
    let monitoring = repo_file("docs/monitoring");
    promtool_ok(&promtool, &monitoring, &["check", "rules", "alerts.yml"]);
    promtool_ok(
        &promtool,
        &monitoring,
        &["test", "rules", "alerts.test.yml"],
    );

    let dashboard: serde_json::Value =
        serde_json::from_str(&read("docs/monitoring/grafana-dashboard.json")).unwrap();
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(e) = target["expr"].as_str() {
                exprs.push(e.replace("$semaphore", ".*"));
            }
        }
    }
    assert!(!exprs.is_empty());
    let rules = serde_yaml::to_string(&serde_json::json!({
        "groups": [{
            "name": "dashboard",
            "rules": exprs
                .iter()
                .enumerate()
                .map(|(i, e)| serde_json::json!({ "record": format!("redsem:dashboard_query_{i}"), "expr": e }))
                .collect::<Vec<_>>(),
        }]
    }))
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("dashboard.yml"), rules).unwrap();
    promtool_ok(&promtool, dir.path(), &["check", "rules", "dashboard.yml"]);
}
