//! `redsem exporter`: Prometheus metrics of every semaphore under the prefix.
//!
//! The HTTP side is a minimal `GET /metrics` handler on a Tokio `TcpListener` rather than
//! hyper or axum: one read-only endpoint with no routing, bodies, keep-alive or TLS needs
//! nothing more, and the tool stays small and quick to build. Each connection is answered
//! once and closed (`Connection: close`), which every Prometheus scraper accepts.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;

use crate::common::{self, Failure};
use crate::{ExporterArgs, Global};

/// Longest request head accepted.
const MAX_REQUEST: usize = 8192;
/// How long a client may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Semaphores inspected at once during a scrape.
const CONCURRENCY: usize = 16;

/// The Redis side of the exporter: connects lazily, so that it starts (and reports
/// `redsem_exporter_up 0`) while Redis is down.
struct Source {
    global: Global,
    client: Mutex<Option<redsem::Client>>,
}

impl Source {
    async fn client(&self) -> Result<redsem::Client, redsem::Error> {
        let mut slot = self.client.lock().await;
        if let Some(c) = &*slot {
            return Ok(c.clone());
        }
        let c = common::connect_raw(&self.global).await?;
        *slot = Some(c.clone());
        Ok(c)
    }

    /// One scrape: the metrics text.
    async fn scrape(&self) -> String {
        let started = std::time::Instant::now();
        let result = async {
            let client = self.client().await?;
            let names = client.list_semaphores().await?;
            let stats: Vec<_> = futures_util::stream::iter(names)
                .map(|name| {
                    let client = client.clone();
                    async move { (client.inspect(&name).await, name) }
                })
                .buffered(CONCURRENCY)
                .collect()
                .await;
            Ok::<_, redsem::Error>(stats)
        }
        .await;
        let (up, stats) = match result {
            Ok(stats) => (1, stats),
            Err(e) => {
                say!(
                    "redsem exporter: scrape of {} failed: {}",
                    redsem::redact_url(&self.global.redis_url()),
                    common::describe(&e)
                );
                (0, Vec::new())
            }
        };
        let mut good = Vec::with_capacity(stats.len());
        let mut failed = 0;
        for (r, name) in stats {
            match r {
                Ok(s) => good.push(s),
                Err(redsem::Error::UnknownSemaphore { .. }) => {} // deleted meanwhile
                Err(e) => {
                    failed += 1;
                    say!(
                        "redsem exporter: skipping semaphore {name:?}: {}",
                        common::describe(&e)
                    );
                }
            }
        }
        render(&good, up, failed, started.elapsed())
    }
}

/// The Prometheus text exposition (format 0.0.4) of the snapshots.
pub fn render(stats: &[redsem::Stats], up: u8, failed: usize, took: Duration) -> String {
    let mut out = String::new();
    let mut family =
        |name: &str, kind: &str, help: &str, value: &dyn Fn(&redsem::Stats) -> String| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for s in stats {
                let _ = writeln!(
                    out,
                    "{name}{{semaphore=\"{}\"}} {}",
                    escape_label(&s.name),
                    value(s)
                );
            }
        };
    family(
        "redsem_semaphore_limit",
        "gauge",
        "Most permits that may be held at once.",
        &|s| s.limit.to_string(),
    );
    family(
        "redsem_semaphore_holders",
        "gauge",
        "Holders (acquisitions) holding permits now.",
        &|s| s.holder_count.to_string(),
    );
    family(
        "redsem_semaphore_permits_in_use",
        "gauge",
        "Permits held now.",
        &|s| s.in_use.to_string(),
    );
    family(
        "redsem_semaphore_waiters",
        "gauge",
        "Acquisitions queued now.",
        &|s| s.waiter_count.to_string(),
    );
    family(
        "redsem_semaphore_waiting_permits",
        "gauge",
        "Permits requested by the queued acquisitions (the first 100 of the queue).",
        &|s| {
            s.waiters
                .iter()
                .map(|w| u64::from(w.permits))
                .sum::<u64>()
                .to_string()
        },
    );
    family(
        "redsem_semaphore_oldest_wait_seconds",
        "gauge",
        "How long the head of the queue has waited (0 when nobody waits).",
        &|s| format!("{:.3}", s.oldest_wait().unwrap_or_default().as_secs_f64()),
    );
    family(
        "redsem_semaphore_grants_total",
        "counter",
        "Acquisitions granted since the semaphore was created.",
        &|s| s.grants_total.to_string(),
    );
    family(
        "redsem_semaphore_expired_total",
        "counter",
        "Holders and waiters removed because their lease expired, since creation.",
        &|s| s.expired_total.to_string(),
    );
    family(
        "redsem_semaphore_repairs_total",
        "counter",
        "Repairs of lost or inconsistent keys since creation (0 in a healthy Redis).",
        &|s| s.repairs_total.to_string(),
    );
    let _ = writeln!(
        out,
        "# HELP redsem_exporter_up Whether the last scrape could read Redis (1) or not (0)."
    );
    let _ = writeln!(out, "# TYPE redsem_exporter_up gauge");
    let _ = writeln!(out, "redsem_exporter_up {up}");
    let _ = writeln!(
        out,
        "# HELP redsem_exporter_scrape_errors Semaphores that could not be read in the last scrape."
    );
    let _ = writeln!(out, "# TYPE redsem_exporter_scrape_errors gauge");
    let _ = writeln!(out, "redsem_exporter_scrape_errors {failed}");
    let _ = writeln!(
        out,
        "# HELP redsem_exporter_scrape_duration_seconds Time taken by the last scrape."
    );
    let _ = writeln!(out, "# TYPE redsem_exporter_scrape_duration_seconds gauge");
    let _ = writeln!(
        out,
        "redsem_exporter_scrape_duration_seconds {:.6}",
        took.as_secs_f64()
    );
    out
}

/// Escapes a label value: backslash, double quote and newline.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `redsem exporter --listen ADDR`: serves until killed.
pub async fn serve(g: &Global, a: ExporterArgs) -> Result<u8, Failure> {
    let source = Arc::new(Source {
        global: g.clone(),
        client: Mutex::new(None),
    });
    // configuration errors (bad URL, wrong password) stop at once; an unreachable Redis
    // does not: scrapes report redsem_exporter_up 0 until it is back
    match source.client().await {
        Ok(_) => {}
        Err(e @ redsem::Error::Unreachable(_)) => say!(
            "redsem exporter: warning: {}; serving redsem_exporter_up 0 until it is reachable",
            common::connect_error(g, &e)
        ),
        Err(e @ redsem::Error::Auth(_)) => {
            return Err(Failure::Other(common::connect_error(g, &e)));
        }
        Err(e) => return Err(e.into()),
    }
    let listener = TcpListener::bind(&a.listen)
        .await
        .map_err(|e| Failure::Other(format!("cannot listen on {}: {e}", a.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Failure::Other(format!("cannot listen on {}: {e}", a.listen)))?;
    say!("redsem exporter: serving http://{addr}/metrics");
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // e.g. too many open files: back off instead of spinning
                say!("redsem exporter: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let source = source.clone();
        tokio::spawn(async move {
            let _ = handle(stream, &source).await;
        });
    }
}

/// Answers one HTTP request and closes the connection.
async fn handle(mut stream: TcpStream, source: &Source) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let head = tokio::time::timeout(READ_TIMEOUT, async {
        let mut chunk = [0u8; 1024];
        loop {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>(false);
            }
            buf.extend_from_slice(&chunk[..n]);
            if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n") {
                return Ok(true);
            }
            if buf.len() > MAX_REQUEST {
                return Ok(true);
            }
        }
    })
    .await;
    if !matches!(head, Ok(Ok(true))) {
        return Ok(());
    }
    let line = String::from_utf8_lossy(&buf);
    let mut parts = line.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            source.scrape().await,
        ),
        ("GET" | "HEAD", "/") => (
            "200 OK",
            "text/plain; charset=utf-8",
            "redsem exporter: metrics at /metrics\n".to_owned(),
        ),
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "not found: metrics are at /metrics\n".to_owned(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET and HEAD are supported\n".to_owned(),
        ),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nAllow: GET, HEAD\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if method != "HEAD" {
        response.push_str(&body);
    }
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    #[test]
    fn label_values_are_escaped() {
        assert_eq!(super::escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
