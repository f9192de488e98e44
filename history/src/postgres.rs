//! The `postgres` backend: a PostgreSQL server shared by gateway replicas.
//!
//! Why it exists: replicas behind one load balancer must see each other's
//! responses (a `previous_response_id` made on one replica is continued on
//! another) and conversations. JSON columns are TEXT, exactly as the
//! gateway serialized it (migration 0003: JSONB reordered object keys),
//! so sqlx needs no JSON feature.
//! The migrator takes a PostgreSQL advisory lock, so replicas that start
//! together migrate once and the others wait for it.
//!
//! Errors never carry the URL's password: sqlx's messages are scrubbed of
//! it at open, the only place the URL is read.
//!
//! Open connects once on its own, not through the pool, and migrates
//! over that connection: sqlx's pool retries a refused connection until
//! its acquire timeout and then says only "pool timed out", where one
//! connection fails at once with its cause (refused, no such host, a
//! password or database the server refuses, TLS). The pool connects
//! lazily after that. Its acquire timeout, the `connect_timeout` of the
//! config, is how long a call waits for a connection while every
//! connection is busy: nothing has been sent then, so the caller may say
//! that nothing was changed. A query already sent is not timed out here,
//! for the same reason.
//!
//! An outage is found out, and then fails calls at once ([`Reach`]): a
//! call that has waited [`PROBE_AFTER`] for a connection has the store
//! connect once outside the pool (one such probe at a time). If that
//! fails, the server is out of reach: every call waiting for a connection,
//! and every call after, fails at once with the probe's cause, until a
//! probe every [`PROBE_EVERY`] connects again. A server that answers while
//! the pool is exhausted is not an outage: those calls wait their acquire
//! timeout, then say that every connection was busy.
//!
//! A cancel asked of one replica for a response another one runs is a
//! flag on the row plus a NOTIFY on [`CANCEL_CHANNEL`] carrying the id,
//! sent by the same statement (so it is delivered only if the flag was
//! committed). Each gateway LISTENs on one connection of its own, beside
//! the pool ([`CancelNotices`]); a notice sent while that connection was
//! down is lost, which the listener reports so the owner asks for its flagged
//! rows (as it also does on every heartbeat).
//!
//! TLS is the URL's, as sqlx reads it: `sslmode` (`prefer` by default),
//! `sslrootcert`, and a client certificate in `sslcert` and `sslkey`; a
//! parameter the URL leaves out is taken, as libpq does, from `PGSSLMODE`,
//! `PGSSLROOTCERT`, `PGSSLCERT` and `PGSSLKEY` (sqlx reads the environment
//! under the URL). The certificate files named either way are opened at
//! start, so a wrong path fails there with its name: sqlx reads them only
//! during a handshake, and says no more than "No such file or directory".
//! A server that refuses the client certificate ends the handshake with
//! an alert, which sqlx reports as "received fatal alert: UnknownCA"; the
//! open's error adds which certificate that was, and a later connection
//! that meets it fails with that cause in words a client may see.

use std::{
    fmt,
    str::FromStr,
    sync::{
        Arc, Weak,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use async_trait::async_trait;
use sqlx::{
    Connection, PgConnection, PgPool, Postgres,
    pool::PoolConnection,
    postgres::{PgConnectOptions, PgListener, PgPoolOptions},
};
use tokio::sync::watch;

use crate::{
    CancelNotices, HistoryError, HistoryResult,
    config::redact_secret,
    sql::{Queries, db_err, sql_store},
};

/// The NOTIFY channel of cancel requests, as SQL text and as
/// [`CANCEL_CHANNEL`].
macro_rules! cancel_channel {
    () => {
        "smg_history_cancel"
    };
}

/// The NOTIFY channel of cancel requests; the payload is the response id.
pub const CANCEL_CHANNEL: &str = cancel_channel!();

/// How long a call waits for a connection before the store asks, with a
/// connection of its own, whether the server is there at all.
const PROBE_AFTER: Duration = Duration::from_millis(500);
/// How often a server known to be out of reach is tried again.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// The history in a PostgreSQL database.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
    /// The one connection that LISTENs for cancel requests, apart from
    /// `pool` (a pool of one would otherwise have none left for calls).
    listening: PgPool,
    reach: Arc<Reach>,
}

/// Whether the server is known to be out of reach, shared by the store's
/// calls and the probe that finds it back.
struct Reach {
    options: PgConnectOptions,
    /// Only to scrub the password from the driver's messages.
    url: String,
    /// `HOST:PORT` (or the socket), for messages.
    server: String,
    connect_timeout: Duration,
    max_connections: u32,
    /// `Some` while the server is out of reach.
    down: watch::Sender<Option<Outage>>,
    /// A probe runs (at most one at a time).
    probing: AtomicBool,
}

/// Why the server is out of reach, and since when.
#[derive(Debug, Clone)]
struct Outage {
    /// In words a client may see.
    cause: String,
    /// For the log: the server and the driver's error.
    detail: String,
    since: Instant,
}

/// Written by hand: the options and the URL hold the password.
impl fmt::Debug for Reach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reach")
            .field("server", &self.server)
            .field("down", &*self.down.borrow())
            .finish_non_exhaustive()
    }
}

impl Reach {
    fn outage(&self) -> Option<Outage> {
        self.down.borrow().clone()
    }

    /// What a call fails with while `outage` lasts.
    fn error(outage: &Outage) -> HistoryError {
        HistoryError::Unreachable {
            cause: outage.cause.clone(),
            detail: format!(
                "{} (out of reach for {}s; calls fail at once until a connection is made)",
                outage.detail,
                outage.since.elapsed().as_secs()
            ),
        }
    }

    /// Connects once, outside the pool. The server answers: it is marked
    /// reachable, `None`. Else it is marked out of reach (and probed again
    /// every [`PROBE_EVERY`] until it answers), and the outage returned.
    async fn probe(self: &Arc<Self>) -> Option<Outage> {
        let connected = tokio::time::timeout(
            self.connect_timeout,
            PgConnection::connect_with(&self.options),
        )
        .await;
        match connected {
            Ok(Ok(connection)) => {
                let _ = connection.close().await;
                self.down.send_if_modified(|down| down.take().is_some());
                None
            }
            Ok(Err(err)) => Some(self.unreachable(cause_of(&err), &err.to_string())),
            Err(_) => {
                let silent = format!("no answer within {:?}", self.connect_timeout);
                Some(self.unreachable(silent.clone(), &silent))
            }
        }
    }

    /// [`probe`](Self::probe) in a task of its own, unless one runs.
    fn probe_in_background(self: &Arc<Self>) {
        if self.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let reach = Arc::clone(self);
        tokio::spawn(async move {
            reach.probe().await;
            reach.probing.store(false, Ordering::Release);
        });
    }

    /// Marks the server out of reach (the first outage's cause and start
    /// are kept while it lasts) and returns the outage.
    fn unreachable(self: &Arc<Self>, cause: String, error: &str) -> Outage {
        let outage = Outage {
            cause,
            detail: redact_secret(
                &self.url,
                &format!("cannot connect to postgres at {}: {error}", self.server),
            ),
            since: Instant::now(),
        };
        let began = self.down.send_if_modified(|down| {
            if down.is_some() {
                return false;
            }
            *down = Some(outage.clone());
            true
        });
        if began {
            tokio::spawn(keep_probing(Arc::downgrade(self)));
        }
        self.outage().unwrap_or(outage)
    }
}

/// Tries the server every [`PROBE_EVERY`] until it answers (or the store
/// is gone).
async fn keep_probing(reach: Weak<Reach>) {
    loop {
        tokio::time::sleep(PROBE_EVERY).await;
        let Some(reach) = reach.upgrade() else {
            return;
        };
        if reach.probe().await.is_none() {
            return;
        }
    }
}

/// Why a connection could not be made, in words that name no host, user
/// or database (a client is shown them).
fn cause_of(err: &sqlx::Error) -> String {
    match err {
        _ if refused_certificate(err) => "the server refused the client certificate".to_owned(),
        // What rustls reports through the socket (sqlx's handshake and
        // session read and write TLS records as I/O).
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::InvalidData => {
            "the TLS handshake failed".to_owned()
        }
        sqlx::Error::Io(io) => {
            let kind = io.kind().to_string();
            if kind == "other error" || kind == "uncategorized error" {
                "cannot resolve or reach the server".to_owned()
            } else {
                kind
            }
        }
        sqlx::Error::Tls(_) => "the TLS handshake failed".to_owned(),
        sqlx::Error::Database(db) => format!(
            "the server refused the session (SQLSTATE {})",
            db.code().unwrap_or_default()
        ),
        _ => "cannot connect".to_owned(),
    }
}

impl PostgresStore {
    /// Connects once (within `connect_timeout`, so a bad URL or a server
    /// out of reach fails here, with its cause) and brings the schema up
    /// to date over that connection; then the pool of `max_connections`,
    /// whose calls wait at most `connect_timeout` for a connection.
    pub async fn connect(
        url: &str,
        max_connections: u32,
        connect_timeout: Duration,
    ) -> HistoryResult<Self> {
        let unavailable = |message: String| HistoryError::Unavailable(redact_secret(url, &message));
        let options = PgConnectOptions::from_str(url)
            .map_err(|err| unavailable(format!("cannot connect to postgres: {err}")))?;
        let client_certificate = check_certificate_files(url)?;
        let server = match options.get_socket() {
            Some(socket) => socket.display().to_string(),
            None => format!("{}:{}", options.get_host(), options.get_port()),
        };
        let mut first = match tokio::time::timeout(
            connect_timeout,
            PgConnection::connect_with(&options),
        )
        .await
        {
            Ok(Ok(connection)) => connection,
            Ok(Err(err)) => {
                let refused = if refused_certificate(&err) {
                    format!(
                        " (the server refused the client certificate: {})",
                        client_certificate.as_deref().unwrap_or("none was given")
                    )
                } else {
                    String::new()
                };
                return Err(unavailable(format!(
                    "cannot connect to postgres at {server}: {err}{refused}"
                )));
            }
            Err(_) => {
                return Err(unavailable(format!(
                    "cannot connect to postgres at {server}: no answer within {connect_timeout:?}"
                )));
            }
        };
        let migrated = sqlx::migrate!("./migrations/postgres")
            .run(&mut first)
            .await;
        let _ = first.close().await;
        migrated.map_err(|err| {
            unavailable(format!(
                "cannot migrate the postgres history schema at {server}: {err}"
            ))
        })?;
        let max_connections = max_connections.max(1);
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(connect_timeout)
            .connect_lazy_with(options.clone());
        let listening = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(connect_timeout)
            .connect_lazy_with(options.clone());
        let reach = Arc::new(Reach {
            options,
            url: url.to_owned(),
            server,
            connect_timeout,
            max_connections,
            down: watch::Sender::new(None),
            probing: AtomicBool::new(false),
        });
        Ok(Self {
            pool,
            listening,
            reach,
        })
    }

    /// A connection of the pool, as every call gets one: at once an
    /// error while the server is known to be out of reach; else the pool's,
    /// unless the probe started after [`PROBE_AFTER`] finds the server out
    /// of reach first.
    async fn connection(&self) -> HistoryResult<PoolConnection<Postgres>> {
        if let Some(outage) = self.reach.outage() {
            return Err(Reach::error(&outage));
        }
        let mut down = self.reach.down.subscribe();
        let acquire = self.pool.acquire();
        tokio::pin!(acquire);
        let slow = tokio::time::sleep(PROBE_AFTER);
        tokio::pin!(slow);
        let mut probed = false;
        loop {
            tokio::select! {
                got = &mut acquire => return match got {
                    Ok(connection) => Ok(connection),
                    Err(sqlx::Error::PoolTimedOut) => Err(self.timed_out().await),
                    // What the pool does not retry (TLS, a refused
                    // password, an unknown host): the server is out of
                    // reach as this gateway is set up.
                    Err(err @ (sqlx::Error::Io(_)
                    | sqlx::Error::Tls(_)
                    | sqlx::Error::Database(_)
                    | sqlx::Error::Protocol(_))) => Err(Reach::error(
                        &self.reach.unreachable(cause_of(&err), &err.to_string()),
                    )),
                    Err(err) => Err(db_err(err)),
                },
                () = &mut slow, if !probed => {
                    probed = true;
                    self.reach.probe_in_background();
                }
                changed = down.changed() => {
                    if changed.is_err() {
                        // Never: the store holds the sender.
                        continue;
                    }
                    if let Some(outage) = self.reach.outage() {
                        return Err(Reach::error(&outage));
                    }
                }
            }
        }
    }

    /// The pool gave no connection within the acquire timeout: the
    /// server is out of reach (a probe says why), or every connection is
    /// busy.
    async fn timed_out(&self) -> HistoryError {
        match self.reach.probe().await {
            Some(outage) => Reach::error(&outage),
            None => HistoryError::Unavailable(format!(
                "no connection to postgres at {} was free within {:?}: the server answers, \
                 and all {} of the pool's were busy",
                self.reach.server, self.reach.connect_timeout, self.reach.max_connections
            )),
        }
    }

    /// LISTENs on [`CANCEL_CHANNEL`] over a connection of its own (held
    /// for as long as the listener lives; not one of the pool's).
    async fn listen_for_cancels(&self) -> HistoryResult<Option<Box<dyn CancelNotices>>> {
        if let Some(outage) = self.reach.outage() {
            return Err(Reach::error(&outage));
        }
        let mut listener = PgListener::connect_with(&self.listening)
            .await
            .map_err(db_err)?;
        listener.listen(CANCEL_CHANNEL).await.map_err(db_err)?;
        Ok(Some(Box::new(PgCancelNotices { listener })))
    }
}

/// Cancel requests as PostgreSQL notifies them.
#[derive(Debug)]
struct PgCancelNotices {
    listener: PgListener,
}

#[async_trait]
impl CancelNotices for PgCancelNotices {
    async fn next(&mut self) -> HistoryResult<Option<String>> {
        // `try_recv`, not `recv`: a lost connection is `None` here (notices
        // may have been missed meanwhile), where `recv` would reconnect
        // without saying so.
        match self.listener.try_recv().await {
            Ok(Some(notice)) => Ok(Some(notice.payload().to_owned())),
            Ok(None) => Ok(None),
            Err(err) => Err(db_err(err)),
        }
    }
}

/// Where sqlx reads a certificate or key from (a file, or the PEM
/// itself): the URL's parameters (the last one given wins), else the
/// environment variable (libpq's).
const CERTIFICATE_SOURCES: [(&[&str], &str); 3] = [
    (&["sslrootcert", "ssl-root-cert", "ssl-ca"], "PGSSLROOTCERT"),
    (&["sslcert", "ssl-cert"], "PGSSLCERT"),
    (&["sslkey", "ssl-key"], "PGSSLKEY"),
];

/// The alerts by which a TLS server refuses the client's certificate (or
/// the lack of one), as rustls names them in "received fatal alert: NAME".
const CERTIFICATE_ALERTS: [&str; 8] = [
    "UnknownCA",
    "BadCertificate",
    "CertificateUnknown",
    "UnsupportedCertificate",
    "CertificateExpired",
    "CertificateRevoked",
    "CertificateRequired",
    "AccessDenied",
];

/// Whether the server ended the TLS handshake over the client certificate.
fn refused_certificate(err: &sqlx::Error) -> bool {
    let sqlx::Error::Io(io) = err else {
        return false;
    };
    io.kind() == std::io::ErrorKind::InvalidData
        && io
            .to_string()
            .strip_prefix("received fatal alert: ")
            .is_some_and(|alert| CERTIFICATE_ALERTS.contains(&alert))
}

/// Fails, naming the parameter (or variable) and the file, when a
/// certificate or key file the connection would read cannot be opened.
/// Returns which client certificate it presents, as `sslcert=FILE` or
/// `PGSSLCERT=FILE` (for messages; an inline PEM is not shown). A URL
/// that does not parse is left to sqlx.
fn check_certificate_files(url: &str) -> HistoryResult<Option<String>> {
    let Ok(parsed) = url::Url::parse(url) else {
        return Ok(None);
    };
    let mut client_certificate = None;
    for (parameters, variable) in CERTIFICATE_SOURCES {
        let from_url = parsed
            .query_pairs()
            .filter(|(key, _)| parameters.contains(&&**key))
            .last()
            .map(|(key, value)| (key.into_owned(), value.into_owned()));
        let Some((source, value)) = from_url.or_else(|| {
            std::env::var(variable)
                .ok()
                .map(|value| (variable.to_owned(), value))
        }) else {
            continue;
        };
        let shown = if value.trim_start().starts_with("-----BEGIN") {
            format!("{source} (inline PEM)")
        } else {
            if let Err(err) = std::fs::File::open(&value) {
                return Err(HistoryError::Unavailable(format!(
                    "cannot connect to postgres: {source}={value}: cannot read it: {err}"
                )));
            }
            format!("{source}={value}")
        };
        if variable == "PGSSLCERT" {
            client_certificate = Some(shown);
        }
    }
    Ok(client_certificate)
}

/// Now, in unix milliseconds, by the database's clock (heartbeats and
/// leases are compared on one clock, whatever the replicas' clocks say).
macro_rules! now_ms {
    () => {
        "(extract(epoch from clock_timestamp()) * 1000)::bigint"
    };
}

const QUERIES: Queries = Queries {
    begin_write: "BEGIN",
    upsert_response: "INSERT INTO responses
            (id, previous_response_id, conversation_id, model, status, created_at, input, output, raw,
            owner)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
        ON CONFLICT (id) DO UPDATE SET
            previous_response_id = excluded.previous_response_id,
            conversation_id = excluded.conversation_id,
            model = excluded.model,
            status = excluded.status,
            created_at = excluded.created_at,
            input = excluded.input,
            output = excluded.output,
            raw = excluded.raw,
            owner = excluded.owner",
    get_response: "SELECT id, previous_response_id, conversation_id, model, status, created_at,
            input, output, raw, owner
        FROM responses WHERE id = $1",
    delete_response: "DELETE FROM responses WHERE id = $1",
    // Walks previous_response_id by primary key, one row per step, newest
    // at depth 1; returned oldest first.
    response_chain: "WITH RECURSIVE chain (id, previous_response_id, depth) AS (
            SELECT id, previous_response_id, 1::bigint FROM responses WHERE id = $1
            UNION ALL
            SELECT r.id, r.previous_response_id, chain.depth + 1
            FROM chain JOIN responses r ON r.id = chain.previous_response_id
            WHERE chain.depth < $2
        )
        SELECT r.id, r.previous_response_id, r.conversation_id, r.model, r.status, r.created_at,
            r.input, r.output, r.raw, r.owner
        FROM chain JOIN responses r ON r.id = chain.id
        ORDER BY chain.depth DESC",
    insert_conversation: "INSERT INTO conversations (id, created_at, metadata)
        VALUES ($1, $2, $3)",
    get_conversation: "SELECT id, created_at, metadata FROM conversations WHERE id = $1",
    update_conversation: "UPDATE conversations SET metadata = $2 WHERE id = $1
        RETURNING id, created_at, metadata",
    delete_conversation: "DELETE FROM conversations WHERE id = $1",
    insert_item: "INSERT INTO conversation_items (id, conversation_id, created_at, item)
        VALUES ($1, $2, $3, $4)",
    list_asc: "SELECT id, conversation_id, created_at, item FROM conversation_items
        WHERE conversation_id = $1 ORDER BY seq ASC LIMIT $2",
    list_desc: "SELECT id, conversation_id, created_at, item FROM conversation_items
        WHERE conversation_id = $1 ORDER BY seq DESC LIMIT $2",
    list_asc_after: "SELECT id, conversation_id, created_at, item FROM conversation_items
        WHERE conversation_id = $1 AND seq > (
            SELECT seq FROM conversation_items WHERE conversation_id = $1 AND id = $3)
        ORDER BY seq ASC LIMIT $2",
    list_desc_after: "SELECT id, conversation_id, created_at, item FROM conversation_items
        WHERE conversation_id = $1 AND seq < (
            SELECT seq FROM conversation_items WHERE conversation_id = $1 AND id = $3)
        ORDER BY seq DESC LIMIT $2",
    get_item: "SELECT id, conversation_id, created_at, item FROM conversation_items
        WHERE conversation_id = $1 AND id = $2",
    delete_item: "DELETE FROM conversation_items WHERE conversation_id = $1 AND id = $2",
    heartbeat: concat!(
        "INSERT INTO history_instances (instance, heartbeat_at) VALUES ($1, ",
        now_ms!(),
        ")
        ON CONFLICT (instance) DO UPDATE SET heartbeat_at = excluded.heartbeat_at"
    ),
    // In flight, and: no owner; or this instance's own (when $2); or an
    // owner whose heartbeat is $3 ms old or older, or never came.
    orphans: concat!(
        "SELECT id, previous_response_id, conversation_id, model, status, created_at,
            input, output, raw, owner
        FROM responses r
        WHERE status IN ('queued', 'in_progress') AND (
            owner IS NULL
            OR (owner = $1 AND $2)
            OR (owner <> $1 AND NOT EXISTS (
                SELECT 1 FROM history_instances i
                WHERE i.instance = r.owner AND i.heartbeat_at > ",
        now_ms!(),
        " - $3)))
        ORDER BY id LIMIT $4"
    ),
    end_orphan: "UPDATE responses SET status = $2, output = $3, raw = $4, owner = NULL
        WHERE id = $1 AND status IN ('queued', 'in_progress') AND owner IS NOT DISTINCT FROM $5::text",
    // The flag and its notice in one statement (a notice is sent when the
    // statement commits); the SELECT's row count says whether it was set.
    request_cancel: concat!(
        "WITH flagged AS (
            UPDATE responses SET cancel_requested = TRUE
            WHERE id = $1 AND status IN ('queued', 'in_progress')
            RETURNING id)
        SELECT pg_notify('",
        cancel_channel!(),
        "', id) FROM flagged"
    ),
    cancel_requests: "SELECT id FROM responses
        WHERE owner = $1 AND status IN ('queued', 'in_progress') AND cancel_requested
        ORDER BY id",
};

sql_store!(PostgresStore, sqlx::Postgres, "postgres", QUERIES);
