//! Key and channel names of one semaphore.
//!
//! Every key and every notification channel of a semaphore share one hash tag,
//! `{<name>}`, so that a Redis Cluster keeps them on one shard and a script may touch all of
//! them. The layout is `<prefix>:{<name>}:<suffix>`:
//!
//! | suffix | type | content |
//! |---|---|---|
//! | `cfg` | hash | `limit`, `ver`, `seq` (ticket counter), `gen` (last fence generation), `grants`, `expired`, `repairs`, `qlen`, `hw` (the slots' high-water mark) |
//! | `queue` | sorted set | waiting tickets, scored by ticket number (FIFO order) |
//! | `exp` | sorted set | session leases (one per client handle and lease length), scored by expiry (ms, Redis `TIME`) |
//! | `meta` | hash | id → JSON record of the holder or waiter |
//! | `slots` | hash | slot number → id of its holder |
//! | `free` | sorted set | free slot numbers below the limit and the high-water mark `cfg.hw` (those above it are free, unlisted) |
//! | `own` | sorted set | the entries of each session (`<session>\|<id>`, a lexicographic index) |
//! | `c:<channel id>` | channel | grants for the waiters of one semaphore handle (a client's id and a per-handle number) |

use crate::error::Error;

/// Longest accepted semaphore name, in bytes.
pub const MAX_NAME_LEN: usize = 200;

/// Largest accepted limit. (The free slot numbers are not all listed in Redis: an idle
/// semaphore costs the same whatever its limit.)
pub const MAX_LIMIT: u32 = 100_000;

/// The version of the redsem protocol (docs/PROTOCOL.md) this crate's scripts speak, as
/// stored in each semaphore's `cfg` hash (`ver`). Clients of different protocol versions
/// refuse each other's semaphores ([`Error::ProtocolMismatch`]).
pub const PROTOCOL_VERSION: u32 = 4;

/// Checks a limit: 1 to [`MAX_LIMIT`], and returns it. Every path that takes a limit
/// (opening, resizing, the CLI's `--limit` and `redsem limit`) checks it here, so that the
/// message is the same everywhere; it takes an `i64` so that a negative or huge value (from
/// a command line, or a binding's integer) gets that message too.
///
/// # Errors
/// [`Error::InvalidArgument`] outside 1..=[`MAX_LIMIT`].
pub fn check_limit(limit: i64) -> Result<u32, Error> {
    match u32::try_from(limit) {
        Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
        _ => Err(Error::InvalidArgument(format!(
            "limit {limit} is outside 1..={MAX_LIMIT} (a semaphore has at least 1 permit and at \
             most {MAX_LIMIT})"
        ))),
    }
}

/// The names of one semaphore's keys and of its notification channels.
#[derive(Clone, Debug)]
#[doc(hidden)]
pub struct Keys {
    pub(crate) name: String,
    /// `cfg`: the configuration hash (limit, version, counters).
    pub cfg: String,
    /// `queue`: the waiting entries, scored by place.
    pub queue: String,
    /// `exp`: the session leases, scored by expiry.
    pub exp: String,
    /// `meta`: id → the record of a holder or waiter.
    pub meta: String,
    /// `slots`: slot number → id of its holder.
    pub slots: String,
    /// `free`: the free slot numbers.
    pub free: String,
    /// `own`: the index of each session's entries.
    pub own: String,
    /// Prefix of the per-handle notification channels; a handle appends its channel id.
    pub(crate) channel_base: String,
}

impl Keys {
    /// The keys of semaphore `name` under `prefix`; fails on an invalid name.
    #[doc(hidden)]
    pub fn new(prefix: &str, name: &str) -> Result<Keys, Error> {
        validate_name(name)?;
        let base = format!("{prefix}:{{{name}}}:");
        let k = |suffix: &str| format!("{base}{suffix}");
        Ok(Keys {
            name: name.to_owned(),
            cfg: k("cfg"),
            queue: k("queue"),
            exp: k("exp"),
            meta: k("meta"),
            slots: k("slots"),
            free: k("free"),
            own: k("own"),
            channel_base: k("c:"),
        })
    }

    /// The seven keys in the order every script takes them as `KEYS` (the prelude's `K_CFG`
    /// … `K_OWN`): `cfg`, `queue`, `exp`, `meta`, `slots`, `free`, `own`. The one place that
    /// order is written in Rust.
    pub fn in_script_order(&self) -> [&str; 7] {
        [
            &self.cfg,
            &self.queue,
            &self.exp,
            &self.meta,
            &self.slots,
            &self.free,
            &self.own,
        ]
    }

    /// The notification channel of the handle whose channel id is `channel_id`.
    pub(crate) fn channel(&self, channel_id: &str) -> String {
        format!("{}{}", self.channel_base, channel_id)
    }
}

/// Checks a semaphore name: 1 to [`MAX_NAME_LEN`] bytes, no braces (they would break the
/// hash tag), no whitespace or control characters.
pub(crate) fn validate_name(name: &str) -> Result<(), Error> {
    let bad = |why: &str| {
        Err(Error::InvalidArgument(format!(
            "semaphore name {} {why}",
            crate::error::display_name(name)
        )))
    };
    if name.is_empty() {
        return bad("is empty: give the semaphore the name of what it protects");
    }
    if name.len() > MAX_NAME_LEN {
        return bad(&format!(
            "is {} bytes long; the maximum is {MAX_NAME_LEN}",
            name.len()
        ));
    }
    if name.contains(['{', '}']) {
        return bad("contains '{' or '}', which would break the Redis Cluster hash tag");
    }
    if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return bad("contains whitespace or control characters");
    }
    Ok(())
}

/// Checks a key prefix: non-empty, at most 64 bytes, no braces, whitespace or colons at the end.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), Error> {
    if prefix.is_empty()
        || prefix.len() > 64
        || prefix.contains(['{', '}'])
        || prefix.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(Error::InvalidArgument(format!(
            "key prefix {prefix:?} must be 1 to 64 bytes without braces or whitespace"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_hash_tag() {
        let k = Keys::new("redsem", "gpu").unwrap();
        for key in k.in_script_order() {
            assert!(key.starts_with("redsem:{gpu}:"), "{key}");
        }
        assert_eq!(k.channel("abc"), "redsem:{gpu}:c:abc");
    }

    #[test]
    fn bad_names_are_rejected() {
        for name in ["", "a{b", "x}", "with space", &"n".repeat(MAX_NAME_LEN + 1)] {
            assert!(matches!(
                Keys::new("redsem", name),
                Err(Error::InvalidArgument(_))
            ));
        }
        assert!(Keys::new("redsem", &"n".repeat(MAX_NAME_LEN)).is_ok());
    }

    #[test]
    fn long_names_are_cut_in_messages() {
        use crate::error::display_name;
        assert_eq!(display_name("jobs"), "\"jobs\"");
        let long = format!("{}{}", "é".repeat(60), "tail");
        assert_eq!(display_name(&long), format!("\"{}…\"", "é".repeat(60)));
        assert_eq!(
            display_name(&"n".repeat(60)),
            format!("\"{}\"", "n".repeat(60))
        );
        let err = Keys::new("redsem", &"n".repeat(MAX_NAME_LEN + 1))
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("\"{}…\"", "n".repeat(60))), "{err}");
        assert!(!err.contains(&"n".repeat(61)), "{err}");
    }

    #[test]
    fn one_wording_for_the_limit_range() {
        assert_eq!(check_limit(1).unwrap(), 1);
        assert_eq!(check_limit(MAX_LIMIT.into()).unwrap(), MAX_LIMIT);
        for bad in [0, -3, i64::from(MAX_LIMIT) + 1, i64::MAX, i64::MIN] {
            let err = check_limit(bad).unwrap_err().to_string();
            assert!(
                err.contains(&format!("limit {bad} is outside 1..=100000")),
                "{err}"
            );
        }
    }

    /// The scripts' protocol version (prelude.lua) is the one this crate announces.
    #[test]
    fn the_protocol_version_is_the_scripts() {
        let prelude = include_str!("lua/prelude.lua");
        assert!(
            prelude.contains(&format!("\nlocal PROTOCOL = {PROTOCOL_VERSION}\n")),
            "prelude.lua's PROTOCOL differs from PROTOCOL_VERSION"
        );
    }
}
