//! A fault-injecting TCP proxy that tests put between the gateway and a
//! worker, so network faults are played without touching the host's
//! network: added latency, a bandwidth cap, resets of every open connection,
//! and a black hole (nothing is forwarded either way until it lifts, as in a
//! partition: bytes wait, connections stay open).
//!
//! It runs on the test's tokio runtime. Faults apply at once to open
//! connections and to new ones.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does to the bytes it forwards.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Faults {
    /// Every chunk waits this long before it is forwarded.
    pub latency: Duration,
    /// At most this many bytes per second per direction and connection.
    pub bytes_per_sec: Option<u64>,
    /// Nothing is forwarded (new connections are accepted, then wait).
    pub black_hole: bool,
}

/// A proxy to one upstream address; stops when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    pub addr: SocketAddr,
    faults: watch::Sender<Faults>,
    /// Bumped by [`FaultProxy::reset_all`]; each connection watches it.
    resets: watch::Sender<u64>,
    accepted: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on an ephemeral loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (faults, _) = watch::channel(Faults::default());
        let (resets, _) = watch::channel(0u64);
        let accepted = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(accept_loop(
            listener,
            upstream,
            faults.subscribe(),
            resets.subscribe(),
            Arc::clone(&accepted),
            Arc::clone(&open),
        ));
        FaultProxy {
            addr,
            faults,
            resets,
            accepted,
            open,
            task,
        }
    }

    /// `grpc://127.0.0.1:PORT`, the URL the gateway dials.
    pub fn grpc_url(&self) -> String {
        format!("grpc://{}", self.addr)
    }

    pub fn set(&self, faults: Faults) {
        self.faults.send_replace(faults);
    }

    pub fn black_hole(&self, on: bool) {
        self.faults.send_modify(|faults| faults.black_hole = on);
    }

    /// Resets every open connection (TCP RST to both sides).
    pub fn reset_all(&self) {
        self.resets.send_modify(|n| *n += 1);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.reset_all();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    faults: watch::Receiver<Faults>,
    resets: watch::Receiver<u64>,
    accepted: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
) {
    while let Ok((client, _)) = listener.accept().await {
        accepted.fetch_add(1, Ordering::Relaxed);
        let (faults, mut resets) = (faults.clone(), resets.clone());
        let open = Arc::clone(&open);
        tokio::spawn(async move {
            resets.mark_unchanged();
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            let _ = (client.set_nodelay(true), server.set_nodelay(true));
            open.fetch_add(1, Ordering::Relaxed);
            let _ = (client.set_zero_linger(), server.set_zero_linger());
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::select! {
                () = pump(client_read, server_write, faults.clone()) => {}
                () = pump(server_read, client_write, faults) => {}
                _ = resets.changed() => {}
            }
            // Zero linger: dropping both sockets resets them.
            open.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// Copies `from` to `to` under the current faults until either side ends.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut faults: watch::Receiver<Faults>,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        let now = *faults.borrow_and_update();
        if now.black_hole && faults.wait_for(|faults| !faults.black_hole).await.is_err() {
            return;
        }
        let now = *faults.borrow();
        if !now.latency.is_zero() {
            tokio::time::sleep(now.latency).await;
        }
        if let Some(rate) = now.bytes_per_sec.filter(|&rate| rate > 0) {
            tokio::time::sleep(Duration::from_secs_f64(read as f64 / rate as f64)).await;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}
