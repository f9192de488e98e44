//! The disaggregation rendezvous, over real TCP like the engines' own.
//!
//! A prefill worker publishes each request's (simulated) KV cache under its
//! room and decode fetches it from the prefill worker's bootstrap port; an
//! encode worker publishes each item's embedding under the item's room and
//! prefill fetches it from the encode worker's bootstrap port. A fetch waits
//! until the producer publishes, up to a deadline, so either side may arrive
//! first. A published value is handed out once and forgotten after a TTL if
//! nobody comes for it.
//!
//! Protocol, one request per connection, text lines:
//! `FETCH <room> <timeout_ms>\n` → `OK <64 hex digits>\n` or `ERR <reason>\n`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A room's payload: a 32-byte fingerprint (see `digest`).
pub type Payload = [u8; 32];

/// How long an unfetched payload is kept.
const PAYLOAD_TTL: Duration = Duration::from_secs(120);

#[derive(Debug)]
struct Slot {
    sender: watch::Sender<Option<Payload>>,
    created: Instant,
}

/// Rooms published by this worker, waiting to be fetched.
#[derive(Debug, Default, Clone)]
pub struct RoomStore {
    rooms: Arc<Mutex<HashMap<i64, Slot>>>,
}

impl RoomStore {
    fn lock(&self) -> MutexGuard<'_, HashMap<i64, Slot>> {
        self.rooms.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on `room`'s slot, creating it if needed; expired slots are
    /// dropped on the way.
    fn with_slot<T>(&self, room: i64, f: impl FnOnce(&Slot) -> T) -> T {
        let mut rooms = self.lock();
        let now = Instant::now();
        rooms.retain(|_, slot| now.duration_since(slot.created) < PAYLOAD_TTL);
        let slot = rooms.entry(room).or_insert_with(|| Slot {
            sender: watch::channel(None).0,
            created: now,
        });
        f(slot)
    }

    /// Makes `payload` available under `room`, waking a waiting fetch.
    pub fn publish(&self, room: i64, payload: Payload) {
        self.with_slot(room, |slot| slot.sender.send_replace(Some(payload)));
    }

    /// Waits up to `timeout` for `room` and takes its payload.
    pub async fn take(&self, room: i64, timeout: Duration) -> Option<Payload> {
        let mut receiver = self.with_slot(room, |slot| slot.sender.subscribe());
        let waited = tokio::time::timeout(timeout, receiver.wait_for(Option::is_some)).await;
        let payload = match waited {
            Ok(Ok(value)) => *value,
            _ => None,
        };
        let mut rooms = self.lock();
        let unclaimed = rooms.get(&room).is_some_and(|slot| {
            // Only our receiver is left and nothing was published: drop it.
            slot.sender.borrow().is_none() && slot.sender.receiver_count() <= 1
        });
        if payload.is_some() || unclaimed {
            rooms.remove(&room);
        }
        payload
    }

    /// Rooms currently held (published or awaited).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().len()
    }
}

/// Serves `FETCH` requests for `store` until the process ends.
pub async fn serve(listener: TcpListener, store: RoomStore, max_wait: Duration) {
    loop {
        let Ok((socket, _peer)) = listener.accept().await else {
            continue;
        };
        let store = store.clone();
        tokio::spawn(async move {
            if let Err(err) = answer(socket, store, max_wait).await {
                tracing::debug!(%err, "bootstrap connection ended");
            }
        });
    }
}

async fn answer(socket: TcpStream, store: RoomStore, max_wait: Duration) -> std::io::Result<()> {
    let (read, mut write) = socket.into_split();
    let mut line = String::new();
    BufReader::new(read).read_line(&mut line).await?;
    let reply = match parse_fetch(&line) {
        Ok((room, wait)) => match store.take(room, wait.min(max_wait)).await {
            Some(payload) => format!("OK {}\n", hex(&payload)),
            None => format!(
                "ERR room {room} was not published within {} ms\n",
                wait.as_millis()
            ),
        },
        Err(reason) => format!("ERR {reason}\n"),
    };
    write.write_all(reply.as_bytes()).await?;
    write.shutdown().await
}

fn parse_fetch(line: &str) -> Result<(i64, Duration), String> {
    let mut words = line.split_whitespace();
    match (words.next(), words.next(), words.next(), words.next()) {
        (Some("FETCH"), Some(room), Some(wait_ms), None) => {
            let room = room.parse().map_err(|_| format!("bad room {room:?}"))?;
            let wait_ms: u64 = wait_ms
                .parse()
                .map_err(|_| format!("bad timeout {wait_ms:?}"))?;
            Ok((room, Duration::from_millis(wait_ms)))
        }
        _ => Err(format!("malformed request {:?}", line.trim_end())),
    }
}

/// Why a fetch from a peer's bootstrap server failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("bootstrap peer {peer} unreachable: {source}")]
    Unreachable {
        peer: String,
        source: std::io::Error,
    },
    #[error("bootstrap peer {peer} did not deliver room {room} within {waited_ms} ms")]
    Timeout {
        peer: String,
        room: i64,
        waited_ms: u128,
    },
    #[error("bootstrap peer {peer} refused room {room}: {reason}")]
    Refused {
        peer: String,
        room: i64,
        reason: String,
    },
}

/// Fetches `room` from the bootstrap server at `host:port`, waiting at most
/// `timeout` for the producer to publish it.
pub async fn fetch(
    host: &str,
    port: u16,
    room: i64,
    timeout: Duration,
) -> Result<Payload, FetchError> {
    let peer = format!("{host}:{port}");
    let exchange = async {
        let mut socket =
            TcpStream::connect(&peer)
                .await
                .map_err(|source| FetchError::Unreachable {
                    peer: peer.clone(),
                    source,
                })?;
        socket
            .write_all(format!("FETCH {room} {}\n", timeout.as_millis()).as_bytes())
            .await
            .map_err(|source| FetchError::Unreachable {
                peer: peer.clone(),
                source,
            })?;
        let mut line = String::new();
        BufReader::new(socket)
            .read_line(&mut line)
            .await
            .map_err(|source| FetchError::Unreachable {
                peer: peer.clone(),
                source,
            })?;
        parse_reply(&line).map_err(|reason| FetchError::Refused {
            peer: peer.clone(),
            room,
            reason,
        })
    };
    // The server gives up at `timeout` too; allow it a moment to say so.
    match tokio::time::timeout(timeout + Duration::from_millis(250), exchange).await {
        Ok(result) => result,
        Err(_) => Err(FetchError::Timeout {
            peer,
            room,
            waited_ms: timeout.as_millis(),
        }),
    }
    .map_err(|err| match err {
        FetchError::Refused { peer, room, reason } if reason.contains("not published") => {
            FetchError::Timeout {
                peer,
                room,
                waited_ms: timeout.as_millis(),
            }
        }
        other => other,
    })
}

fn parse_reply(line: &str) -> Result<Payload, String> {
    let line = line.trim_end();
    if let Some(reason) = line.strip_prefix("ERR ") {
        return Err(reason.to_owned());
    }
    let hex_text = line
        .strip_prefix("OK ")
        .ok_or_else(|| format!("malformed reply {line:?}"))?;
    let bytes = unhex(hex_text).ok_or_else(|| format!("malformed payload {hex_text:?}"))?;
    Payload::try_from(bytes.as_slice()).map_err(|_| format!("payload of {} bytes", bytes.len()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn server(store: RoomStore) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(serve(listener, store, Duration::from_secs(10)));
        port
    }

    #[tokio::test]
    async fn fetch_waits_for_a_later_publish() {
        let store = RoomStore::default();
        let port = server(store.clone()).await;
        let fetcher =
            tokio::spawn(async move { fetch("127.0.0.1", port, 42, Duration::from_secs(5)).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        store.publish(42, [7; 32]);
        let payload = fetcher.await.expect("join").expect("delivered");
        assert_eq!(payload, [7; 32]);
        assert_eq!(store.len(), 0, "a delivered room is forgotten");
    }

    #[tokio::test]
    async fn fetch_after_publish_and_only_once() {
        let store = RoomStore::default();
        let port = server(store.clone()).await;
        store.publish(i64::MAX, [3; 32]);
        let first = fetch("127.0.0.1", port, i64::MAX, Duration::from_secs(1)).await;
        assert_eq!(first.expect("delivered"), [3; 32]);
        let second = fetch("127.0.0.1", port, i64::MAX, Duration::from_millis(100)).await;
        assert!(
            matches!(second, Err(FetchError::Timeout { .. })),
            "{second:?}"
        );
    }

    #[tokio::test]
    async fn unpublished_room_times_out() {
        let store = RoomStore::default();
        let port = server(store.clone()).await;
        let err = fetch("127.0.0.1", port, 5, Duration::from_millis(100))
            .await
            .expect_err("never published");
        assert!(matches!(err, FetchError::Timeout { room: 5, .. }), "{err}");
        assert_eq!(store.len(), 0, "the waiter's empty slot is dropped");
    }

    #[tokio::test]
    async fn dead_peer_is_unreachable() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        drop(listener);
        let err = fetch("127.0.0.1", port, 1, Duration::from_millis(200))
            .await
            .expect_err("nobody listens");
        assert!(matches!(err, FetchError::Unreachable { .. }), "{err}");
    }

    #[test]
    fn malformed_lines_are_rejected() {
        assert!(parse_fetch("FETCH x 10\n").is_err());
        assert!(parse_fetch("GET 1 10\n").is_err());
        assert!(parse_reply("OK zz\n").is_err());
        assert_eq!(
            parse_fetch("FETCH -3 10\n"),
            Ok((-3, Duration::from_millis(10)))
        );
    }
}
