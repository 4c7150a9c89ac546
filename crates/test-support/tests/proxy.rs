use std::io::{self, BufRead, BufReader, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use test_support::{FaultProxy, Flavor, Server};

/// A raw client speaking inline commands through the proxy.
struct Client(BufReader<TcpStream>);

impl Client {
    fn connect(proxy: &FaultProxy) -> Client {
        let s = TcpStream::connect(proxy.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        Client(BufReader::new(s))
    }

    fn send(&mut self, line: &str) -> io::Result<()> {
        self.0.get_mut().write_all(format!("{line}\r\n").as_bytes())
    }

    fn read(&mut self, timeout: Duration) -> io::Result<String> {
        self.0.get_ref().set_read_timeout(Some(timeout))?;
        let mut line = String::new();
        if self.0.read_line(&mut line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        Ok(line.trim_end().to_string())
    }

    fn ping(&mut self) -> String {
        self.send("PING").unwrap();
        self.read(Duration::from_secs(5)).unwrap()
    }

    /// Whether the connection is closed (EOF or reset) rather than merely silent.
    fn closed(&mut self) -> io::Result<bool> {
        let _ = self.send("PING");
        match self.read(Duration::from_secs(2)) {
            Ok(_) => Ok(false),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Ok(false)
            }
            Err(e) => {
                let reset = e.kind() == io::ErrorKind::ConnectionReset;
                Ok(reset || e.kind() == io::ErrorKind::UnexpectedEof)
            }
        }
    }
}

fn silent(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        thread::sleep(Duration::from_millis(10));
    }
    cond()
}

fn setup() -> (Server, FaultProxy) {
    let server = Server::start(Flavor::Redis);
    let proxy = FaultProxy::start(server.addr());
    (server, proxy)
}

#[test]
fn forwards_commands_and_replies() {
    let (server, proxy) = setup();
    assert_eq!(
        proxy.url(),
        format!("redis://127.0.0.1:{}/", proxy.addr().port())
    );
    let mut c = Client::connect(&proxy);
    assert_eq!(c.ping(), "+PONG");
    c.send("SET via proxy").unwrap();
    assert_eq!(c.read(Duration::from_secs(5)).unwrap(), "+OK");
    assert_eq!(server.cmd(&["GET", "via"]).as_str(), Some("proxy"));
}

#[test]
fn counts_the_connections_open_now() {
    let (_server, proxy) = setup();
    assert_eq!(proxy.connections(), 0);
    let mut clients: Vec<Client> = (0..3).map(|_| Client::connect(&proxy)).collect();
    for c in &mut clients {
        assert_eq!(c.ping(), "+PONG");
    }
    assert_eq!(proxy.connections(), 3);
    clients.pop();
    assert!(eventually(|| proxy.connections() == 2));
    drop(clients);
    assert!(eventually(|| proxy.connections() == 0));
}

#[test]
fn sever_all_resets_open_connections_and_still_accepts_new_ones() {
    let (server, proxy) = setup();
    let mut old: Vec<Client> = (0..2).map(|_| Client::connect(&proxy)).collect();
    for c in &mut old {
        assert_eq!(c.ping(), "+PONG");
    }
    proxy.sever_all();
    assert_eq!(proxy.connections(), 0);
    for c in &mut old {
        assert!(c.closed().unwrap());
    }
    // The server saw its side go away too.
    assert!(eventually(|| {
        let clients = server.cmd(&["CLIENT", "LIST"]);
        clients.as_str().unwrap().lines().count() == 1
    }));
    let mut new = Client::connect(&proxy);
    assert_eq!(new.ping(), "+PONG");
}

#[test]
fn blackhole_stalls_traffic_without_closing_and_delivers_it_afterwards() {
    let (_server, proxy) = setup();
    let mut c = Client::connect(&proxy);
    assert_eq!(c.ping(), "+PONG");
    proxy.blackhole(true);
    c.send("PING").unwrap();
    let stalled = c.read(Duration::from_millis(400)).unwrap_err();
    assert!(silent(&stalled), "{stalled:?}");
    // New connections are stalled too.
    let mut late = Client::connect(&proxy);
    late.send("PING").unwrap();
    assert!(silent(&late.read(Duration::from_millis(200)).unwrap_err()));
    assert!(eventually(|| proxy.connections() == 2));
    proxy.blackhole(false);
    assert_eq!(c.read(Duration::from_secs(5)).unwrap(), "+PONG");
    assert_eq!(late.read(Duration::from_secs(5)).unwrap(), "+PONG");
    assert_eq!(c.ping(), "+PONG");
}

#[test]
fn refuse_new_closes_new_connections_but_keeps_open_ones() {
    let (_server, proxy) = setup();
    let mut open = Client::connect(&proxy);
    assert_eq!(open.ping(), "+PONG");
    proxy.refuse_new(true);
    let mut refused = Client::connect(&proxy);
    assert!(refused.closed().unwrap());
    assert_eq!(open.ping(), "+PONG");
    assert_eq!(proxy.connections(), 1);
    proxy.refuse_new(false);
    assert_eq!(Client::connect(&proxy).ping(), "+PONG");
}

#[test]
fn latency_delays_each_direction() {
    let (_server, proxy) = setup();
    let mut c = Client::connect(&proxy);
    assert_eq!(c.ping(), "+PONG");
    let latency = Duration::from_millis(500);
    proxy.latency(latency);
    let started = Instant::now();
    assert_eq!(c.ping(), "+PONG");
    let rtt = started.elapsed();
    assert!(rtt >= latency * 2, "round trip {rtt:?}");
    assert!(rtt < Duration::from_secs(5), "round trip {rtt:?}");
    proxy.heal();
    // healed: faster than the latency of either direction alone
    let started = Instant::now();
    assert_eq!(c.ping(), "+PONG");
    let rtt = started.elapsed();
    assert!(rtt < latency, "round trip after healing {rtt:?}");
}

/// Each chunk is delayed by the latency from the moment it was read, not from the moment
/// the previous one was written: N pipelined requests take about one round trip plus the
/// time to send them, not N latencies. The bound (N/2 latencies) is generous for a loaded
/// machine yet fails if the delays add up (at least N latencies upstream alone).
#[test]
fn latency_does_not_accumulate_over_pipelined_chunks() {
    const PINGS: u32 = 20;
    let latency = Duration::from_millis(200);
    let (_server, proxy) = setup();
    let mut c = Client::connect(&proxy);
    proxy.latency(latency);
    let started = Instant::now();
    for _ in 0..PINGS {
        c.send("PING").unwrap();
        thread::sleep(Duration::from_millis(10)); // one chunk each
    }
    for _ in 0..PINGS {
        assert_eq!(c.read(Duration::from_secs(10)).unwrap(), "+PONG");
    }
    let took = started.elapsed();
    assert!(
        took < latency * PINGS / 2,
        "{PINGS} pipelined pings took {took:?}, accumulating {latency:?} per chunk would take {:?}",
        latency * PINGS
    );
}

#[test]
fn a_dead_upstream_closes_client_connections_until_it_is_back() {
    let (mut server, proxy) = setup();
    let mut c = Client::connect(&proxy);
    assert_eq!(c.ping(), "+PONG");
    server.kill();
    assert!(c.closed().unwrap());
    assert!(Client::connect(&proxy).closed().unwrap());
    assert!(eventually(|| proxy.connections() == 0));
    server.restart();
    assert_eq!(Client::connect(&proxy).ping(), "+PONG");
}

#[test]
fn dropping_the_proxy_closes_its_connections() {
    let (_server, proxy) = setup();
    let mut c = Client::connect(&proxy);
    assert_eq!(c.ping(), "+PONG");
    let addr = proxy.addr();
    drop(proxy);
    assert!(c.closed().unwrap());
    assert!(TcpStream::connect(addr).is_err());
}

#[tokio::test]
async fn works_from_inside_a_tokio_runtime() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let (_server, proxy) = setup();
    let stream = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    let mut stream = tokio::io::BufReader::new(stream);
    stream.write_all(b"PING\r\n").await.unwrap();
    let mut line = String::new();
    stream.read_line(&mut line).await.unwrap();
    assert_eq!(line, "+PONG\r\n");
    proxy.sever_all();
    line.clear();
    let read = tokio::time::timeout(Duration::from_secs(2), stream.read_line(&mut line)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
}
