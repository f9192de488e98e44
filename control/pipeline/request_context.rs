//! The client's request id (`x-request-id`), carried from the HTTP front
//! door to the engine request ids.
//!
//! Why it exists: an operator following one request from the client's logs
//! to an engine's needs one id in both. The front door (`api::request_id`)
//! accepts or mints the id and runs the handler inside
//! [`with_client_request_id`]; the router reads it once, when a request
//! enters ([`client_request_id`]), and keeps it with the request, so
//! retries and streams that outlive the handler's future still use it.
//! It is ambient, like a tracing span, because it belongs to the request's
//! context rather than to any endpoint's parameters; a request served
//! outside the front door (a test, a benchmark) simply has none.

use std::future::Future;
use std::sync::Arc;

tokio::task_local! {
    static CLIENT_REQUEST_ID: Arc<str>;
}

/// Runs `work` with `id` as the client's request id.
pub(crate) async fn with_client_request_id<F: Future>(id: Arc<str>, work: F) -> F::Output {
    CLIENT_REQUEST_ID.scope(id, work).await
}

/// The client's request id of the request being served, if the front door
/// gave it one.
pub(crate) fn client_request_id() -> Option<Arc<str>> {
    CLIENT_REQUEST_ID.try_with(Arc::clone).ok()
}

/// `work` carrying the current request's id and tracing span: for a task
/// spawned to outlive the handler (a stream, a background response), so
/// its engine calls, its log lines and the errors it answers still name
/// the request.
pub(crate) fn carried<F: Future>(work: F) -> impl Future<Output = F::Output> {
    use tracing::Instrument;
    let id = client_request_id();
    // Boxed: the block below holds `work` in two of its states, so inline it
    // would make the spawned task twice the size of `work` (79 KB for a
    // Responses request), all of it copied at every move.
    let work = Box::pin(work);
    async move {
        match id {
            Some(id) => with_client_request_id(id, work).await,
            None => work.await,
        }
    }
    .instrument(tracing::Span::current())
}

/// The id an engine call carries: `<client id>-<request id>-<suffix>`, or
/// `<request id>-<suffix>` without a client id. The request id keeps engine
/// ids unique even when a client reuses its own id.
///
/// Ids are put together by hand, not with `format!`: `core::fmt` costs
/// several hundred instructions an id, and every request mints two and
/// composes one per attempt (callgrind, BENCHMARKS.md, issue 13).
pub(crate) fn engine_request_id(client: Option<&str>, request_id: &str, suffix: u32) -> String {
    let client_len = client.map_or(0, |client| client.len() + 1);
    let mut id = String::with_capacity(client_len + request_id.len() + 11);
    if let Some(client) = client {
        id.push_str(client);
        id.push('-');
    }
    id.push_str(request_id);
    id.push('-');
    push_decimal(&mut id, suffix);
    id
}

/// Appends `n` in decimal, as `format!("{n}")` writes it.
fn push_decimal(out: &mut String, mut n: u32) {
    let mut digits = [0u8; 10];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend(digits[start..].iter().map(|&digit| char::from(digit)));
}

/// Appends `n` as 32 lowercase hex digits, as `format!("{n:032x}")` writes
/// it: the random part of a minted id.
pub(crate) fn push_hex_u128(out: &mut String, n: u128) {
    push_low_hex(out, n, 32);
}

/// Appends the low `digits` hex digits of `n` (at most 32), most
/// significant first, as `format!("{:0digits$x}", n & mask)` writes them.
pub(crate) fn push_low_hex(out: &mut String, n: u128, digits: usize) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = [0u8; 32];
    for (at, byte) in text.iter_mut().enumerate() {
        *byte = DIGITS[((n >> (4 * (31 - at))) & 0xf) as usize];
    }
    // Hex digits are ASCII: always valid UTF-8.
    out.push_str(std::str::from_utf8(&text[32 - digits.min(32)..]).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_id_is_seen_inside_its_scope_only() {
        assert_eq!(client_request_id(), None);
        let seen = with_client_request_id(Arc::from("abc-1"), async {
            tokio::task::yield_now().await;
            client_request_id()
        })
        .await;
        assert_eq!(seen.as_deref(), Some("abc-1"));
        assert_eq!(client_request_id(), None);
    }

    #[test]
    fn engine_ids_put_the_client_id_first() {
        assert_eq!(
            engine_request_id(Some("trace-7"), "chatcmpl-00ff", 2),
            "trace-7-chatcmpl-00ff-2"
        );
        assert_eq!(
            engine_request_id(None, "chatcmpl-00ff", 1),
            "chatcmpl-00ff-1"
        );
    }

    #[test]
    fn ids_are_written_as_format_writes_them() {
        for n in [
            0,
            1,
            0xf,
            0x10,
            u128::MAX,
            u128::MAX / 3,
            1 << 127,
            0xdead_beef,
        ] {
            let mut hex = String::new();
            push_hex_u128(&mut hex, n);
            assert_eq!(hex, format!("{n:032x}"));
        }
        for n in [0, 7, 9, 10, 11, 99, 100, 4_294_967, u32::MAX] {
            let mut decimal = String::from("x");
            push_decimal(&mut decimal, n);
            assert_eq!(decimal, format!("x{n}"));
        }
    }
}
