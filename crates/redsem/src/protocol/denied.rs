//! Permission refusals explained: what the Redis user may not do, in words.
//!
//! Redis and Valkey do not always say: inside a script, Redis 7.0 reports "can't run this
//! command" with the script's line number only, and neither names a refused key or channel.
//! The line number points into the script's source, which names the command; the keys and
//! the channels are those of the semaphore. The result is a typed
//! [`CallError::Denied`], which becomes [`Error::NoPermission`](crate::Error::NoPermission).

use redis::RedisError;

use crate::codes::Code;
use crate::error::CallError;
use crate::protocol::keys::Keys;

/// Rewrites an ACL refusal of the script `script` (named `name`) on `keys` so that it names
/// what the user lacks; any other error is passed on.
pub(super) fn script(
    e: RedisError,
    name: &str,
    source: &str,
    keys: &Keys,
    publish: &str,
) -> CallError {
    let text = e.to_string();
    let lower = text.to_ascii_lowercase();
    if Code::of(&e) != Code::NoPermission {
        return CallError::Redis(e);
    }
    let key_pattern = format!("{}*", keys.channel_base.trim_end_matches("c:"));
    let channels = format!("{}*", keys.channel_base);
    let in_script = line_of(&text)
        .and_then(|n| source.lines().nth(n.saturating_sub(1)))
        .map(str::trim);
    // Valkey names the command ('hget'); Redis 7.0 inside a script only gives the line
    let on_line = in_script
        .map(|line| called_commands(line, publish))
        .unwrap_or_default();
    let named = quoted_command(&text).map(str::to_ascii_uppercase);
    let what = if lower.contains("channel") {
        format!("publish to or subscribe to the channels {channels:?} ({publish})")
    } else if lower.contains("key") {
        format!(
            "access the keys of semaphore {:?} ({key_pattern:?})",
            keys.name
        )
    } else if let Some(cmd) = &named {
        format!("run the command {cmd}")
    } else if on_line.len() == 1 {
        format!("run the command {}", on_line[0])
    } else if !on_line.is_empty() {
        format!("run one of the commands {}", on_line.join(", "))
    } else {
        "run a command redsem needs".to_owned()
    };
    let place = if in_script.is_some() {
        format!(" (inside redsem's {name} script)")
    } else {
        String::new()
    };
    CallError::Denied(format!(
        "the Redis user may not {what}{place}; Redis said: {}",
        text.trim()
    ))
}

/// The line number in "... @user_script:12 ..." (Redis) / "... @user_script:12." (Valkey), or
/// "... @user_function:12 ..." (a function of the library: a line of the library's text).
fn line_of(text: &str) -> Option<usize> {
    let at = ["@user_script:", "@user_function:"]
        .iter()
        .find_map(|m| text.find(m).map(|at| at + m.len()))?;
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The commands a script line calls: `redis.call('HGET', ...)` → `HGET`;
/// `redis.call(PUB, ...)` → the publish command.
fn called_commands(line: &str, publish: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for call in line.split("redis.call(").skip(1) {
        let cmd = match call.strip_prefix('\'') {
            Some(rest) => rest
                .split('\'')
                .next()
                .unwrap_or_default()
                .to_ascii_uppercase(),
            None if call.starts_with("PUB") => publish.to_owned(),
            None => continue,
        };
        if !cmd.is_empty() && !out.contains(&cmd) {
            out.push(cmd);
        }
    }
    out
}

/// `'script|load'` in "... no permissions to run the 'script|load' command".
fn quoted_command(text: &str) -> Option<&str> {
    let start = text.find("run the '")? + "run the '".len();
    let len = text[start..].find('\'')?;
    Some(&text[start..start + len])
}

/// Rewrites a refused `SUBSCRIBE` of `channel` so that it names what is missing: the channel
/// pattern, or the command; any other error is passed on.
pub(crate) fn subscription(e: RedisError, channel: &str) -> CallError {
    if Code::of(&e) != Code::NoPermission {
        return CallError::Redis(e);
    }
    let text = e.to_string();
    if !text.to_ascii_lowercase().contains("channel") {
        let command = text
            .split('\'')
            .nth(1)
            .map_or("SUBSCRIBE".to_owned(), str::to_ascii_uppercase);
        return CallError::Denied(format!(
            "the Redis user may not run the command {command}; Redis said: {text}"
        ));
    }
    let pattern = channel
        .find("}:c:")
        .map_or(channel.to_owned(), |i| format!("{}*", &channel[..i + 4]));
    CallError::Denied(format!(
        "the Redis user may not subscribe to the channel {channel:?} (the pattern \
         {pattern:?} must be allowed); Redis said: {text}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_script_lines_name_their_commands() {
        assert_eq!(
            line_of("ERR ... script: abc, on @user_script:12."),
            Some(12)
        );
        assert_eq!(
            line_of("ERR ACL failure in script: x script: on @user_script:7."),
            Some(7)
        );
        assert_eq!(
            line_of("ERR ... script: redsem_0123456789ab_renew, on @user_function:940."),
            Some(940)
        );
        assert_eq!(
            called_commands(
                "redis.call('HLEN', K_CFG); redis.call('ZCARD', K_QUEUE)",
                "PUBLISH"
            ),
            vec!["HLEN", "ZCARD"]
        );
        assert_eq!(
            called_commands("redis.call(PUB, CH_BASE .. c, msg)", "SPUBLISH"),
            vec!["SPUBLISH"]
        );
        assert_eq!(
            quoted_command("NOPERM User u has no permissions to run the 'script|load' command"),
            Some("script|load")
        );
    }
}
