//! Connection, errors and exit codes, and formatting shared by the subcommands.

use std::fmt::Write as _;
use std::time::Duration;

use crate::Global;

/// `eprintln!` that never panics: a closed stderr (a finished pipe, a gone terminal) must not
/// bring down `run` while it supervises a command, nor the exporter.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// `print!` that never panics (a reader such as `head` may close the pipe early).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), $($arg)*);
    }};
}

// One exit-status scheme for every subcommand (the table below). redsem's own outcomes use
// statuses that commands seldom use, so `run` can pass the command's own status through.

/// The slot was lost while the command ran (sysexits' EX_TEMPFAIL: running again may work).
pub const EXIT_LOST: u8 = 75;
/// `run`: an operator removed the waiting request from the queue (`redsem release`); the
/// command was not run.
pub const EXIT_REMOVED: u8 = 76;
/// `run --max-hold`: the maximum hold time was reached; the command was terminated.
pub const EXIT_MAX_HOLD: u8 = 77;
/// No permits in time (`run --timeout`, `-n`): the default of `run -E`, as GNU `timeout`.
pub const EXIT_TIMEOUT: u8 = 124;
/// redsem's own error, in every subcommand: a bad command line, Redis unreachable,
/// authentication, a missing permission, WRONGTYPE, an invalid value, a semaphore or holder
/// that does not exist.
pub const EXIT_ERROR: u8 = 125;
/// `run`: the command exists but could not be executed.
pub const EXIT_NOT_EXECUTABLE: u8 = 126;
/// `run`: the command was not found.
pub const EXIT_NOT_FOUND: u8 = 127;

/// The exit-status table, shown by `redsem --help` and `redsem run --help` (and copied in
/// README-cli.md).
pub const EXIT_STATUS_HELP: &str = "\
Exit status (every subcommand):
  0        success (`run`: the command exited 0)
  1-123    `run`: the command's own exit status
  75       `run`: the slot was lost while the command ran; the command was terminated
  76       `run`: an operator removed the waiting request from the queue (`redsem release`);
           the command was not run
  77       `run`: --max-hold was reached; the command was terminated
  124      `run`: no permits within --timeout (or not free at once with -n); the command was
           not run. -E/--conflict-exit-code N changes it
  125      redsem's own error: bad command line, Redis unreachable, authentication, missing
           permission, WRONGTYPE, invalid value, unknown semaphore or holder, a --strict-limit
           mismatch; `run` did not run the command
  126      `run`: the command could not be executed (not an executable file)
  127      `run`: the command was not found
  128+N    `run`: the command was killed by signal N (also: redsem got signal N while waiting)";

/// Why a subcommand failed: printed as one line; redsem exits [`EXIT_ERROR`].
#[derive(Debug)]
pub enum Failure {
    /// An error from the library.
    Lib(redsem::Error),
    /// Anything else (a holder that does not exist, I/O on the terminal or a socket, bad
    /// input).
    Other(String),
}

impl From<redsem::Error> for Failure {
    fn from(e: redsem::Error) -> Self {
        Failure::Lib(e)
    }
}

impl Failure {
    /// The message on one line (errors from Redis may contain newlines).
    pub fn one_line(&self) -> String {
        let text = match self {
            Failure::Lib(e) => describe(e),
            Failure::Other(s) => s.clone(),
        };
        one_line(&text)
    }
}

/// A library error as a person reads it.
pub fn describe(e: &redsem::Error) -> String {
    match e {
        redsem::Error::UnknownSemaphore { name, prefix, .. } => format!(
            "unknown semaphore {name:?}: nothing under key prefix {prefix:?} (check the name, --prefix and --redis-url; `redsem list` shows what exists)"
        ),
        redsem::Error::LimitConflict {
            name,
            requested,
            stored,
            ..
        } => format!(
            "semaphore {name:?} exists with limit {stored}, not {requested}: pass --limit {stored}, or change it for everyone with `redsem limit {name} {requested}`"
        ),
        redsem::Error::WrongType { name, .. } => format!(
            "a key of semaphore {name:?} holds a value redsem did not write (WRONGTYPE): another program uses these key names; pick another name or --prefix (or, if that data may go, `redsem delete {name} --force --delete-foreign-data`)"
        ),
        redsem::Error::NotASemaphore { name, detail, .. } => format!(
            "{name:?} is not a redsem semaphore: {detail}; pick another name or --prefix (or, if that data may go, `redsem delete {name} --force --delete-foreign-data`)"
        ),
        other => other.to_string(),
    }
}

/// Collapses whitespace runs containing newlines, so every message fits one line.
pub fn one_line(s: &str) -> String {
    s.split(['\n', '\r'])
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// Connects the library's client as the global options say.
pub async fn connect(g: &Global) -> Result<redsem::Client, Failure> {
    connect_raw(g).await.map_err(|e| match e {
        redsem::Error::Unreachable(_) | redsem::Error::Auth(_) => {
            Failure::Other(connect_error(g, &e))
        }
        e => Failure::Lib(e),
    })
}

/// [`connect`] with the library's error.
pub async fn connect_raw(g: &Global) -> Result<redsem::Client, redsem::Error> {
    let mut b = redsem::Client::builder(normalize_url(&g.redis_url()))
        .prefix(&g.prefix)
        .connect_timeout(g.connect_timeout)
        .scripts_only(g.scripts_only);
    if let Some(ca) = &g.tls_ca {
        b = b.tls_ca(ca);
    }
    if let Some(cert) = &g.tls_cert {
        b = b.tls_cert(cert);
    }
    if let Some(key) = &g.tls_key {
        b = b.tls_key(key);
    }
    b.build().await
}

/// A connection error, naming the (redacted) URL.
pub fn connect_error(g: &Global, e: &redsem::Error) -> String {
    let text = e.to_string();
    let hint = if text.contains("CertificateRequired") {
        " (TLS: the server requires a client certificate: give --tls-cert and --tls-key)"
    } else if text.contains("certificate") {
        " (TLS: the server's certificate is not trusted; name its CA with --tls-ca)"
    } else if text.contains("TLS") && text.contains("not enabled") {
        " (this redsem was built without the `tls` feature)"
    } else {
        ""
    };
    format!(
        "cannot connect to {}: {}{hint}",
        redsem::redact_url(&g.redis_url()),
        describe(e)
    )
}

/// A bare socket path becomes a `unix://` URL.
pub fn normalize_url(url: &str) -> String {
    if url.starts_with('/') {
        format!("unix://{url}")
    } else {
        url.to_owned()
    }
}

/// Parses `10s`, `1m30s`, `250ms`, `2h` (humantime), or a plain number of seconds (`1.5`).
/// Durations above [`redsem::MAX_DURATION`] (365 days) are refused.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.starts_with('-') {
        return Err(format!(
            "{s:?} is negative: a duration is 0 or more, like 10s, 1m30s or 250ms"
        ));
    }
    let d = if let Ok(secs) = s.parse::<f64>() {
        Duration::try_from_secs_f64(secs)
            .map_err(|_| format!("{s:?} is not a valid number of seconds"))?
    } else {
        humantime::parse_duration(s)
            .map_err(|e| format!("{s:?} is not a duration like 10s, 1m30s or 250ms ({e})"))?
    };
    if d > redsem::MAX_DURATION {
        return Err(format!("{s:?} is longer than the maximum of 365 days"));
    }
    Ok(d)
}

/// `run --max-hold`: a duration above zero (zero would stop the command as it starts).
pub fn parse_max_hold(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!(
            "{s:?} would stop the command as soon as it starts: give a maximum hold time \
             above zero, like 10m, or leave --max-hold out to hold as long as the command runs"
        ));
    }
    Ok(d)
}

/// A lease: a duration of at least [`redsem::MIN_LEASE`] (the library's rule, checked here so
/// that a bad `--lease` is reported as every bad value is).
pub fn parse_lease(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < redsem::MIN_LEASE {
        return Err(format!(
            "{s:?} is shorter than the shortest lease, {}: renewed every third of it, a \
             shorter lease leaves too little time for round trips and delays (the default \
             10s suits almost every use)",
            fmt_dur(redsem::MIN_LEASE)
        ));
    }
    Ok(d)
}

/// A limit, checked as the library checks every limit ([`redsem::check_limit`]: one wording
/// for every path), negative and huge numbers included.
pub fn parse_limit(s: &str) -> Result<u32, String> {
    let n: i64 = s.trim().parse().map_err(|_| {
        format!(
            "{s:?} is not a limit: a whole number in 1..={}",
            redsem::MAX_LIMIT
        )
    })?;
    redsem::check_limit(n).map_err(|e| match e {
        redsem::Error::InvalidArgument(why) => why,
        other => other.to_string(),
    })
}

/// A number of permits for one request: at least 1 (the limit bounds it later).
pub fn parse_permits(s: &str) -> Result<u32, String> {
    let bad = || {
        format!(
            "--permits {s} is not a number of permits: a request takes 1 to {} (at most the limit)",
            redsem::MAX_LIMIT
        )
    };
    match s.trim().parse::<i64>() {
        Ok(n) if (1..=i64::from(redsem::MAX_LIMIT)).contains(&n) => Ok(n as u32),
        _ => Err(bad()),
    }
}

/// A priority class: `0..=`[`redsem::MAX_PRIORITY`].
pub fn parse_priority(s: &str) -> Result<u8, String> {
    match s.trim().parse::<i64>() {
        Ok(p) if (0..=i64::from(redsem::MAX_PRIORITY)).contains(&p) => Ok(p as u8),
        _ => Err(format!(
            "{s:?} is not a priority class: a whole number in 0..={} (0 the default, higher \
             served first)",
            redsem::MAX_PRIORITY
        )),
    }
}

/// A label given on the command line, checked by the library's rule (`redsem::check_label`:
/// one line of printable text, at most 200 bytes) here, which names the option and costs no
/// connection.
pub fn parse_label(s: &str) -> Result<String, String> {
    match redsem::check_label(s) {
        Err(redsem::Error::InvalidArgument(why)) => Err(why),
        Err(e) => Err(e.to_string()),
        Ok(()) => Ok(s.to_owned()),
    }
}

/// A short human duration: `340ms`, `12.3s`, `4m05s`, `2h03m`, `3d04h`.
pub fn fmt_dur(d: Duration) -> String {
    let ms = d.as_millis();
    let s = d.as_secs();
    if ms < 1000 {
        format!("{ms}ms")
    } else if s < 60 {
        format!("{:.1}s", d.as_secs_f64())
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else if s < 86_400 {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    } else {
        format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600)
    }
}

/// `HH:MM:SS` UTC of a Unix time in milliseconds.
pub fn fmt_clock(unix_ms: u64) -> String {
    let s = unix_ms / 1000 % 86_400;
    format!("{:02}:{:02}:{:02}Z", s / 3600, s % 3600 / 60, s % 60)
}

/// Slots and fences as `slot:generation` separated by commas.
pub fn fmt_fences(fences: &[redsem::Fence]) -> String {
    fences
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// A plain text table: left-aligned columns separated by two spaces, no trailing blanks.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut l = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                l.push_str(cell);
            } else {
                let _ = write!(l, "{cell:<w$}  ");
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

/// Cuts `s` to at most `max` bytes on a character boundary, marking the cut with `…`.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("365d").is_ok());
        assert!(
            parse_duration("366d").is_err(),
            "above redsem::MAX_DURATION"
        );
        assert!(parse_duration("1e300").is_err(), "not representable");
    }

    #[test]
    fn durations_print() {
        assert_eq!(fmt_dur(Duration::from_millis(340)), "340ms");
        assert_eq!(fmt_dur(Duration::from_millis(12_340)), "12.3s");
        assert_eq!(fmt_dur(Duration::from_secs(245)), "4m05s");
        assert_eq!(fmt_dur(Duration::from_secs(7380)), "2h03m");
        assert_eq!(fmt_dur(Duration::from_secs(3 * 86_400 + 4 * 3600)), "3d04h");
    }

    /// The library's redaction, with the cases the CLI relies on.
    #[test]
    fn passwords_are_hidden() {
        use redsem::redact_url as redact;
        assert_eq!(redact("redis://u:pw@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact("redis://:pw@h:1"), "redis://:***@h:1");
        assert_eq!(redact("redis://h:1/0"), "redis://h:1/0");
        assert_eq!(redact("unix:///tmp/r.sock"), "unix:///tmp/r.sock");
        assert_eq!(
            redact("redis+cluster://app:pw@a:1,b:2"),
            "redis+cluster://app:***@a:1,b:2"
        );
        assert_eq!(
            redact("redis+sentinel://s:1/m?sentinel_username=u&sentinel_password=pw"),
            "redis+sentinel://s:1/m?sentinel_username=u&sentinel_password=***"
        );
    }

    #[test]
    fn messages_fit_one_line() {
        assert_eq!(one_line("a\n  b\r\n\nc"), "a; b; c");
    }

    #[test]
    fn urls_and_truncation() {
        assert_eq!(normalize_url("/run/redis.sock"), "unix:///run/redis.sock");
        assert_eq!(normalize_url("redis://h:1"), "redis://h:1");
        assert_eq!(truncate("héllo", 4), "h…");
        assert_eq!(truncate("abc", 3), "abc");
    }

    #[test]
    fn tables_align() {
        let t = table(&["A", "BB"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(t, "A    BB\nxyz  1\n");
    }
}
