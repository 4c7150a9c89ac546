//! A tiny blocking RESP2 client: enough for readiness probes and test assertions.

use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// One RESP2 reply. Bulk strings are decoded lossily as UTF-8.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Nil,
    Int(i64),
    Bulk(String),
    Status(String),
    Error(String),
    Array(Vec<Reply>),
}

impl Reply {
    /// The integer of an `Int` reply.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Reply::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The text of a `Bulk` or `Status` reply.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Reply::Bulk(s) | Reply::Status(s) => Some(s),
            _ => None,
        }
    }

    /// The elements of an `Array` reply.
    pub fn as_array(&self) -> Option<&[Reply]> {
        match self {
            Reply::Array(items) => Some(items),
            _ => None,
        }
    }

    /// The message of an `Error` reply.
    pub fn as_error(&self) -> Option<&str> {
        match self {
            Reply::Error(e) => Some(e),
            _ => None,
        }
    }

    pub fn is_nil(&self) -> bool {
        matches!(self, Reply::Nil)
    }

    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    /// True for the `+OK` status reply.
    pub fn is_ok(&self) -> bool {
        matches!(self, Reply::Status(s) if s == "OK")
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Nil => f.write_str("(nil)"),
            Reply::Int(i) => write!(f, "(integer) {i}"),
            Reply::Bulk(s) => write!(f, "{s:?}"),
            Reply::Status(s) => f.write_str(s),
            Reply::Error(e) => write!(f, "(error) {e}"),
            Reply::Array(items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("]")
            }
        }
    }
}

/// A blocking connection speaking RESP2.
pub(crate) struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    pub(crate) fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<Conn> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            reader: BufReader::new(stream),
        })
    }

    pub(crate) fn call(&mut self, args: &[&str]) -> io::Result<Reply> {
        let mut buf = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            buf.extend_from_slice(a.as_bytes());
            buf.extend_from_slice(b"\r\n");
        }
        self.reader.get_mut().write_all(&buf)?;
        read_reply(&mut self.reader)
    }
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn read_line(r: &mut impl BufRead) -> io::Result<String> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed by the server",
        ));
    }
    if !line.ends_with("\r\n") {
        return Err(bad(format!("unterminated RESP line {line:?}")));
    }
    line.truncate(line.len() - 2);
    Ok(line)
}

fn read_reply(r: &mut impl BufRead) -> io::Result<Reply> {
    let line = read_line(r)?;
    let (kind, rest) = line.split_at(line.len().min(1));
    let int = || {
        rest.parse::<i64>()
            .map_err(|_| bad(format!("bad RESP integer in {line:?}")))
    };
    Ok(match kind {
        "+" => Reply::Status(rest.to_string()),
        "-" => Reply::Error(rest.to_string()),
        ":" => Reply::Int(int()?),
        "$" => match usize::try_from(int()?) {
            Err(_) => Reply::Nil,
            Ok(len) => {
                let mut data = vec![0; len + 2];
                r.read_exact(&mut data)?;
                data.truncate(len);
                Reply::Bulk(String::from_utf8_lossy(&data).into_owned())
            }
        },
        "*" => match usize::try_from(int()?) {
            Err(_) => Reply::Nil,
            Ok(n) => Reply::Array((0..n).map(|_| read_reply(r)).collect::<io::Result<_>>()?),
        },
        _ => return Err(bad(format!("unexpected RESP line {line:?}"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Reply {
        read_reply(&mut io::Cursor::new(s.as_bytes())).unwrap()
    }

    #[test]
    fn parses_every_resp2_reply_kind() {
        assert_eq!(parse("+OK\r\n"), Reply::Status("OK".into()));
        assert_eq!(parse("-ERR no\r\n"), Reply::Error("ERR no".into()));
        assert_eq!(parse(":-42\r\n"), Reply::Int(-42));
        assert_eq!(parse("$5\r\nhe\r\no\r\n"), Reply::Bulk("he\r\no".into()));
        assert_eq!(parse("$-1\r\n"), Reply::Nil);
        assert_eq!(parse("*-1\r\n"), Reply::Nil);
        assert_eq!(
            parse("*3\r\n:1\r\n$1\r\na\r\n*0\r\n"),
            Reply::Array(vec![
                Reply::Int(1),
                Reply::Bulk("a".into()),
                Reply::Array(vec![])
            ])
        );
    }

    #[test]
    fn rejects_garbage() {
        assert!(read_reply(&mut io::Cursor::new(&b"?x\r\n"[..])).is_err());
        assert!(read_reply(&mut io::Cursor::new(&b":12"[..])).is_err());
    }
}
