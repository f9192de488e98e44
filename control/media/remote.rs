//! `http(s)://` images: fetched through the SSRF guard, with a byte cap.
//!
//! The client is built so that nothing bypasses the guard: no proxy (a proxy
//! would make the connection, and the guard would vet only the proxy), no
//! automatic redirects (each hop is vetted here before it is requested), and
//! a resolver that hands out only vetted addresses. No `Accept-Encoding` is
//! sent and nothing is decompressed, so the byte cap counts what arrives.
//!
//! The cap is enforced twice: a declared `Content-Length` above it is
//! refused before the body is read, and the body is counted while it
//! streams, so a server that lies about or omits its length is cut off at
//! the cap and the connection dropped. The blake3 hash is updated chunk by
//! chunk in the same pass.
//!
//! Failure messages name the URL as the client (or a redirect) wrote it,
//! bounded and without credentials ([`redacted`]), and say what went wrong
//! in a few fixed words (could not connect, timed out, broke off). The
//! HTTP client's error chain, with its OS errors, goes to the log.

use std::sync::Arc;

use bytes::BytesMut;
use reqwest::header::LOCATION;
use reqwest::{Client, StatusCode, Url};

use super::HashedBytes;
use super::guard::{
    DestinationPolicy, ForbiddenDestination, SendFailure, VettingResolver, literal_address,
};
use crate::error::excerpt;

/// Never reserve more than this up front on a server's word
/// (`Content-Length`); beyond it the buffer grows as bytes really arrive.
const MAX_PREALLOCATION: usize = 4 * 1024 * 1024;

/// Why an `http(s)` image could not be fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RemoteProblem {
    /// A URL (the client's, or a redirect's `Location`) is not fetchable.
    Malformed(String),
    /// The SSRF guard refused a hop, or a redirect left http(s).
    Forbidden(String),
    /// The body exceeds the cap; `declared` when `Content-Length` said so.
    TooLarge { declared: bool },
    /// Unreachable, non-2xx, broken body, too many redirects.
    Failed(String),
}

/// Fetches image URLs; one per gateway, sharing its connection pool.
#[derive(Debug, Clone)]
pub(crate) struct RemoteFetcher {
    client: Client,
    policy: Arc<DestinationPolicy>,
    max_redirects: usize,
}

impl RemoteFetcher {
    pub(crate) fn new(
        policy: Arc<DestinationPolicy>,
        max_redirects: usize,
    ) -> reqwest::Result<Self> {
        let client = Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(Arc::new(VettingResolver::new(Arc::clone(&policy))))
            .user_agent(concat!("smg/", env!("CARGO_PKG_VERSION")))
            .tcp_nodelay(true)
            .build()?;
        Ok(Self {
            client,
            policy,
            max_redirects,
        })
    }

    /// Fetches `url`, following up to `max_redirects` redirects, each hop
    /// vetted before it is requested. Callers bound the time it takes.
    pub(crate) async fn fetch(
        &self,
        url: Url,
        max_bytes: usize,
    ) -> Result<HashedBytes, RemoteProblem> {
        let mut url = url;
        let mut redirects = 0;
        loop {
            self.vet_before_request(&url)?;
            let response = self
                .client
                .get(url.clone())
                .send()
                .await
                .map_err(|error| describe_send_error(&error, &url))?;
            let status = response.status();
            if is_followable_redirect(status) {
                if redirects == self.max_redirects {
                    return Err(RemoteProblem::Failed(format!(
                        "{}: more than {} redirects",
                        redacted(&url),
                        self.max_redirects
                    )));
                }
                redirects += 1;
                url = redirect_target(&url, &response)?;
                continue;
            }
            if !status.is_success() {
                return Err(RemoteProblem::Failed(format!(
                    "{} answered {status}",
                    redacted(&url)
                )));
            }
            return read_capped_body(response, max_bytes, &url).await;
        }
    }

    /// The checks a hop needs before any connection: an http(s) URL with a
    /// host, and, for an IP-literal host (which no resolver sees), the guard.
    pub(crate) fn vet_before_request(&self, url: &Url) -> Result<(), RemoteProblem> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(RemoteProblem::Forbidden(format!(
                "{}: only http(s) URLs may be fetched (also after a redirect)",
                redacted(url)
            )));
        }
        let host = url
            .host_str()
            .filter(|host| !host.is_empty())
            .ok_or_else(|| RemoteProblem::Malformed(format!("{}: no host", redacted(url))))?;
        if let Some(address) = literal_address(host) {
            self.policy
                .check(&address.to_string(), address)
                .map_err(|refusal| forbidden(url, &refusal))?;
        }
        Ok(())
    }
}

fn is_followable_redirect(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::MOVED_PERMANENTLY
            | StatusCode::FOUND
            | StatusCode::SEE_OTHER
            | StatusCode::TEMPORARY_REDIRECT
            | StatusCode::PERMANENT_REDIRECT
    )
}

fn redirect_target(from: &Url, response: &reqwest::Response) -> Result<Url, RemoteProblem> {
    let location = response
        .headers()
        .get(LOCATION)
        .and_then(|value| value.to_str().ok())
        .ok_or_else(|| {
            RemoteProblem::Failed(format!(
                "{} answered {} without a usable Location",
                redacted(from),
                response.status()
            ))
        })?;
    from.join(location).map_err(|error| {
        RemoteProblem::Failed(format!(
            "{} redirected to an invalid location {:?}: {error}",
            redacted(from),
            excerpt(location)
        ))
    })
}

async fn read_capped_body(
    mut response: reqwest::Response,
    max_bytes: usize,
    url: &Url,
) -> Result<HashedBytes, RemoteProblem> {
    let max_len = u64::try_from(max_bytes).unwrap_or(u64::MAX);
    let declared = response.content_length();
    if declared.is_some_and(|len| len > max_len) {
        return Err(RemoteProblem::TooLarge { declared: true });
    }
    let reserve = declared
        .and_then(|len| usize::try_from(len).ok())
        .unwrap_or(0)
        .min(MAX_PREALLOCATION);
    let mut body = BytesMut::with_capacity(reserve);
    let mut hasher = blake3::Hasher::new();
    while let Some(chunk) = response.chunk().await.map_err(|error| {
        tracing::warn!(url = %redacted(url), error = %error_chain(&error), "an image body broke off");
        RemoteProblem::Failed(format!("{}: the body broke off", redacted(url)))
    })? {
        if body.len() + chunk.len() > max_bytes {
            // Dropping the response closes the connection mid-body.
            return Err(RemoteProblem::TooLarge { declared: false });
        }
        hasher.update(&chunk);
        body.extend_from_slice(&chunk);
    }
    if body.is_empty() {
        return Err(RemoteProblem::Failed(format!(
            "{} answered with an empty body",
            redacted(url)
        )));
    }
    Ok(HashedBytes {
        bytes: body.freeze(),
        content_hash: *hasher.finalize().as_bytes(),
    })
}

/// The guard's refusal, or what failed (the error chain goes to the log).
fn describe_send_error(error: &reqwest::Error, url: &Url) -> RemoteProblem {
    let what = match SendFailure::of(error) {
        SendFailure::Forbidden(refusal) => return forbidden(url, refusal),
        SendFailure::TimedOut => "timed out",
        SendFailure::Failed(what) => what,
    };
    tracing::warn!(url = %redacted(url), error = %error_chain(error), "an image fetch failed");
    RemoteProblem::Failed(format!("{}: {what}", redacted(url)))
}

fn forbidden(url: &Url, refusal: &ForbiddenDestination) -> RemoteProblem {
    RemoteProblem::Forbidden(format!("{}: {refusal}", redacted(url)))
}

/// An error and its causes on one line: reqwest's top-level message alone
/// ("error sending request") does not say what went wrong.
pub(crate) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// A URL for messages and logs: without credentials, and bounded
/// ([`excerpt`]).
pub(crate) fn redacted(url: &Url) -> String {
    let mut shown = url.clone();
    if !shown.username().is_empty() || shown.password().is_some() {
        // Only fails for URLs that cannot have credentials, which then have none.
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
    }
    excerpt(shown.as_str()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_drops_credentials_and_bounds_length() {
        let url = Url::parse("https://user:secret@example.com/a.png").expect("parses");
        assert_eq!(redacted(&url), "https://example.com/a.png");
        let long = Url::parse(&format!("https://example.com/{}", "x".repeat(500))).expect("parses");
        let shown = redacted(&long);
        assert!(
            shown.starts_with("https://example.com/xxx") && shown.ends_with("… (520 bytes)"),
            "{shown}"
        );
        assert!(shown.chars().count() < 120, "{shown}");
    }

    #[test]
    fn only_the_five_redirect_statuses_are_followed() {
        for code in [301, 302, 303, 307, 308] {
            let status = StatusCode::from_u16(code).expect("valid status");
            assert!(is_followable_redirect(status), "{code}");
        }
        for code in [200, 300, 304, 305, 404] {
            let status = StatusCode::from_u16(code).expect("valid status");
            assert!(!is_followable_redirect(status), "{code}");
        }
    }
}
