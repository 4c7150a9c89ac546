//! The ids the protocol writes into keys, records and channels, built in this one place:
//!
//! | id | form | unique because |
//! |---|---|---|
//! | channel id (a handle's; `c` in a record) | `<client id>.<n>` | the client id is random, `n` counts the client's handles |
//! | entry id (a holder or waiter) | `<channel id>-<n in hex>` | `n` counts the process's entries |
//! | session id (an `exp` member) | `<channel id>~<lease ms>` | one session per handle and lease length |
//!
//! `prelude.lua` builds a record's session id the same way (`sess_of`); the client never
//! parses an id back.

use std::sync::atomic::{AtomicU64, Ordering};

/// The channel id of the `n`-th handle of the client `client_id`: it ends the handle's
/// notification channel ([`Keys::channel`](super::keys::Keys::channel)) and starts its entry
/// and session ids.
pub(crate) fn channel_id(client_id: &str, n: u64) -> String {
    format!("{client_id}.{n}")
}

/// A fresh entry id of the handle `channel_id`, unique as the channel id is, with `n` from a
/// counter of the process (no random number, whose `getrandom` system call showed in the
/// client's profile).
pub(crate) fn new_entry_id(channel_id: &str) -> String {
    static NEXT_ENTRY: AtomicU64 = AtomicU64::new(0);
    let n = NEXT_ENTRY.fetch_add(1, Ordering::Relaxed);
    format!("{channel_id}-{n:x}")
}

/// The id of the session of the handle `channel_id` for leases of `lease_ms`.
pub fn session_id(channel_id: &str, lease_ms: u64) -> String {
    format!("{channel_id}~{lease_ms}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The forms `prelude.lua` takes apart (`sess_of`: the channel id before `~`).
    #[test]
    fn ids_have_the_documented_forms() {
        let c = channel_id("host:42:ab12", 3);
        assert_eq!(c, "host:42:ab12.3");
        assert_eq!(session_id(&c, 9000), "host:42:ab12.3~9000");
        let (a, b) = (new_entry_id(&c), new_entry_id(&c));
        assert!(a.starts_with("host:42:ab12.3-") && a != b, "{a} {b}");
        let prelude = include_str!("lua/prelude.lua");
        assert!(
            prelude.contains("(m.o or m.c) .. '~' .. (m.s and m.l or m.w)"),
            "the prelude's sess_of builds session ids as <channel id>~<lease ms>"
        );
    }
}
