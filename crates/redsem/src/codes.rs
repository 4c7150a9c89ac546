//! What a Redis error means to redsem, decided once ([`Code::of`]): the one place that reads
//! error codes (and, for servers and versions that give none, error texts). Every retry,
//! permission and error decision matches on [`Code`]; no other code looks at error strings
//! to decide. (In the style of redis-rs's `ServerErrorKind`.)
//!
//! It sits at the bottom of the library, beside `error.rs`: the transport classifies
//! connection errors with it too. The `REDSEM_*` codes are the protocol's (docs/PROTOCOL.md,
//! "Errors").

use redis::{ErrorKind, RedisError};

/// The kinds of failure redsem tells apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Code {
    /// No answer, a dropped or refused connection, or a server that cannot serve now
    /// (`LOADING`, `BUSY`, `CLUSTERDOWN`, `MASTERDOWN`, `TRYAGAIN`, `READONLY`): worth
    /// retrying.
    Unavailable,
    /// A key of another type (`WRONGTYPE`).
    WrongType,
    /// A semaphore written under another protocol version (`REDSEM_PROTOCOL`).
    Protocol,
    /// Keys holding another program's data (`REDSEM_FOREIGN`).
    Foreign,
    /// Keys that contradict each other beyond repair (`REDSEM_CORRUPT`).
    Corrupt,
    /// The ACL refused a command, key or channel (`NOPERM`, and the texts of refusals
    /// inside scripts).
    NoPermission,
    /// The server needs a password (`NOAUTH`).
    NoAuth,
    /// Wrong user name or password, or a disabled user (`WRONGPASS`).
    WrongPass,
    /// The server does not know the script (`NOSCRIPT`): load it and send it again.
    NoScript,
    /// The server does not know the function (`Function not found`: the library of this
    /// version is not loaded there): load it and send the call again.
    NoFunction,
    /// Anything else.
    Other,
}

impl Code {
    /// The kind of `err`.
    pub(crate) fn of(err: &RedisError) -> Code {
        if err.is_timeout()
            || err.is_io_error()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || matches!(err.kind(), ErrorKind::ClusterConnectionNotFound)
        {
            return Code::Unavailable;
        }
        if matches!(err.kind(), ErrorKind::AuthenticationFailed) {
            return Code::WrongPass;
        }
        let text = err.to_string();
        Code::of_reply(err.code().unwrap_or(""), &text)
    }

    /// The kind of an error reply with `code` and `text` (a value in a pipeline's reply).
    pub(crate) fn of_reply(code: &str, text: &str) -> Code {
        let lower = text.to_ascii_lowercase();
        match code {
            "LOADING" | "BUSY" | "CLUSTERDOWN" | "MASTERDOWN" | "TRYAGAIN" | "READONLY" => {
                Code::Unavailable
            }
            "WRONGTYPE" => Code::WrongType,
            "REDSEM_PROTOCOL" => Code::Protocol,
            "REDSEM_FOREIGN" => Code::Foreign,
            "REDSEM_CORRUPT" => Code::Corrupt,
            "NOPERM" => Code::NoPermission,
            "NOAUTH" => Code::NoAuth,
            "WRONGPASS" => Code::WrongPass,
            "NOSCRIPT" => Code::NoScript,
            _ if text.contains("Function not found") => Code::NoFunction,
            // errors raised inside a script come with the script's code first (ERR): the
            // server's own code is in the text
            _ if text.contains("WRONGTYPE") => Code::WrongType,
            _ if text.contains("NOPERM")
                || lower.contains("no permissions")
                || lower.contains("acl failure")
                || lower.contains("can't run this command") =>
            {
                Code::NoPermission
            }
            _ if text.contains("NOAUTH") => Code::NoAuth,
            _ if text.contains("WRONGPASS") => Code::WrongPass,
            _ => Code::Other,
        }
    }
}

/// Whether `err`, the failure of a `FUNCTION LOAD`, means that the Functions library cannot be
/// loaded on this server (then redsem runs its scripts): the command is unknown (Redis before
/// 7.0, servers without functions) or refused (ACL, a managed service), the scripting engine
/// is missing, or the library does not load. Not a server that cannot serve now
/// ([`Code::Unavailable`]) or a failed login.
pub(crate) fn refuses_library(err: &RedisError) -> bool {
    !matches!(
        Code::of(err),
        Code::Unavailable | Code::NoAuth | Code::WrongPass
    )
}

/// Whether `err`, the failure of an `FCALL`/`FCALL_RO`, refuses the command itself (unknown
/// to the server, or not allowed by the ACL): the scripts may still be allowed. A refused key
/// or channel, which a script needs too, is not such a refusal.
/// (`code` and `text` as in [`Code::of_reply`].)
pub(crate) fn refuses_fcall(code: &str, text: &str) -> bool {
    refuses_command(code, text, "fcall")
}

/// [`refuses_fcall`] for the scripts' `EVALSHA`/`EVALSHA_RO`.
pub(crate) fn refuses_evalsha(code: &str, text: &str) -> bool {
    refuses_command(code, text, "evalsha")
}

/// Whether the error refuses the command `cmd` (or `<cmd>_ro`) itself: unknown, or denied.
fn refuses_command(code: &str, text: &str, cmd: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    let named = [format!("'{cmd}"), format!("`{cmd}")]
        .iter()
        .any(|c| lower.contains(c.as_str()));
    named && (Code::of_reply(code, text) == Code::NoPermission || lower.contains("unknown command"))
}

/// What an error raised by a redsem script says, without what Redis appends
/// (" script: <sha>, on @user_script:<line>.").
pub(crate) fn script_detail(err: &RedisError) -> String {
    let text = err.to_string();
    let detail = err.detail().unwrap_or(&text);
    detail
        .split(" script: ")
        .next()
        .unwrap_or(detail)
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_of_the_functions_library_are_told_apart() {
        assert_eq!(
            Code::of_reply("ERR", "Function not found"),
            Code::NoFunction
        );
        // the command itself: the scripts may be allowed
        assert!(refuses_fcall(
            "NOPERM",
            "User app has no permissions to run the 'fcall' command"
        ));
        assert!(refuses_fcall(
            "NOPERM",
            "User mon has no permissions to run the 'fcall_ro' command"
        ));
        assert!(refuses_fcall(
            "ERR",
            "unknown command 'FCALL', with args beginning with: 'redsem_x_acquire' "
        ));
        // a key or channel: a script needs it too
        assert!(!refuses_fcall(
            "NOPERM",
            "No permissions to access a key script: redsem_x_acquire, on @user_function:3."
        ));
        assert!(!refuses_fcall("WRONGTYPE", "Operation against a key"));
        assert!(refuses_evalsha(
            "NOPERM",
            "User app has no permissions to run the 'evalsha_ro' command"
        ));
        assert!(!refuses_evalsha(
            "NOPERM",
            "User app has no permissions to run the 'fcall' command"
        ));
        let io = RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, "t"));
        assert!(!refuses_library(&io));
    }

    #[test]
    fn codes_and_texts_are_read_once() {
        assert_eq!(Code::of_reply("WRONGTYPE", "x"), Code::WrongType);
        assert_eq!(Code::of_reply("REDSEM_PROTOCOL", "v2"), Code::Protocol);
        assert_eq!(Code::of_reply("READONLY", "replica"), Code::Unavailable);
        assert_eq!(
            Code::of_reply(
                "ERR",
                "Error running script: @user_script:3: The user executing the script can't run this command or subcommand"
            ),
            Code::NoPermission
        );
        assert_eq!(
            Code::of_reply(
                "ERR",
                "Error running script (call to f_x): WRONGTYPE Operation against a key"
            ),
            Code::WrongType
        );
        assert_eq!(
            Code::of_reply("NOSCRIPT", "No matching script"),
            Code::NoScript
        );
        assert_eq!(Code::of_reply("ERR", "unknown command"), Code::Other);
        let io = RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, "t"));
        assert_eq!(Code::of(&io), Code::Unavailable);
    }
}
