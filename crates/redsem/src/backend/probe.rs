//! Why a connection failed, in words: after a failed connect, one short probe of the server
//! tells a plaintext Redis from a TLS port, and Redis from something else (an HTTP server,
//! a database of another kind), so that the error says what to change in the URL instead of
//! "parse error" or "timed out".
//!
//! A probe is one TCP connection that sends one request and reads the first bytes of the
//! answer, for at most [`PROBE_TIME`]. It is made only after a connect failed with an error
//! that a wrong endpoint explains (a reply that is not RESP, a connection reset or closed
//! at once, a TLS handshake that got no answer); never on success, never after a refusal.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest time a probe takes (connect, send, read).
pub(super) const PROBE_TIME: Duration = Duration::from_secs(1);

/// `PING` in RESP: a Redis server answers `+PONG`, `-NOAUTH ...` or `-ERR ...`.
const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";

/// The start of a TLS 1.2 ClientHello record (no extensions, a few common cipher suites).
/// Any TLS server answers it with a handshake record (0x16) or an alert (0x15), both
/// starting with version byte 0x03; nothing else does.
const CLIENT_HELLO: &[u8] = &[
    0x16, 0x03, 0x01, 0x00, 0x35, // record: handshake, TLS 1.0 framing, 53 bytes
    0x01, 0x00, 0x00, 0x31, // ClientHello, 49 bytes
    0x03, 0x03, // TLS 1.2
    0x52, 0x45, 0x44, 0x53, 0x45, 0x4d, 0x20, 0x70, 0x72, 0x6f, 0x62, 0x65, 0x20, 0x72, 0x61, 0x6e,
    0x64, 0x6f, 0x6d, 0x20, 0x62, 0x79, 0x74, 0x65, 0x73, 0x20, 0x2e, 0x2e, 0x2e, 0x2e, 0x2e,
    0x2e, // 32 "random" bytes
    0x00, // no session id
    0x00, 0x08, 0xc0, 0x2f, 0xc0, 0x2b, 0x00, 0x9c, 0x13, 0x01, // 4 cipher suites
    0x01, 0x00, // no compression
    0x00, 0x00, // no extensions
];

/// What the server at the probed address did with a probe.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Answer {
    /// It answered in RESP: a Redis (or Valkey) server, without TLS. The first line.
    Redis(String),
    /// It answered a ClientHello with a TLS record: it expects TLS.
    Tls,
    /// It answered with something else: not Redis. The first line, printable, shortened.
    Other(String),
    /// No answer in time, or the connection could not be made or was closed at once.
    Nothing,
}

/// Sends `PING` in plaintext to `host:port` and says what answered.
pub(super) async fn plain(host: &str, port: u16) -> Answer {
    classify(&exchange(host, port, PING).await)
}

/// Sends a TLS ClientHello to `host:port` and says whether a TLS server answered.
pub(super) async fn tls(host: &str, port: u16) -> Answer {
    let reply = exchange(host, port, CLIENT_HELLO).await;
    if reply.len() >= 2 && matches!(reply[0], 0x15 | 0x16) && reply[1] == 0x03 {
        Answer::Tls
    } else {
        classify(&reply)
    }
}

/// The first bytes the server sends back after `request` (empty when nothing came).
async fn exchange(host: &str, port: u16, request: &[u8]) -> Vec<u8> {
    let talk = async {
        let mut s = TcpStream::connect((host, port)).await?;
        s.write_all(request).await?;
        let mut buf = vec![0u8; 512];
        let n = s.read(&mut buf).await?;
        buf.truncate(n);
        Ok::<_, std::io::Error>(buf)
    };
    match tokio::time::timeout(PROBE_TIME, talk).await {
        Ok(Ok(bytes)) => bytes,
        _ => Vec::new(),
    }
}

fn classify(reply: &[u8]) -> Answer {
    if reply.is_empty() {
        return Answer::Nothing;
    }
    let line = first_line(reply);
    // a RESP2/RESP3 reply to PING: +PONG, -ERR..., -NOAUTH..., or a bulk/push/verbatim
    let resp = matches!(reply[0], b'+' | b'-')
        || (matches!(reply[0], b'$' | b'*' | b'%' | b'>' | b'=')
            && reply[1..].iter().take_while(|b| b.is_ascii_digit()).count() > 0);
    if resp {
        Answer::Redis(line)
    } else {
        Answer::Other(line)
    }
}

/// The first line of `reply`, printable ASCII only, at most 60 characters.
fn first_line(reply: &[u8]) -> String {
    let line = reply
        .split(|&b| b == b'\n' || b == b'\r')
        .next()
        .unwrap_or(reply);
    let mut text: String = line
        .iter()
        .map(|&b| {
            if (0x20..0x7f).contains(&b) {
                b as char
            } else {
                '?'
            }
        })
        .collect();
    if text.len() > 60 {
        text.truncate(59);
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_told_apart() {
        assert_eq!(classify(b"+PONG\r\n"), Answer::Redis("+PONG".into()));
        assert!(matches!(
            classify(b"-NOAUTH Authentication required.\r\n"),
            Answer::Redis(_)
        ));
        assert_eq!(
            classify(b"HTTP/1.0 400 Bad request\r\nServer: x\r\n"),
            Answer::Other("HTTP/1.0 400 Bad request".into())
        );
        assert_eq!(
            classify(b"\x00\x01binary"),
            Answer::Other("??binary".into())
        );
        assert_eq!(classify(b""), Answer::Nothing);
        assert_eq!(first_line(&[b'a'; 100]).chars().count(), 60);
        assert_eq!(CLIENT_HELLO.len(), 5 + 0x35);
        assert_eq!(CLIENT_HELLO.len(), 5 + 4 + 0x31);
    }
}
