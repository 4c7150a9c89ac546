//! A fault-injecting TCP proxy for one worker's connections, which tells the command
//! connection from the pub/sub connection.
//!
//! A `redsem::Client` opens two connections to the one URL it is given: a RESP2 command
//! connection and a RESP3 subscriber connection. The proxy classifies every accepted
//! connection by its first bytes: the subscriber connection starts with `HELLO 3` (RESP3
//! negotiation), the command connection does not. That holds across reconnections too, so
//! faults can target either connection of a worker: cut (TCP reset on both sides), black-hole
//! (nothing forwarded, bytes held as TCP would retransmit them, delivered when it ends), added
//! latency, and refusal of new connections.
//!
//! (`test_support::FaultProxy` has the same faults for every connection at once; this one
//! adds the per-connection classes the chaos run needs, and forwards with the same
//! [`relay`].)

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use test_support::proxy::{Faults, relay, reset};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// Which of a client's two connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// The command connection (scripts).
    Cmd,
    /// The subscriber connection (grant notifications).
    Pubsub,
}

impl Class {
    fn index(self) -> usize {
        match self {
            Class::Cmd => 0,
            Class::Pubsub => 1,
        }
    }
}

/// An open connection: its class (once known), and how to sever it.
type Conn = (Option<Class>, Option<oneshot::Sender<()>>);

struct Shared {
    /// Where new connections go (re-pointed after a failover to a replica).
    upstream: Mutex<SocketAddr>,
    blackhole: [watch::Sender<bool>; 2],
    latency_us: AtomicU64,
    refuse: AtomicBool,
    next_id: AtomicU64,
    conns: Mutex<HashMap<u64, Conn>>,
}

/// A proxy on `127.0.0.1:<random port>` in front of one Redis, for one worker slot.
pub struct ClientProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl ClientProxy {
    /// Binds a fresh loopback port and starts forwarding to `upstream` (on the current tokio
    /// runtime).
    pub async fn start(upstream: SocketAddr) -> io::Result<ClientProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream: Mutex::new(upstream),
            blackhole: [watch::Sender::new(false), watch::Sender::new(false)],
            latency_us: AtomicU64::new(0),
            refuse: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(ClientProxy {
            addr,
            shared,
            accept,
        })
    }

    /// `redis://127.0.0.1:<port>/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.addr.port())
    }

    /// Sends the connections accepted from now on to `upstream` (a promoted replica); the
    /// open ones are left to fail with the server they were connected to.
    pub fn set_upstream(&self, upstream: SocketAddr) {
        *self.shared.upstream.lock().unwrap() = upstream;
    }

    /// Resets every open connection of `class`; returns how many there were.
    pub fn cut(&self, class: Class) -> usize {
        let mut conns = self.shared.conns.lock().unwrap();
        let mut n = 0;
        for (c, sever) in conns.values_mut() {
            if *c == Some(class)
                && let Some(s) = sever.take()
            {
                let _ = s.send(());
                n += 1;
            }
        }
        n
    }

    /// While on, nothing is forwarded either way on connections of `class`.
    pub fn blackhole(&self, class: Class, on: bool) {
        self.shared.blackhole[class.index()].send_replace(on);
    }

    /// Delays every forwarded chunk by `delay`, both ways, on both connections.
    pub fn latency(&self, delay: Duration) {
        self.shared
            .latency_us
            .store(delay.as_micros() as u64, Ordering::SeqCst);
    }

    /// While on, new connections are reset at once.
    pub fn refuse_new(&self, on: bool) {
        self.shared.refuse.store(on, Ordering::SeqCst);
    }

    /// Turns every fault off (open connections are kept).
    pub fn heal(&self) {
        self.blackhole(Class::Cmd, false);
        self.blackhole(Class::Pubsub, false);
        self.latency(Duration::ZERO);
        self.refuse_new(false);
    }

    /// Open connections per class: `(command, pub/sub, not yet classified)`.
    pub fn connections(&self) -> (usize, usize, usize) {
        let conns = self.shared.conns.lock().unwrap();
        let count = |c: Option<Class>| conns.values().filter(|(k, _)| *k == c).count();
        (
            count(Some(Class::Cmd)),
            count(Some(Class::Pubsub)),
            count(None),
        )
    }
}

impl Drop for ClientProxy {
    fn drop(&mut self) {
        self.accept.abort();
        for (_, sever) in self.shared.conns.lock().unwrap().values_mut() {
            if let Some(s) = sever.take() {
                let _ = s.send(());
            }
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if shared.refuse.load(Ordering::SeqCst) {
            reset(&client);
            continue;
        }
        let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
        let (sever, severed) = oneshot::channel();
        shared.conns.lock().unwrap().insert(id, (None, Some(sever)));
        let shared = shared.clone();
        tokio::spawn(async move {
            let _ = client.set_nodelay(true);
            serve(client, &shared, id, severed).await;
            shared.conns.lock().unwrap().remove(&id);
        });
    }
}

/// The subscriber connection's first command is `HELLO 3`.
fn classify(first: &[u8]) -> Class {
    if first.windows(5).any(|w| w.eq_ignore_ascii_case(b"HELLO")) {
        Class::Pubsub
    } else {
        Class::Cmd
    }
}

async fn serve(
    mut client: TcpStream,
    shared: &Shared,
    id: u64,
    mut severed: oneshot::Receiver<()>,
) {
    // `*2\r\n$5\r\nHELLO` is 14 bytes: read at least that much before deciding
    let mut first = Vec::new();
    let mut buf = [0u8; 4096];
    while first.len() < 14 {
        let n = tokio::select! {
            _ = &mut severed => return reset(&client),
            r = client.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
        };
        first.extend_from_slice(&buf[..n]);
    }
    let class = classify(&first);
    if let Some(c) = shared.conns.lock().unwrap().get_mut(&id) {
        c.0 = Some(class);
    }
    let faults = ClassFaults { shared, class };
    let upstream = *shared.upstream.lock().unwrap();
    relay(client, upstream, &mut severed, &faults, first).await;
}

/// The faults of one connection: those of its class.
struct ClassFaults<'a> {
    shared: &'a Shared,
    class: Class,
}

impl Faults for ClassFaults<'_> {
    fn latency(&self) -> Duration {
        Duration::from_micros(self.shared.latency_us.load(Ordering::SeqCst))
    }

    async fn until_open(&self) {
        let mut rx = self.shared.blackhole[self.class.index()].subscribe();
        let _ = rx.wait_for(|on| !on).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subscriber_connection_is_told_apart_by_hello() {
        assert_eq!(classify(b"*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n"), Class::Pubsub);
        assert_eq!(
            classify(b"*4\r\n$6\r\nCLIENT\r\n$7\r\nSETINFO\r\n"),
            Class::Cmd
        );
    }
}
