//! The media fetcher: every image of a request, fetched concurrently under
//! the configured limits, returned in prompt order.
//!
//! The order matters because the i-th image fills the prompt's i-th image
//! placeholder; concurrency matters because a request's latency should be
//! that of its slowest image, not the sum. The first failure fails the
//! request (with a stable error code and the image's index) and cancels the
//! other fetches.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::try_join_all;
use reqwest::Url;
use smg_dataplane::runtime::{DataPlane, FileReadError, JobError};

use super::HashedBytes;
use super::guard::{DestinationPolicy, PrivateHostAllowance};
use super::inline::{self, InlineProblem};
use super::local::{FileProblem, FileRoots};
use super::remote::{RemoteFetcher, RemoteProblem, redacted};
use crate::error::{Error, ErrorCode, Result, bytes_text};

/// Limits and allow-lists for media intake.
#[derive(Debug, Clone)]
pub struct MediaConfig {
    /// Largest accepted image, in bytes after base64 decoding (default 32 MiB).
    pub max_bytes: usize,
    /// Most images one request may carry (default 16).
    pub max_images_per_request: usize,
    /// Time allowed for each image, redirects and body included (default 10 s).
    pub fetch_timeout: Duration,
    /// Directories `file://` URLs may read from; empty (the default) refuses
    /// every `file://` URL.
    pub allowed_file_dirs: Vec<PathBuf>,
    /// Exceptions to the SSRF guard: networks or host names that may resolve
    /// to non-public addresses (default none).
    pub allow_private_hosts: Vec<PrivateHostAllowance>,
    /// Redirects followed per image, each re-vetted (default 5).
    pub max_redirects: usize,
}

impl Default for MediaConfig {
    fn default() -> Self {
        Self {
            max_bytes: 32 * 1024 * 1024,
            max_images_per_request: 16,
            fetch_timeout: Duration::from_secs(10),
            allowed_file_dirs: Vec::new(),
            allow_private_hosts: Vec::new(),
            max_redirects: 5,
        }
    }
}

/// A [`MediaConfig`] the fetcher cannot run with.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MediaConfigError {
    #[error("allowed file directory {}: {source}", path.display())]
    AllowedFileDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot build the media HTTP client: {0}")]
    HttpClient(#[from] reqwest::Error),
}

/// Where an image's bytes came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum MediaSource {
    DataUrl,
    Http,
    File,
    Base64,
}

/// One image's raw, undecoded bytes (the file as the client or server
/// provided it: PNG, JPEG, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FetchedMedia {
    pub bytes: Bytes,
    /// blake3 of `bytes`: the image's identity for encode routing and caches.
    pub content_hash: [u8; 32],
    pub source: MediaSource,
}

/// Fetches the images of requests. Build one per gateway and share it: it
/// holds the HTTP connection pool, and reads `file://` images through the
/// data plane.
#[derive(Debug, Clone)]
pub(crate) struct MediaFetcher {
    config: MediaConfig,
    remote: RemoteFetcher,
    file_roots: Arc<FileRoots>,
    dataplane: DataPlane,
}

impl MediaFetcher {
    pub(crate) fn new(config: MediaConfig, dataplane: DataPlane) -> Result<Self, MediaConfigError> {
        let file_roots = FileRoots::new(&config.allowed_file_dirs)
            .map_err(|(path, source)| MediaConfigError::AllowedFileDir { path, source })?;
        let policy = Arc::new(DestinationPolicy::new(config.allow_private_hosts.clone()));
        let remote = RemoteFetcher::new(policy, config.max_redirects)?;
        Ok(Self {
            config,
            remote,
            file_roots: Arc::new(file_roots),
            dataplane,
        })
    }

    /// Fetches every image concurrently; the result is in the order of
    /// `images`. Fails with the first failing image's error, whose message
    /// starts with `images[i]`.
    pub(crate) async fn fetch_all(&self, images: &[String]) -> Result<Vec<FetchedMedia>> {
        if images.len() > self.config.max_images_per_request {
            return Err(Error::new(
                ErrorCode::TooManyImages,
                format!(
                    "the request has {} images; --max-images-per-request allows {}",
                    images.len(),
                    self.config.max_images_per_request
                ),
            ));
        }
        try_join_all(
            images
                .iter()
                .enumerate()
                .map(|(index, image)| self.fetch_one(index, image)),
        )
        .await
    }

    async fn fetch_one(&self, index: usize, image: &str) -> Result<FetchedMedia> {
        let at_index = |error: Error| Error {
            message: format!("images[{index}]: {}", error.message),
            ..error
        };
        let reference = ImageReference::parse(image).map_err(at_index)?;
        let source = reference.source();
        let fetched = tokio::time::timeout(self.config.fetch_timeout, self.resolve(reference))
            .await
            .map_err(|_elapsed| {
                Error::new(
                    ErrorCode::MediaFetchFailed,
                    format!(
                        "timed out after {:?} fetching the image (--media-fetch-timeout-secs)",
                        self.config.fetch_timeout
                    ),
                )
            })
            .and_then(|fetched| fetched)
            .map_err(at_index)?;
        Ok(FetchedMedia {
            bytes: fetched.bytes,
            content_hash: fetched.content_hash,
            source,
        })
    }

    async fn resolve(&self, reference: ImageReference<'_>) -> Result<HashedBytes> {
        let max_bytes = self.config.max_bytes;
        match reference {
            ImageReference::DataUrl(url) => {
                inline::decode_data_url(url, max_bytes, &self.dataplane)
                    .await
                    .map_err(|problem| inline_error(problem, max_bytes, "the data: URL"))
            }
            ImageReference::Base64(encoded) => {
                inline::decode_base64(encoded, max_bytes, &self.dataplane)
                    .await
                    .map_err(|problem| bare_base64_error(problem, max_bytes, encoded))
            }
            ImageReference::Http(url) => {
                let shown = redacted(&url);
                self.remote
                    .fetch(url, max_bytes)
                    .await
                    .map_err(|problem| remote_error(problem, max_bytes, &shown))
            }
            ImageReference::File(url) => {
                // The allow-list opens the file beneath its directory (one
                // openat2 and an fstat, off the async threads); the read of
                // that descriptor runs on a data-plane core through io_uring.
                let roots = Arc::clone(&self.file_roots);
                // Messages name the path as the client wrote it, never the
                // resolved one (see `local`).
                let written = url.to_file_path().unwrap_or_default();
                let opened = tokio::task::spawn_blocking(move || roots.open(&url))
                    .await
                    .map_err(|join| Error::internal(format!("opening a file image: {join}")))?
                    .map_err(|problem| file_error(problem, max_bytes))?;
                let path = opened.path;
                let contents = self
                    .dataplane
                    .read_opened(opened.file, max_bytes)
                    .await
                    .map_err(|error| match error {
                        JobError::File(error) => {
                            file_error(file_problem(&path, &written, error), max_bytes)
                        }
                        other => Error::from_dataplane(&other),
                    })?;
                Ok(HashedBytes {
                    bytes: contents.bytes,
                    content_hash: contents.content_hash,
                })
            }
        }
    }
}

/// An image reference, classified by its scheme.
#[derive(Debug)]
enum ImageReference<'a> {
    DataUrl(&'a str),
    Http(Url),
    File(Url),
    Base64(&'a str),
}

impl<'a> ImageReference<'a> {
    /// The longest `http(s)://` or `file://` image URL (`data:` URLs carry
    /// the image and are bounded by `--media-max-bytes`). Parsing a URL
    /// walks it character by character on the request's thread: a 1.5 MB
    /// `file://` path cost 20 ms of it before being refused; no server or
    /// file system takes paths this long anyway.
    const MAX_URL_BYTES: usize = 32 * 1024;

    fn parse(image: &'a str) -> Result<Self> {
        if image.is_empty() {
            return Err(invalid_url("the image reference is empty"));
        }
        let Some(scheme) = scheme_of(image) else {
            return Ok(Self::Base64(image));
        };
        let parse_url = || {
            if image.len() > Self::MAX_URL_BYTES {
                return Err(invalid_url(format!(
                    "a {scheme} URL of {} bytes, longer than the {} an image URL may be",
                    image.len(),
                    bytes_text(Self::MAX_URL_BYTES as u64)
                )));
            }
            Url::parse(image)
                .map_err(|error| invalid_url(format!("not a valid {scheme} URL: {error}")))
        };
        match scheme.to_ascii_lowercase().as_str() {
            "data" => Ok(Self::DataUrl(image)),
            "http" | "https" => parse_url().map(Self::Http),
            "file" => parse_url().map(Self::File),
            _ => Err(invalid_url(format!(
                "unsupported scheme {scheme:?}; images must be http(s)://, data: or file:// URLs, or base64"
            ))),
        }
    }

    fn source(&self) -> MediaSource {
        match self {
            Self::DataUrl(_) => MediaSource::DataUrl,
            Self::Http(_) => MediaSource::Http,
            Self::File(_) => MediaSource::File,
            Self::Base64(_) => MediaSource::Base64,
        }
    }
}

/// The URL scheme `image` starts with (RFC 3986: a letter, then letters,
/// digits, `+`, `-`, `.`, then `:`), if any. Base64 never contains `:`, so
/// anything with a scheme is a URL.
fn scheme_of(image: &str) -> Option<&str> {
    const LONGEST_SCHEME: usize = 32;
    let colon = image
        .bytes()
        .take(LONGEST_SCHEME + 1)
        .position(|b| b == b':')?;
    let scheme = &image[..colon];
    let mut bytes = scheme.bytes();
    let starts_with_letter = bytes.next().is_some_and(|b| b.is_ascii_alphabetic());
    let rest_valid = bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    (starts_with_letter && rest_valid).then_some(scheme)
}

fn invalid_url(message: impl Into<String>) -> Error {
    Error::new(ErrorCode::InvalidImageUrl, message)
}

fn too_large(what: &str, size: String, max_bytes: usize) -> Error {
    Error::new(
        ErrorCode::MediaTooLarge,
        format!(
            "{what} {size}, over --media-max-bytes ({})",
            bytes_text(max_bytes as u64)
        ),
    )
}

fn inline_error(problem: InlineProblem, max_bytes: usize, what: &str) -> Error {
    match problem {
        InlineProblem::Malformed(reason) => invalid_url(reason),
        InlineProblem::InvalidBase64(reason) => {
            invalid_url(format!("{what} is not valid base64: {reason}"))
        }
        InlineProblem::TooLarge { decoded_len } => {
            too_large(what, format!("decodes to {decoded_len} bytes"), max_bytes)
        }
        InlineProblem::DataPlane(error) => error,
    }
}

fn bare_base64_error(problem: InlineProblem, max_bytes: usize, image: &str) -> Error {
    match problem {
        InlineProblem::InvalidBase64(reason) => {
            let looks_like_path = ["/", "./", "../", "~/"]
                .iter()
                .any(|prefix| image.starts_with(prefix));
            let hint = if looks_like_path {
                "; local paths are not accepted: use a file:// URL under an allowed directory"
            } else {
                ""
            };
            invalid_url(format!(
                "neither an http(s)://, data: or file:// URL nor valid base64 ({reason}){hint}"
            ))
        }
        other => inline_error(other, max_bytes, "the base64 image"),
    }
}

fn remote_error(problem: RemoteProblem, max_bytes: usize, url: &str) -> Error {
    match problem {
        RemoteProblem::Malformed(reason) => invalid_url(reason),
        RemoteProblem::Forbidden(reason) => Error::new(ErrorCode::MediaUrlForbidden, reason),
        RemoteProblem::TooLarge { declared: true } => too_large(
            url,
            "declares a larger Content-Length".to_owned(),
            max_bytes,
        ),
        RemoteProblem::TooLarge { declared: false } => {
            too_large(url, "sent more bytes".to_owned(), max_bytes)
        }
        RemoteProblem::Failed(reason) => Error::new(ErrorCode::MediaFetchFailed, reason),
    }
}

/// A data-plane read failure of the resolved `path` in the allow-list's
/// terms, naming the path the client `written`.
fn file_problem(
    path: &std::path::Path,
    written: &std::path::Path,
    error: FileReadError,
) -> FileProblem {
    let shown = super::local::shown(written);
    match error {
        FileReadError::NotRegular => {
            FileProblem::Forbidden(format!("{shown} is not a regular file"))
        }
        FileReadError::TooLarge { len, .. } => FileProblem::TooLarge { len },
        FileReadError::Io(detail) => {
            tracing::warn!(path = %path.display(), %detail, "a file image cannot be read");
            FileProblem::Unreadable(format!("{shown}: cannot be read"))
        }
        other => FileProblem::Unreadable(format!("{shown}: {other}")),
    }
}

fn file_error(problem: FileProblem, max_bytes: usize) -> Error {
    match problem {
        FileProblem::Malformed(reason) => invalid_url(reason),
        FileProblem::Forbidden(reason) => Error::new(ErrorCode::MediaUrlForbidden, reason),
        FileProblem::TooLarge { len } => {
            too_large("the file", format!("has {len} bytes"), max_bytes)
        }
        FileProblem::Unreadable(reason) => Error::new(ErrorCode::MediaFetchFailed, reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::ErrorKind;
    use std::net::{SocketAddr, TcpListener as StdTcpListener};

    use axum::Router;
    use axum::body::Body;
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    use axum::routing::get;
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;

    /// Every test's upper bound: a hang fails the test instead of the suite.
    const TEST_DEADLINE: Duration = Duration::from_secs(20);

    const PNG_LIKE: &[u8] = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR a small test image";

    /// A fetcher with its own one-core data plane (call inside a runtime).
    fn fetcher(configure: impl FnOnce(&mut MediaConfig)) -> MediaFetcher {
        let mut config = MediaConfig::default();
        configure(&mut config);
        MediaFetcher::new(config, test_dataplane()).expect("test config is valid")
    }

    fn test_dataplane() -> DataPlane {
        DataPlane::start(smg_dataplane::DataPlaneConfig::default()).expect("data plane")
    }

    fn allow(text: &str) -> PrivateHostAllowance {
        text.parse().expect("test allowance parses")
    }

    async fn fetch(fetcher: &MediaFetcher, images: &[String]) -> Result<Vec<FetchedMedia>> {
        tokio::time::timeout(TEST_DEADLINE, fetcher.fetch_all(images))
            .await
            .expect("fetch_all finished within the test deadline")
    }

    fn expect_error(outcome: Result<Vec<FetchedMedia>>, code: ErrorCode, fragment: &str) {
        match outcome {
            Err(error) => {
                assert_eq!(error.code, code, "{error}");
                assert!(
                    error.message.contains(fragment),
                    "{:?} does not contain {fragment:?}",
                    error.message
                );
            }
            Ok(media) => panic!("expected {code}, got {} images", media.len()),
        }
    }

    /// Serves `router` on 127.0.0.1 (or another loopback address) on an
    /// ephemeral port.
    async fn serve_on(ip: &str, router: Router) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind((ip, 0))
            .await
            .expect("bind a loopback port");
        let address = listener.local_addr().expect("bound address");
        tokio::spawn(async move { axum::serve(listener, router).await });
        address
    }

    async fn serve(router: Router) -> SocketAddr {
        serve_on("127.0.0.1", router).await
    }

    /// A loopback listener nobody serves, to prove no connection reached it:
    /// a connection the client made would wait in its accept queue.
    fn silent_listener(ip: &str) -> StdTcpListener {
        let listener = StdTcpListener::bind((ip, 0)).expect("bind a loopback port");
        listener.set_nonblocking(true).expect("non-blocking");
        listener
    }

    fn assert_never_connected(listener: &StdTcpListener) {
        match listener.accept() {
            Err(error) if error.kind() == ErrorKind::WouldBlock => {}
            Err(error) => panic!("accept failed: {error}"),
            Ok((_, peer)) => panic!("the guard let a connection from {peer} through"),
        }
    }

    /// Asserts, without any I/O, that the guard refuses a URL's first hop:
    /// checked before a test points a redirect at a non-loopback address,
    /// so a broken guard fails the test without sending traffic there.
    fn assert_refused_offline(fetcher: &MediaFetcher, url: &str) {
        let url = Url::parse(url).expect("test URL parses");
        assert!(
            matches!(
                fetcher.remote.vet_before_request(&url),
                Err(RemoteProblem::Forbidden(_))
            ),
            "the guard must refuse {url} before connecting"
        );
    }

    fn image_router() -> Router {
        Router::new()
            .route("/image.png", get(|| async { PNG_LIKE }))
            .route(
                "/hop",
                get(|| async { (StatusCode::FOUND, [(header::LOCATION, "/image.png")]) }),
            )
            .route(
                "/loop",
                get(|| async {
                    (
                        StatusCode::TEMPORARY_REDIRECT,
                        [(header::LOCATION, "/loop")],
                    )
                }),
            )
            .route("/missing", get(|| async { StatusCode::NOT_FOUND }))
            .route("/empty", get(|| async { "" }))
    }

    #[tokio::test]
    async fn data_url_is_decoded_and_hashed() {
        let url = format!("data:image/png;base64,{}", STANDARD.encode(PNG_LIKE));
        let media = fetch(&fetcher(|_| {}), &[url])
            .await
            .expect("valid data URL");
        assert_eq!(media.len(), 1);
        assert_eq!(media[0].bytes.as_ref(), PNG_LIKE);
        assert_eq!(media[0].content_hash, *blake3::hash(PNG_LIKE).as_bytes());
        assert_eq!(media[0].source, MediaSource::DataUrl);
    }

    #[tokio::test]
    async fn data_url_with_bad_base64_is_an_invalid_image_url() {
        let fetcher = fetcher(|_| {});
        let url = "data:image/png;base64,iVBO$w0KGgo=".to_owned();
        expect_error(
            fetch(&fetcher, &[url]).await,
            ErrorCode::InvalidImageUrl,
            "images[0]: the data: URL is not valid base64: invalid byte '$' at offset 4",
        );
        let not_base64 = "data:image/png,%89PNG".to_owned();
        expect_error(
            fetch(&fetcher, &[not_base64]).await,
            ErrorCode::InvalidImageUrl,
            "must be base64",
        );
    }

    #[tokio::test]
    async fn oversize_data_url_is_refused() {
        let fetcher = fetcher(|config| config.max_bytes = 16);
        let at_cap = format!("data:image/png;base64,{}", STANDARD.encode([1u8; 16]));
        let over = format!("data:image/png;base64,{}", STANDARD.encode([1u8; 17]));
        let accepted = fetch(&fetcher, &[at_cap]).await.expect("16 bytes fit");
        assert_eq!(accepted[0].bytes.len(), 16);
        expect_error(
            fetch(&fetcher, &[over]).await,
            ErrorCode::MediaTooLarge,
            "the data: URL decodes to 17 bytes, over --media-max-bytes (16 bytes)",
        );
    }

    #[tokio::test]
    async fn bare_base64_is_accepted_only_when_it_decodes() {
        let fetcher = fetcher(|_| {});
        let media = fetch(&fetcher, &[STANDARD.encode(PNG_LIKE)])
            .await
            .expect("clean base64");
        assert_eq!(media[0].bytes.as_ref(), PNG_LIKE);
        assert_eq!(media[0].source, MediaSource::Base64);

        let cases = [
            ("iVBORw0KGgo", "not a multiple of 4"),
            (
                "not base64 at all",
                "neither an http(s)://, data: or file:// URL",
            ),
            ("/etc/passwd", "local paths are not accepted"),
            ("example.com/cat.jpeg", "invalid byte '.' at offset 7"),
        ];
        for (image, fragment) in cases {
            expect_error(
                fetch(&fetcher, &[image.to_owned()]).await,
                ErrorCode::InvalidImageUrl,
                fragment,
            );
        }
    }

    #[tokio::test]
    async fn unknown_schemes_are_invalid_image_urls() {
        let fetcher = fetcher(|_| {});
        let cases = [
            ("ftp://example.com/a.png", "unsupported scheme \"ftp\""),
            ("gopher://example.com/a", "unsupported scheme \"gopher\""),
            ("C:\\images\\a.png", "unsupported scheme \"C\""),
            ("", "empty"),
            ("http://", "not a valid http URL"),
            ("https://exa mple.com/a.png", "not a valid https URL"),
        ];
        for (image, fragment) in cases {
            expect_error(
                fetch(&fetcher, &[image.to_owned()]).await,
                ErrorCode::InvalidImageUrl,
                fragment,
            );
        }
    }

    #[tokio::test]
    async fn too_many_images_are_refused_before_any_work() {
        let fetcher = fetcher(|config| config.max_images_per_request = 2);
        let listener = silent_listener("127.0.0.1");
        let port = listener.local_addr().expect("address").port();
        let images = vec![format!("http://127.0.0.1:{port}/a.png"); 3];
        expect_error(
            fetch(&fetcher, &images).await,
            ErrorCode::TooManyImages,
            "the request has 3 images; --max-images-per-request allows 2",
        );
        assert_never_connected(&listener);
        let two = vec![STANDARD.encode(b"a"), STANDARD.encode(b"b")];
        assert_eq!(fetch(&fetcher, &two).await.expect("two fit").len(), 2);
        assert!(fetch(&fetcher, &[]).await.expect("none").is_empty());
    }

    #[tokio::test]
    async fn http_image_from_an_allow_listed_loopback_server() {
        let address = serve(image_router()).await;
        let fetcher = fetcher(|config| config.allow_private_hosts = vec![allow("127.0.0.1")]);
        let media = fetch(&fetcher, &[format!("http://{address}/image.png")])
            .await
            .expect("allow-listed loopback");
        assert_eq!(media[0].bytes.as_ref(), PNG_LIKE);
        assert_eq!(media[0].content_hash, *blake3::hash(PNG_LIKE).as_bytes());
        assert_eq!(media[0].source, MediaSource::Http);
    }

    #[tokio::test]
    async fn allowed_redirects_are_followed_and_loops_are_cut() {
        let address = serve(image_router()).await;
        let fetcher = fetcher(|config| {
            config.allow_private_hosts = vec![allow("127.0.0.1")];
            config.max_redirects = 3;
        });
        let media = fetch(&fetcher, &[format!("http://{address}/hop")])
            .await
            .expect("one allowed redirect");
        assert_eq!(media[0].bytes.as_ref(), PNG_LIKE);
        expect_error(
            fetch(&fetcher, &[format!("http://{address}/loop")]).await,
            ErrorCode::MediaFetchFailed,
            "more than 3 redirects",
        );
    }

    #[tokio::test]
    async fn non_success_status_and_empty_body_fail() {
        let address = serve(image_router()).await;
        let fetcher = fetcher(|config| config.allow_private_hosts = vec![allow("127.0.0.1")]);
        expect_error(
            fetch(&fetcher, &[format!("http://{address}/missing")]).await,
            ErrorCode::MediaFetchFailed,
            "/missing answered 404 Not Found",
        );
        expect_error(
            fetch(&fetcher, &[format!("http://{address}/empty")]).await,
            ErrorCode::MediaFetchFailed,
            "/empty answered with an empty body",
        );
    }

    #[tokio::test]
    async fn loopback_is_refused_unless_allow_listed_and_never_contacted() {
        let fetcher = fetcher(|_| {});
        let listener = silent_listener("127.0.0.1");
        let port = listener.local_addr().expect("address").port();
        let cases = [
            (
                format!("http://127.0.0.1:{port}/a.png"),
                "127.0.0.1 is a loopback address",
            ),
            (
                format!("http://localhost:{port}/a.png"),
                "localhost resolves to",
            ),
            (
                format!("http://2130706433:{port}/a.png"),
                "127.0.0.1 is a loopback",
            ),
            (
                format!("http://0x7f.1:{port}/a.png"),
                "127.0.0.1 is a loopback",
            ),
            (
                format!("http://[::ffff:127.0.0.1]:{port}/a.png"),
                "::ffff:127.0.0.1 is a loopback",
            ),
            (
                format!("http://0.0.0.0:{port}/a.png"),
                "the unspecified address",
            ),
        ];
        for (url, fragment) in cases {
            expect_error(
                fetch(&fetcher, std::slice::from_ref(&url)).await,
                ErrorCode::MediaUrlForbidden,
                fragment,
            );
            assert_never_connected(&listener);
        }
    }

    #[tokio::test]
    async fn non_public_literals_are_refused_offline() {
        let fetcher = fetcher(|config| config.allow_private_hosts = vec![allow("127.0.0.1")]);
        for url in [
            "http://169.254.169.254/latest/meta-data/",
            "http://2852039166/",
            "http://0xA9FEA9FE/",
            "http://[::ffff:169.254.169.254]/",
            "http://[fd00::1]/",
            "http://[fe80::1]/",
            "http://10.0.0.1/",
            "http://172.16.0.1/",
            "http://192.168.0.1/",
            "http://100.64.0.1/",
            "http://255.255.255.255/",
            "http://224.0.0.1/",
            "http://[::1]/",
            "http://[64:ff9b::a9fe:a9fe]/",
        ] {
            assert_refused_offline(&fetcher, url);
        }
    }

    #[tokio::test]
    async fn redirects_to_forbidden_addresses_are_refused_before_connecting() {
        // The allowed server redirects to whatever `?to=` names.
        let router = Router::new().route(
            "/redirect",
            get(
                |axum::extract::Query(query): axum::extract::Query<
                    std::collections::HashMap<String, String>,
                >| async move {
                    let target = query.get("to").cloned().unwrap_or_default();
                    (StatusCode::FOUND, [(header::LOCATION, target)])
                },
            ),
        );
        let address = serve(router).await;
        let fetcher = fetcher(|config| config.allow_private_hosts = vec![allow("127.0.0.1")]);
        let cases = [
            (
                "http://169.254.169.254/latest/meta-data/",
                "169.254.169.254 is a link-local address",
            ),
            ("http://10.0.0.1/internal", "10.0.0.1 is a private address"),
            (
                "http://[::ffff:a9fe:a9fe]/",
                "::ffff:169.254.169.254 is a link-local",
            ),
            ("http://0xA9FEA9FE/", "169.254.169.254 is a link-local"),
            ("file:///etc/passwd", "only http(s) URLs may be fetched"),
        ];
        for (target, fragment) in cases {
            if target.starts_with("http") {
                assert_refused_offline(&fetcher, target);
            }
            let url =
                Url::parse_with_params(&format!("http://{address}/redirect"), [("to", target)])
                    .expect("test URL");
            expect_error(
                fetch(&fetcher, &[url.to_string()]).await,
                ErrorCode::MediaUrlForbidden,
                fragment,
            );
        }
    }

    #[tokio::test]
    async fn redirect_to_a_name_resolving_to_a_forbidden_address_is_refused() {
        // The first hop is allowed (127.0.0.2 is allow-listed); the redirect
        // names `localhost`, which resolves to 127.0.0.1 (and maybe ::1),
        // neither allowed: the resolver must refuse it and no connection may
        // reach the listener there.
        let forbidden = silent_listener("127.0.0.1");
        let forbidden_port = forbidden.local_addr().expect("address").port();
        let target = format!("http://localhost:{forbidden_port}/a.png");
        let router = Router::new().route(
            "/redirect",
            get(move || async move { (StatusCode::FOUND, [(header::LOCATION, target)]) }),
        );
        let address = serve_on("127.0.0.2", router).await;
        let fetcher = fetcher(|config| config.allow_private_hosts = vec![allow("127.0.0.2")]);
        expect_error(
            fetch(&fetcher, &[format!("http://{address}/redirect")]).await,
            ErrorCode::MediaUrlForbidden,
            "localhost resolves to",
        );
        assert_never_connected(&forbidden);
    }

    #[tokio::test]
    async fn a_host_allowance_admits_that_name_only() {
        let address = serve(image_router()).await;
        let port = address.port();
        let by_name = fetcher(|config| config.allow_private_hosts = vec![allow("localhost")]);
        let media = fetch(&by_name, &[format!("http://localhost:{port}/image.png")])
            .await
            .expect("localhost is allow-listed by name");
        assert_eq!(media[0].bytes.as_ref(), PNG_LIKE);
        expect_error(
            fetch(&by_name, &[format!("http://127.0.0.1:{port}/image.png")]).await,
            ErrorCode::MediaUrlForbidden,
            "loopback",
        );
    }

    #[tokio::test]
    async fn oversize_responses_are_cut_at_the_cap() {
        const CAP: usize = 64 * 1024;
        let router = Router::new()
            .route("/declared", get(|| async { vec![0u8; CAP + 1] }))
            .route(
                "/exact",
                get(|| async { Body::from_stream(chunks(CAP / 1024)) }),
            )
            .route(
                // Endless and without Content-Length: only the cap ends it.
                "/endless",
                get(|| async {
                    let endless = futures::stream::repeat_with(|| {
                        Ok::<_, std::io::Error>(Bytes::from_static(&[7u8; 1024]))
                    });
                    Body::from_stream(endless).into_response()
                }),
            );
        let address = serve(router).await;
        let fetcher = fetcher(|config| {
            config.allow_private_hosts = vec![allow("127.0.0.1")];
            config.max_bytes = CAP;
        });
        expect_error(
            fetch(&fetcher, &[format!("http://{address}/declared")]).await,
            ErrorCode::MediaTooLarge,
            "declares a larger Content-Length, over --media-max-bytes (64 KiB)",
        );
        expect_error(
            fetch(&fetcher, &[format!("http://{address}/endless")]).await,
            ErrorCode::MediaTooLarge,
            "sent more bytes, over --media-max-bytes (64 KiB)",
        );
        let exact = fetch(&fetcher, &[format!("http://{address}/exact")])
            .await
            .expect("a chunked body of exactly the cap fits");
        assert_eq!(exact[0].bytes.len(), CAP);
        assert_eq!(
            exact[0].content_hash,
            *blake3::hash(&vec![7u8; CAP]).as_bytes()
        );
    }

    fn chunks(count: usize) -> impl futures::Stream<Item = std::io::Result<Bytes>> {
        futures::stream::iter((0..count).map(|_| Ok(Bytes::from_static(&[7u8; 1024]))))
    }

    #[tokio::test]
    async fn a_server_that_never_answers_times_out() {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        // Accept and hold connections without ever answering.
        let holder = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let fetcher = fetcher(|config| {
            config.allow_private_hosts = vec![allow("127.0.0.1")];
            config.fetch_timeout = Duration::from_millis(300);
        });
        expect_error(
            fetch(&fetcher, &[format!("http://{address}/slow.png")]).await,
            ErrorCode::MediaFetchFailed,
            "images[0]: timed out after 300ms",
        );
        holder.abort();
    }

    #[tokio::test]
    async fn images_are_fetched_concurrently_and_returned_in_order() {
        // Each response waits until both requests have arrived: fetched one
        // after the other, the first would wait forever.
        let both_arrived = Arc::new(tokio::sync::Barrier::new(2));
        let router = Router::new().route(
            "/{name}",
            get(
                move |axum::extract::Path(name): axum::extract::Path<String>| {
                    let both_arrived = Arc::clone(&both_arrived);
                    async move {
                        both_arrived.wait().await;
                        format!("image {name}")
                    }
                },
            ),
        );
        let address = serve(router).await;
        let fetcher = fetcher(|config| config.allow_private_hosts = vec![allow("127.0.0.1")]);
        let images = [
            format!("http://{address}/first"),
            format!("data:image/png;base64,{}", STANDARD.encode(b"inline")),
            format!("http://{address}/second"),
        ];
        let media = fetch(&fetcher, &images).await.expect("all three");
        let bodies: Vec<&[u8]> = media.iter().map(|m| m.bytes.as_ref()).collect();
        assert_eq!(
            bodies,
            [b"image first".as_slice(), b"inline", b"image second"]
        );
        let sources: Vec<MediaSource> = media.iter().map(|m| m.source).collect();
        assert_eq!(
            sources,
            [MediaSource::Http, MediaSource::DataUrl, MediaSource::Http]
        );
    }

    #[tokio::test]
    async fn the_failing_image_is_named_by_index() {
        let fetcher = fetcher(|_| {});
        let images = [STANDARD.encode(b"fine"), "ftp://x/y.png".to_owned()];
        expect_error(
            fetch(&fetcher, &images).await,
            ErrorCode::InvalidImageUrl,
            "images[1]: unsupported scheme",
        );
    }

    #[tokio::test]
    async fn file_urls_inside_and_outside_the_allowed_dir() {
        let allowed = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        let image = allowed.path().join("cat.png");
        std::fs::write(&image, PNG_LIKE).expect("write image");
        let secret = outside.path().join("secret.png");
        std::fs::write(&secret, b"secret").expect("write secret");
        let link = allowed.path().join("link.png");
        std::os::unix::fs::symlink(&secret, &link).expect("symlink");
        let url = |path: &std::path::Path| {
            Url::from_file_path(path)
                .expect("absolute path")
                .to_string()
        };

        let confined = fetcher(|config| config.allowed_file_dirs = vec![allowed.path().into()]);
        let media = fetch(&confined, &[url(&image)]).await.expect("inside");
        assert_eq!(media[0].bytes.as_ref(), PNG_LIKE);
        assert_eq!(media[0].source, MediaSource::File);
        expect_error(
            fetch(&confined, &[url(&secret)]).await,
            ErrorCode::MediaUrlForbidden,
            "outside the allowed file directories",
        );
        expect_error(
            fetch(&confined, &[url(&link)]).await,
            ErrorCode::MediaUrlForbidden,
            "symlink",
        );
        expect_error(
            fetch(&confined, &[url(&allowed.path().join("none.png"))]).await,
            ErrorCode::MediaFetchFailed,
            "no such file",
        );
        expect_error(
            fetch(&fetcher(|_| {}), &[url(&image)]).await,
            ErrorCode::MediaUrlForbidden,
            "file:// URLs are disabled",
        );
    }

    /// A directory inside the allowed tree swapped for a symlink to an
    /// outside directory while reads run: no read may return the outside
    /// file (the check and the open are one `openat2` beneath the allowed
    /// directory's fd, so there is no window between them).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn swapping_a_directory_for_a_symlink_during_reads_never_leaks_outside_bytes() {
        use std::sync::atomic::{AtomicBool, Ordering};
        const READS: usize = 2_000;
        let allowed = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        let real = allowed.path().join("d");
        std::fs::create_dir(&real).expect("mkdir");
        std::fs::write(real.join("img.png"), b"INSIDE").expect("write inside");
        std::fs::write(outside.path().join("img.png"), b"OUTSIDE").expect("write outside");
        let parked = allowed.path().join("d-real");
        let link = allowed.path().join("d-link");
        std::os::unix::fs::symlink(outside.path(), &link).expect("symlink");
        let confined = fetcher(|config| config.allowed_file_dirs = vec![allowed.path().into()]);
        let url = Url::from_file_path(real.join("img.png"))
            .expect("absolute path")
            .to_string();

        let stop = Arc::new(AtomicBool::new(false));
        let started = Arc::new(std::sync::Barrier::new(2));
        let swapper = {
            let (stop, started) = (Arc::clone(&stop), Arc::clone(&started));
            let (real, parked, link) = (real.clone(), parked.clone(), link.clone());
            std::thread::spawn(move || {
                started.wait();
                let mut swaps = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // d: directory -> symlink to outside -> directory again.
                    std::fs::rename(&real, &parked).expect("park the directory");
                    std::fs::rename(&link, &real).expect("put the symlink in its place");
                    std::fs::rename(&real, &link).expect("take the symlink away");
                    std::fs::rename(&parked, &real).expect("restore the directory");
                    swaps += 1;
                }
                swaps
            })
        };
        started.wait();
        let (mut inside, mut refused) = (0usize, 0usize);
        for _ in 0..READS {
            match fetch(&confined, std::slice::from_ref(&url)).await {
                Ok(media) => {
                    assert_eq!(
                        media[0].bytes.as_ref(),
                        b"INSIDE",
                        "a read returned a file from outside the allowed directory"
                    );
                    inside += 1;
                }
                Err(_) => refused += 1,
            }
        }
        stop.store(true, Ordering::Relaxed);
        let swaps = swapper.join().expect("the swapper finished");
        assert_eq!(inside + refused, READS);
        assert!(swaps > 0, "the swapper ran");
    }

    #[tokio::test]
    async fn what_the_data_plane_finds_in_an_allowed_file_maps_to_stable_codes() {
        let allowed = tempfile::tempdir().expect("tempdir");
        std::fs::write(allowed.path().join("big.png"), vec![7u8; 2048]).expect("write");
        std::fs::write(allowed.path().join("empty.png"), b"").expect("write");
        std::fs::create_dir(allowed.path().join("dir.png")).expect("mkdir");
        let confined = fetcher(|config| {
            config.allowed_file_dirs = vec![allowed.path().into()];
            config.max_bytes = 1024;
        });
        let url = |name: &str| {
            Url::from_file_path(allowed.path().join(name))
                .expect("absolute path")
                .to_string()
        };
        for (name, code, fragment) in [
            ("big.png", ErrorCode::MediaTooLarge, "has 2048 bytes"),
            ("empty.png", ErrorCode::MediaFetchFailed, "is empty"),
            (
                "dir.png",
                ErrorCode::MediaUrlForbidden,
                "not a regular file",
            ),
        ] {
            expect_error(fetch(&confined, &[url(name)]).await, code, fragment);
        }
    }

    #[tokio::test]
    async fn a_missing_allowed_dir_fails_construction() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = MediaConfig {
            allowed_file_dirs: vec![dir.path().join("absent")],
            ..MediaConfig::default()
        };
        assert!(matches!(
            MediaFetcher::new(config, test_dataplane()),
            Err(MediaConfigError::AllowedFileDir { .. })
        ));
    }

    #[test]
    fn defaults_match_the_documented_limits() {
        let config = MediaConfig::default();
        assert_eq!(config.max_bytes, 32 * 1024 * 1024);
        assert_eq!(config.max_images_per_request, 16);
        assert_eq!(config.fetch_timeout, Duration::from_secs(10));
        assert!(config.allowed_file_dirs.is_empty());
        assert!(config.allow_private_hosts.is_empty());
        assert_eq!(config.max_redirects, 5);
    }

    #[test]
    fn urls_longer_than_the_cap_are_refused_before_parsing() {
        let long = format!("file:///{}.png", "a".repeat(1_500_000));
        let error = ImageReference::parse(&long).expect_err("too long");
        assert_eq!(error.code, ErrorCode::InvalidImageUrl);
        assert!(error.message.contains("1500012 bytes"), "{}", error.message);
        let at_cap = format!("http://a/{}", "b".repeat(ImageReference::MAX_URL_BYTES - 9));
        assert_eq!(at_cap.len(), ImageReference::MAX_URL_BYTES);
        assert!(matches!(
            ImageReference::parse(&at_cap),
            Ok(ImageReference::Http(_))
        ));
    }

    #[test]
    fn schemes_are_recognized_by_rfc_3986_shape() {
        let cases = [
            ("http://a", Some("http")),
            ("HTTPS://a", Some("HTTPS")),
            ("data:,x", Some("data")),
            ("svn+ssh://a", Some("svn+ssh")),
            ("iVBORw0KGgo=", None),
            ("/9j/4AAQ", None),
            ("1http://a", None),
            (":x", None),
        ];
        for (image, expected) in cases {
            assert_eq!(scheme_of(image), expected, "{image}");
        }
    }
}
