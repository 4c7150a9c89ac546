//! Redis URLs: which deployment a URL names ([`parse_url`]), and how a URL is shown in
//! messages ([`redact_url`]).
//!
//! The single-server forms are parsed by redis-rs. The cluster and Sentinel forms list
//! several hosts in one authority, which no URL parser accepts: the hosts are split here,
//! the rest of the URL (path, query, fragment) is parsed by the `url` crate, and each host
//! becomes a single-server URL for redis-rs. Query values of our own
//! (`sentinel_username`, `sentinel_password`) are percent-decoded with `percent-encoding`.

use percent_encoding::percent_decode_str;
use redis::{ConnectionInfo, IntoConnectionInfo, ProtocolVersion, RedisConnectionInfo};

use crate::error::Error;

/// Where the client connects: one server, a cluster, or a master found through sentinels.
#[derive(Clone, Debug)]
pub(crate) enum Topology {
    Standalone(ConnectionInfo),
    Cluster(Vec<ConnectionInfo>),
    Sentinel(SentinelSpec),
}

#[derive(Clone, Debug)]
pub(crate) struct SentinelSpec {
    pub(crate) sentinels: Vec<ConnectionInfo>,
    pub(crate) master_name: String,
    /// User, password and database for the master (from the URL).
    pub(crate) data: RedisConnectionInfo,
    pub(crate) tls: bool,
}

const URL_FORMS: &str = "redis://[user:password@]host:port[/db], rediss://… (TLS), unix:///path, \
     redis+cluster://host:port[,host:port…], or redis+sentinel://host:port[,host:port…]/master-name";

/// Parses a URL into a topology (see the module documentation for the schemes).
pub(crate) fn parse_url(url: &str) -> Result<Topology, Error> {
    let shown = redact_url(url);
    let bad = |why: String| {
        Error::InvalidArgument(format!(
            "cannot parse Redis URL {shown:?}: {why} (expected {URL_FORMS})"
        ))
    };
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(bad("no scheme".into()));
    };
    let scheme = scheme.to_ascii_lowercase();
    let (base, kind) = match scheme.split_once('+') {
        Some((base, kind)) if kind == "cluster" || kind == "sentinel" => (base, kind),
        _ => {
            let query = Query::parse(url, &scheme, &bad)?;
            let info = url.into_connection_info().map_err(|e| bad(e.to_string()))?;
            return Ok(Topology::Standalone(query.apply(info, &bad)?));
        }
    };
    if base != "redis" && base != "rediss" {
        return Err(bad(format!("unknown scheme {scheme:?}")));
    }
    // authority = [creds@]host[:port][,host[:port]...]; then /path, ?query, #fragment
    let cut = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(cut);
    let (creds, hosts) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let hosts: Vec<&str> = hosts.split(',').filter(|h| !h.is_empty()).collect();
    if hosts.is_empty() {
        return Err(bad("no host".into()));
    }
    // the path, query and fragment, parsed as those of a URL with one placeholder host
    let parsed = ::url::Url::parse(&format!("{base}://placeholder{tail}"))
        .map_err(|e| bad(format!("{e}")))?;
    let path = parsed.path();
    let fragment = parsed
        .fragment()
        .map(|f| format!("#{f}"))
        .unwrap_or_default();
    let q = Query::parse(url, &scheme, &bad)?;
    // redis-rs reads `protocol`; the credentials are set from `q`
    let query = match &q.protocol {
        Some(p) => format!("?protocol={p}"),
        None => String::new(),
    };
    let node = |host: &str, creds: &str, path: &str| -> Result<ConnectionInfo, Error> {
        format!("{base}://{creds}{host}{path}{query}{fragment}")
            .as_str()
            .into_connection_info()
            .map_err(|e| bad(format!("host {host:?}: {e}")))
    };
    if kind == "cluster" {
        let nodes = hosts
            .iter()
            .map(|h| node(h, creds, path).and_then(|i| q.apply(i, &bad)))
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(Topology::Cluster(nodes));
    }
    sentinel_topology((path, creds), &hosts, &q, &node, &bad, base == "rediss")
}

/// The node URL builder of [`parse_url`]: a host, credentials and a path into connection info.
type NodeOf<'a> = dyn Fn(&str, &str, &str) -> Result<ConnectionInfo, Error> + 'a;

/// A Sentinel URL's topology: `path` is `/master-name[/db]`, `creds` the data nodes'
/// credentials, `hosts` the sentinels (port 26379 when none is given).
fn sentinel_topology(
    (path, creds): (&str, &str),
    hosts: &[&str],
    q: &Query,
    node: &NodeOf<'_>,
    bad: &dyn Fn(String) -> Error,
    tls: bool,
) -> Result<Topology, Error> {
    let (sentinel_user, sentinel_pass) = (&q.sentinel_username, &q.sentinel_password);
    // sentinel: /master-name[/db]
    let mut parts = path.trim_start_matches('/').split('/');
    let master_name = parts.next().unwrap_or_default().to_owned();
    if master_name.is_empty() {
        return Err(bad(
            "a Sentinel URL names the master: redis+sentinel://host:port/master-name".into(),
        ));
    }
    let db = match parts.next() {
        Some(db) if !db.is_empty() => format!("/{db}"),
        _ => String::new(),
    };
    let data = q
        .apply(node("127.0.0.1:6379", creds, &db)?, bad)?
        .redis_settings()
        .clone();
    let sentinels = hosts
        .iter()
        .map(|h| {
            // sentinels listen on 26379 by default
            let has_port = h.rsplit_once(':').is_some_and(|(_, p)| !p.contains(']'));
            let h = if has_port {
                h.to_string()
            } else {
                format!("{h}:26379")
            };
            let info = node(&h, "", "")?;
            let mut settings = info.redis_settings().clone().set_db(0);
            if let Some(u) = sentinel_user {
                settings = settings.set_username(u);
            }
            if let Some(p) = sentinel_pass {
                settings = settings.set_password(p);
            }
            Ok(info.set_redis_settings(settings))
        })
        .collect::<Result<Vec<_>, Error>>()?;
    Ok(Topology::Sentinel(SentinelSpec {
        sentinels,
        master_name,
        data,
        tls,
    }))
}

/// The query parameters of a URL that redsem reads; any other is refused, so that a
/// misspelt or unsupported one (`?pasword=`, `?timeout=`) is not silently ignored.
///
/// - `username`, `password`: the credentials of the data nodes, as redis-py reads them (an
///   alternative to the user-info `user:password@`; giving one in both places is refused);
/// - `protocol`: `resp2` or `resp3`, read by redis-rs;
/// - Unix sockets: `db`, `user` and `pass` too (redis-rs's names);
/// - Sentinel: `sentinel_username`, `sentinel_password` (the sentinels' credentials).
#[derive(Default)]
struct Query {
    username: Option<String>,
    password: Option<String>,
    protocol: Option<String>,
    sentinel_username: Option<String>,
    sentinel_password: Option<String>,
}

impl Query {
    fn parse(url: &str, scheme: &str, bad: &dyn Fn(String) -> Error) -> Result<Query, Error> {
        let raw = url.split_once('?').map_or("", |(_, q)| q);
        let raw = raw.split('#').next().unwrap_or_default();
        let sentinel = scheme.ends_with("+sentinel");
        let unix = scheme == "unix" || scheme == "redis+unix";
        let mut q = Query::default();
        for pair in raw.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = Some(decode(v));
            match k {
                "username" => q.username = v,
                "password" => q.password = v,
                "protocol" => q.protocol = v,
                "db" | "user" | "pass" if unix => {}
                "sentinel_username" if sentinel => q.sentinel_username = v,
                "sentinel_password" if sentinel => q.sentinel_password = v,
                _ => {
                    let known = match (unix, sentinel) {
                        (true, _) => "username, password, protocol, db, user, pass",
                        (_, true) => {
                            "username, password, protocol, sentinel_username, sentinel_password"
                        }
                        _ => "username, password, protocol",
                    };
                    return Err(bad(format!(
                        "unknown URL parameter {k:?} (redsem reads {known}; put the \
                         database in the path: redis://host:port/DB)"
                    )));
                }
            }
        }
        Ok(q)
    }

    /// `info` with the query's user name and password (refused when the URL's user-info
    /// gives them too).
    fn apply(
        &self,
        info: ConnectionInfo,
        bad: &dyn Fn(String) -> Error,
    ) -> Result<ConnectionInfo, Error> {
        let mut settings = info.redis_settings().clone();
        if let Some(u) = &self.username {
            if settings.username().is_some() {
                return Err(bad(
                    "the user name is given twice (user@ and ?username=): keep one".into(),
                ));
            }
            settings = settings.set_username(u);
        }
        if let Some(p) = &self.password {
            if settings.password().is_some() {
                return Err(bad(
                    "the password is given twice (:password@ and ?password=): keep one".into(),
                ));
            }
            settings = settings.set_password(p);
        }
        Ok(info.set_redis_settings(settings))
    }
}

/// The query parameters whose values [`redact_url`] shows.
const SHOWN_PARAMETERS: &[&str] = &["protocol", "db", "username", "user", "sentinel_username"];

/// Decodes the `%XX` escapes of a query value (a `+` stays a `+`; a stray `%` stays as is).
fn decode(s: &str) -> String {
    percent_decode_str(s).decode_utf8_lossy().into_owned()
}

/// The URL with its passwords replaced by `***`, for messages and logs: the password of the
/// user-info (`redis://user:***@host`), and the value of every query parameter but those
/// known to hold no secret (`protocol`, `db` and the user names): `?password=***`,
/// `?sentinel_password=***`, a misspelt `?pasword=***`. Works on URLs that do not parse, too.
pub fn redact_url(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    // The user-info: what follows the scheme's `://` up to the last `@`; in a URL whose
    // scheme is mistyped (`redis//u:pw@h`, `redis:u:pw@h`), what follows the last `/` before
    // that `@`, or all of it.
    let base = match base.rfind('@') {
        Some(at) => {
            let start = match base.find("://") {
                Some(s) if s < at => s + 3,
                _ => base[..at].rfind('/').map_or(0, |i| i + 1),
            };
            let creds = &base[start..at];
            match creds.find(':') {
                Some(c) => format!("{}{}:***{}", &base[..start], &creds[..c], &base[at..]),
                None => base.to_owned(),
            }
        }
        None => base.to_owned(),
    };
    match query {
        None => base,
        Some(q) => {
            let q: Vec<String> = q
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if !SHOWN_PARAMETERS.contains(&k) => format!("{k}=***"),
                    _ => kv.to_owned(),
                })
                .collect();
            format!("{base}?{}", q.join("&"))
        }
    }
}

/// `info` with RESP3 (the subscriber connections need pushes).
pub(super) fn resp3(info: &ConnectionInfo) -> ConnectionInfo {
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    info.clone().set_redis_settings(settings)
}

/// `host:port` of a TCP address, for messages.
pub(super) fn addr_of(info: &ConnectionInfo) -> String {
    match info.addr() {
        redis::ConnectionAddr::Tcp(h, p) => format!("{h}:{p}"),
        redis::ConnectionAddr::TcpTls { host, port, .. } => format!("{host}:{port}"),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_choose_the_topology() {
        assert!(matches!(
            parse_url("redis://u:p@h:1/2").unwrap(),
            Topology::Standalone(_)
        ));
        let Topology::Cluster(nodes) =
            parse_url("redis+cluster://app:s%40cret@a:7000,b:7001,[::1]:7002").unwrap()
        else {
            panic!()
        };
        assert_eq!(nodes.len(), 3);
        assert_eq!(nodes[1].redis_settings().username(), Some("app"));
        assert_eq!(nodes[1].redis_settings().password(), Some("s@cret"));
        assert_eq!(addr_of(&nodes[0]), "a:7000");
        let Topology::Sentinel(s) =
            parse_url("redis+sentinel://u:pw@s1:5000,s2/mymaster/3").unwrap()
        else {
            panic!()
        };
        assert_eq!(s.master_name, "mymaster");
        assert_eq!(s.data.db(), 3);
        assert_eq!(s.data.password(), Some("pw"));
        assert_eq!(addr_of(&s.sentinels[1]), "s2:26379");
        assert_eq!(s.sentinels[0].redis_settings().password(), None);
        assert!(!s.tls);
        let Topology::Sentinel(s) = parse_url(
            "redis+sentinel://s1:5000/m?sentinel_username=watch&sentinel_password=p%40ss",
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(s.sentinels[0].redis_settings().username(), Some("watch"));
        assert_eq!(s.sentinels[0].redis_settings().password(), Some("p@ss"));
        assert_eq!(s.data.password(), None);
        // ?username= and ?password= are the data nodes' credentials
        let Topology::Standalone(i) =
            parse_url("redis://h:1/?username=app&password=p%40ss").unwrap()
        else {
            panic!()
        };
        assert_eq!(i.redis_settings().username(), Some("app"));
        assert_eq!(i.redis_settings().password(), Some("p@ss"));
        let Topology::Sentinel(s) =
            parse_url("redis+sentinel://s1/m?password=data&sentinel_password=watch").unwrap()
        else {
            panic!()
        };
        assert_eq!(s.data.password(), Some("data"));
        assert_eq!(s.sentinels[0].redis_settings().password(), Some("watch"));
        let Topology::Cluster(nodes) = parse_url("redis+cluster://a:1,b:2?password=pw").unwrap()
        else {
            panic!()
        };
        assert!(
            nodes
                .iter()
                .all(|n| n.redis_settings().password() == Some("pw"))
        );
        assert_eq!(decode("a%2Fb%"), "a/b%");
        assert_eq!(decode("a+b%20c"), "a+b c");
        for bad in [
            "redis+sentinel://s1:5000",
            "redis+cluster://",
            "redis+bogus://h:1",
            "http://h:1",
            "ftp+cluster://h:1",
            // parameters that would be ignored, and credentials given twice
            "redis://h:1/?db=2",
            "redis://h:1/?pasword=x",
            "redis://h:1/?sentinel_password=x",
            "redis+cluster://h:1?timeout=5",
            "redis://:a@h:1/?password=b",
            "redis://u@h:1/?username=v",
        ] {
            assert!(
                matches!(parse_url(bad), Err(Error::InvalidArgument(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn redact_hides_passwords() {
        assert_eq!(
            redact_url("redis://app:secret@h:1/0"),
            "redis://app:***@h:1/0"
        );
        assert_eq!(redact_url("redis://u:pw@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact_url("redis://h:1"), "redis://h:1");
        assert_eq!(redact_url("redis://user@h:1"), "redis://user@h:1");
        assert_eq!(
            redact_url("redis+sentinel://u:pw@s1,s2/m?sentinel_password=x&a=b"),
            "redis+sentinel://u:***@s1,s2/m?sentinel_password=***&a=***"
        );
        assert_eq!(
            redact_url("redis+sentinel://s:1/m?sentinel_username=u&sentinel_password=pw"),
            "redis+sentinel://s:1/m?sentinel_username=u&sentinel_password=***"
        );
        // a password with an unescaped '/' or '@' is hidden whole
        assert_eq!(redact_url("redis://u:p/ss@h:1"), "redis://u:***@h:1");
        assert_eq!(redact_url("redis://u:p@ss@h:1"), "redis://u:***@h:1");
        assert_eq!(
            redact_url("redis://h:1/?password=a&pass=b&pasword=c&protocol=3"),
            "redis://h:1/?password=***&pass=***&pasword=***&protocol=3"
        );
        // not a URL at all: shown as given
        assert_eq!(redact_url("not a url"), "not a url");
        // a mistyped scheme still hides the password (the message quotes the URL)
        assert_eq!(redact_url("redis//u:pw@h:1/"), "redis//u:***@h:1/");
        assert_eq!(redact_url("redis:u:pw@h:1"), "redis:***@h:1");
        assert_eq!(redact_url(":pw@h:1"), ":***@h:1");
    }
}
