//! A fault-injecting TCP proxy: put it between a client and a server to cut, stall, refuse
//! or slow down the connections.
//!
//! It runs its own single-threaded tokio runtime on a background thread, so its (synchronous)
//! controls work from plain tests and from inside any tokio runtime.

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};

/// A TCP proxy on `127.0.0.1:<random port>` forwarding to one upstream address.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    upstream: SocketAddr,
    blackhole: watch::Sender<bool>,
    refuse: AtomicBool,
    latency_us: AtomicU64,
    open: AtomicUsize,
    attempts: AtomicU64,
    next_id: AtomicU64,
    conns: Mutex<HashMap<u64, Conn>>,
}

/// An open connection: how to sever it, and a token that dies with its task.
type Conn = (oneshot::Sender<()>, Weak<()>);

impl FaultProxy {
    /// Starts forwarding every connection accepted on a fresh loopback port to `upstream`.
    pub fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = StdListener::bind("127.0.0.1:0").expect("proxy: cannot bind");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            upstream,
            blackhole: watch::Sender::new(false),
            refuse: AtomicBool::new(false),
            latency_us: AtomicU64::new(0),
            open: AtomicUsize::new(0),
            attempts: AtomicU64::new(0),
            next_id: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
        });
        let (shutdown, stop) = oneshot::channel();
        let state = shared.clone();
        let thread = thread::Builder::new()
            .name(format!("fault-proxy-{}", addr.port()))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("proxy: cannot build a runtime");
                rt.block_on(accept_loop(listener, state, stop));
            })
            .expect("proxy: cannot start its thread");
        FaultProxy {
            addr,
            shared,
            shutdown: Some(shutdown),
            thread: Some(thread),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://127.0.0.1:PROXYPORT/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.addr.port())
    }

    /// Closes every proxied connection now, with a TCP reset on both sides, and returns
    /// once they are closed. New connections are still accepted.
    pub fn sever_all(&self) {
        let conns: Vec<_> = self.shared.conns.lock().unwrap().drain().collect();
        let mut tokens = Vec::with_capacity(conns.len());
        for (_, (sever, token)) in conns {
            let _ = sever.send(());
            tokens.push(token);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while tokens.iter().any(|t| t.strong_count() > 0) {
            assert!(
                Instant::now() < deadline,
                "proxy: connections did not close"
            );
            thread::sleep(Duration::from_millis(2));
        }
    }

    /// While on, connections stay open but nothing is forwarded either way; bytes are held
    /// (as TCP would retransmit them) and delivered once it is turned off.
    pub fn blackhole(&self, on: bool) {
        self.shared.blackhole.send_replace(on);
    }

    /// While on, new connections are accepted and immediately reset.
    pub fn refuse_new(&self, on: bool) {
        self.shared.refuse.store(on, Ordering::SeqCst);
    }

    /// Delays every forwarded chunk by `delay`, in each direction.
    pub fn latency(&self, delay: Duration) {
        let us = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.shared.latency_us.store(us, Ordering::SeqCst);
    }

    /// Turns every fault off (open connections are kept).
    pub fn heal(&self) {
        self.blackhole(false);
        self.refuse_new(false);
        self.latency(Duration::ZERO);
    }

    /// How many proxied connections are open now.
    pub fn connections(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
    }

    /// How many connections clients have opened so far, refused ones included (to see
    /// whether a client reconnects, and how often).
    pub fn attempts(&self) -> u64 {
        self.shared.attempts.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        let _ = self.shutdown.take().map(|s| s.send(()));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn accept_loop(listener: StdListener, shared: Arc<Shared>, mut stop: oneshot::Receiver<()>) {
    let listener = TcpListener::from_std(listener).expect("proxy: cannot register the listener");
    loop {
        let client = tokio::select! {
            _ = &mut stop => return,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => client,
                Err(_) => continue,
            },
        };
        shared.attempts.fetch_add(1, Ordering::SeqCst);
        if shared.refuse.load(Ordering::SeqCst) {
            reset(&client);
            continue;
        }
        let (sever, severed) = oneshot::channel();
        let token = Arc::new(());
        let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
        shared
            .conns
            .lock()
            .unwrap()
            .insert(id, (sever, Arc::downgrade(&token)));
        shared.open.fetch_add(1, Ordering::SeqCst);
        let shared = shared.clone();
        tokio::spawn(async move {
            let _guard = Guard {
                shared: &shared,
                id,
                _token: token,
            };
            let _ = client.set_nodelay(true);
            proxy(client, &shared, severed).await;
        });
    }
}

/// Unregisters a connection when its task ends, however it ends.
struct Guard<'a> {
    shared: &'a Shared,
    id: u64,
    _token: Arc<()>,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.shared.conns.lock().unwrap().remove(&self.id);
        self.shared.open.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn proxy(client: TcpStream, shared: &Shared, mut severed: oneshot::Receiver<()>) {
    relay(client, shared.upstream, &mut severed, shared, Vec::new()).await;
}

impl Faults for Shared {
    fn latency(&self) -> Duration {
        Duration::from_micros(self.latency_us.load(Ordering::SeqCst))
    }

    async fn until_open(&self) {
        let mut rx = self.blackhole.subscribe();
        let _ = rx.wait_for(|on| !on).await;
    }
}

/// The faults a [`relay`] honours, as its proxy sets them.
pub trait Faults: Sync {
    /// Added to the time every chunk was read before it is written on.
    fn latency(&self) -> Duration;
    /// Returns once forwarding is allowed (not black-holed).
    fn until_open(&self) -> impl std::future::Future<Output = ()> + Send;
}

/// Connects to `upstream` and forwards `client` to it both ways, honouring `faults`, until
/// either side ends or `severed` fires (then both sockets are reset). `first`: bytes already
/// read from the client, forwarded first. Shared with the chaos runner's per-connection
/// proxy.
pub async fn relay(
    mut client: TcpStream,
    upstream: SocketAddr,
    severed: &mut oneshot::Receiver<()>,
    faults: &impl Faults,
    first: Vec<u8>,
) {
    let mut upstream = tokio::select! {
        _ = &mut *severed => return reset(&client),
        up = TcpStream::connect(upstream) => match up {
            Ok(up) => up,
            Err(_) => return reset(&client),
        },
    };
    let _ = upstream.set_nodelay(true);
    let cut = {
        let (cr, cw) = client.split();
        let (ur, uw) = upstream.split();
        // Servers never half-close: when the upstream side ends, the connection ends. When
        // the client half-closes, the upstream gets to answer before it closes.
        let relay = async {
            let down = pipe(ur, cw, faults, Vec::new());
            tokio::pin!(down);
            tokio::select! {
                _ = &mut down => {}
                up = pipe(cr, uw, faults, first) => if up.is_ok() {
                    let _ = down.await;
                }
            }
        };
        tokio::select! {
            _ = &mut *severed => true,
            _ = relay => false,
        }
    };
    if cut {
        reset(&client);
        reset(&upstream);
    }
}

/// Forwards `from` to `to` until EOF (then half-closes `to`), honouring the faults. `first`
/// is forwarded before anything read from `from`.
async fn pipe(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    faults: &impl Faults,
    first: Vec<u8>,
) -> io::Result<()> {
    let (tx, mut rx) = mpsc::channel::<(tokio::time::Instant, Vec<u8>)>(16);
    let read = async move {
        if !first.is_empty() && tx.send((tokio::time::Instant::now(), first)).await.is_err() {
            return Ok(());
        }
        let mut buf = vec![0; 16 * 1024];
        loop {
            faults.until_open().await;
            let n = from.read(&mut buf).await?;
            if n == 0
                || tx
                    .send((tokio::time::Instant::now(), buf[..n].to_vec()))
                    .await
                    .is_err()
            {
                return Ok::<_, io::Error>(());
            }
        }
    };
    let write = async move {
        while let Some((read_at, chunk)) = rx.recv().await {
            let delay = faults.latency();
            if !delay.is_zero() {
                tokio::time::sleep_until(read_at + delay).await;
            }
            faults.until_open().await;
            to.write_all(&chunk).await?;
        }
        to.shutdown().await
    };
    tokio::try_join!(read, write).map(|_| ())
}

/// Closes with RST instead of FIN (`SO_LINGER` 0) when the socket is dropped.
pub fn reset(stream: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on a socket we own, with a correctly sized option value.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}
