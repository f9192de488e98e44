//! Runs the one contract suite (`support/suite.rs`) on every backend: each
//! case becomes one test per backend, `memory::<case>` and so on.

#![allow(clippy::unwrap_used)]

mod support;

use std::{sync::Arc, time::Duration};

use smg_history::{HistoryConfig, HistoryError, HistoryStore, open};

/// One test per case for a backend: `$fixture` is an async expression
/// giving something with `store()`.
macro_rules! run_cases {
    ($fixture:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let fixture = $fixture.await;
                support::suite::$case(fixture.store()).await;
            }
        )*
    };
}

/// A store and whatever must outlive it (a temp dir, a database).
struct Fixture {
    store: Arc<dyn HistoryStore>,
    _dir: Option<tempfile::TempDir>,
}

impl Fixture {
    fn store(&self) -> &dyn HistoryStore {
        self.store.as_ref()
    }
}

async fn memory() -> Fixture {
    Fixture {
        store: open(&HistoryConfig::Memory).await.unwrap(),
        _dir: None,
    }
}

/// A fresh database file in a directory of its own (created by open).
async fn sqlite() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/dirs/history.db");
    Fixture {
        store: open(&HistoryConfig::Sqlite { path }).await.unwrap(),
        _dir: Some(dir),
    }
}

/// A postgres config for `url` with a pool of `max_connections`, waiting
/// at most 5 s for a connection (the gateway's default).
fn postgres_at(url: &str, max_connections: u32) -> HistoryConfig {
    HistoryConfig::Postgres {
        url: url.to_owned(),
        max_connections,
        connect_timeout: Duration::from_secs(5),
    }
}

/// A new database on this binary's private server (or
/// `SMG_TEST_POSTGRES_URL`'s).
async fn postgres() -> Fixture {
    let url = support::postgres::fresh_database().await;
    Fixture {
        store: open(&postgres_at(&url, 4)).await.unwrap(),
        _dir: None,
    }
}

mod memory {
    use super::*;
    for_each_case!(run_cases!(memory()));
}

mod sqlite {
    use super::*;
    for_each_case!(run_cases!(sqlite()));

    /// Neither in-process store pushes cancel notices: their owners ask.
    #[tokio::test]
    async fn memory_and_sqlite_push_no_cancel_notices() {
        for fixture in [memory().await, super::sqlite().await] {
            assert!(fixture.store().cancel_notices().await.unwrap().is_none());
        }
    }

    /// What one store wrote, a store opened later on the same file reads:
    /// the gateway keeps its history across restarts.
    #[tokio::test]
    async fn a_reopened_file_keeps_everything() {
        let dir = tempfile::tempdir().unwrap();
        let config = HistoryConfig::Sqlite {
            path: dir.path().join("history.db"),
        };
        let store = open(&config).await.unwrap();
        support::suite::write_a_sample(store.as_ref()).await;
        drop(store);
        let reopened = open(&config).await.unwrap();
        support::suite::read_the_sample(reopened.as_ref()).await;
    }

    /// The file is in WAL mode (a property of the file, seen by any
    /// connection), and a row whose JSON does not parse reads as Corrupt.
    #[tokio::test]
    async fn the_file_is_wal_and_a_broken_row_is_corrupt() {
        use sqlx::Connection;

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.db");
        let store = open(&HistoryConfig::Sqlite { path: path.clone() })
            .await
            .unwrap();
        store
            .save_response(&support::suite::response("resp_broken", None), &[])
            .await
            .unwrap();

        let mut raw = sqlx::SqliteConnection::connect_with(
            &sqlx::sqlite::SqliteConnectOptions::new().filename(&path),
        )
        .await
        .unwrap();
        let (mode,): (String,) = sqlx::query_as("PRAGMA journal_mode")
            .fetch_one(&mut raw)
            .await
            .unwrap();
        assert_eq!(mode, "wal");
        sqlx::query("UPDATE responses SET raw = '{not json' WHERE id = 'resp_broken'")
            .execute(&mut raw)
            .await
            .unwrap();

        let err = store.get_response("resp_broken").await.unwrap_err();
        assert!(matches!(err, HistoryError::Corrupt(_)), "{err:?}");
        let err = store.response_chain("resp_broken", 10).await.unwrap_err();
        assert!(matches!(err, HistoryError::Corrupt(_)), "{err:?}");
    }
}

mod postgres {
    use sqlx::Connection;

    use super::*;
    for_each_case!(run_cases!(postgres()));

    /// Replicas that start together race to migrate one database: the
    /// migrator's advisory lock lets one run it, the others find it done.
    /// Then one replica reads the chain another wrote.
    #[tokio::test]
    async fn stores_opened_at_once_migrate_once_and_share_history() {
        let url = support::postgres::fresh_database().await;
        let config = postgres_at(&url, 2);
        let (a, b, c) = tokio::join!(open(&config), open(&config), open(&config));
        let (a, b, c) = (a.unwrap(), b.unwrap(), c.unwrap());

        support::suite::write_a_sample(a.as_ref()).await;
        support::suite::read_the_sample(b.as_ref()).await;
        assert_eq!(
            c.response_chain("sample_3", 2)
                .await
                .unwrap()
                .iter()
                .map(|r| r.id.as_str())
                .collect::<Vec<_>>(),
            ["sample_2", "sample_3"]
        );

        let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
        let (applied,): (i64,) = sqlx::query_as("SELECT count(*) FROM _sqlx_migrations")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        let migrations = std::fs::read_dir("migrations/postgres").unwrap().count();
        assert_eq!(applied, i64::try_from(migrations).unwrap(), "each once");
    }

    /// A cancel requested through one store reaches the listener of
    /// another on the same database at once, as a notice carrying the id
    /// (the owner learns of it without waiting for its next heartbeat);
    /// a request that records nothing (the response has ended) sends none.
    /// The listening connection is not one of the pool's: with a pool of
    /// one, calls still get a connection while the listener holds its own.
    #[tokio::test]
    async fn a_cancel_requested_by_one_store_is_notified_to_another() {
        let url = support::postgres::fresh_database().await;
        let config = postgres_at(&url, 1);
        let (owner, other) = tokio::join!(open(&config), open(&config));
        let (owner, other) = (owner.unwrap(), other.unwrap());
        let mut notices = owner
            .cancel_notices()
            .await
            .unwrap()
            .expect("postgres pushes");
        let running = smg_history::StoredResponse {
            status: "in_progress".into(),
            owner: Some("a".into()),
            ..support::suite::response("resp_notified", None)
        };
        owner.save_response(&running, &[]).await.unwrap();
        other
            .save_response(&support::suite::response("resp_ended", None), &[])
            .await
            .unwrap();
        assert!(!other.request_cancel("resp_ended").await.unwrap());
        assert!(other.request_cancel("resp_notified").await.unwrap());
        let notice = tokio::time::timeout(Duration::from_secs(30), notices.next())
            .await
            .expect("a notice within 30 s")
            .unwrap();
        assert_eq!(notice.as_deref(), Some("resp_notified"), "the first notice");
    }

    /// The server stops under an open store whose calls may wait 120 s
    /// for a connection. Each call fails within the 30 s bound (so without
    /// waiting for the pool) as `Unreachable`, with the cause in words a
    /// client may see and the server's address for the log; once the
    /// server is back, the store finds it again and reads what it wrote.
    #[tokio::test]
    async fn an_outage_fails_calls_at_once_with_its_cause_until_the_server_is_back() {
        let mut server = support::postgres::private_server().await;
        let url = server.create_database().await;
        let store = open(&HistoryConfig::Postgres {
            url,
            max_connections: 2,
            connect_timeout: Duration::from_secs(120),
        })
        .await
        .unwrap();
        let before = support::suite::response("resp_before", None);
        store.save_response(&before, &[]).await.unwrap();

        server.stop().await;
        for _ in 0..3 {
            let err =
                tokio::time::timeout(Duration::from_secs(30), store.get_response("resp_before"))
                    .await
                    .expect("fails within 30 s")
                    .unwrap_err();
            let HistoryError::Unreachable { cause, detail } = err else {
                panic!("{err:?}");
            };
            assert_eq!(cause, "connection refused");
            assert!(
                detail.starts_with("cannot connect to postgres at 127.0.0.1:"),
                "{detail}"
            );
        }

        server.start_again().await;
        let found = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                if let Ok(found) = store.get_response("resp_before").await {
                    return found;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the store finds the server back within 30 s");
        assert_eq!(found, Some(before));
    }

    /// A postgres config for `url`, with a small pool.
    fn at(url: &str) -> HistoryConfig {
        postgres_at(url, 2)
    }

    /// `sslmode=verify-full` with the server's CA in `sslrootcert`: the
    /// store works, every session it opened is encrypted as the server
    /// sees it, and the certificate was checked: without the CA it is
    /// refused, and so it is under a name it does not carry (`localhost`;
    /// the certificate names `127.0.0.1`). `verify-ca` refuses that name
    /// too, although libpq's would not: sqlx 0.8 misses rustls' newer
    /// name-mismatch error (transact-rs/sqlx#3793, fixed in sqlx 0.9), as
    /// the README says; this pins it so an upgrade shows. `require`
    /// encrypts without checking anything, with `sslrootcert` or without.
    #[tokio::test]
    async fn verify_full_with_sslrootcert_stores_over_tls_and_checks_the_certificate() {
        let server = support::postgres::private_tls_server().await;
        let url = server.create_database().await;
        let ca = server.ca_file().display().to_string();
        let verified = format!("{url}?sslmode=verify-full&sslrootcert={ca}");
        let store = open(&at(&verified)).await.unwrap();
        support::suite::write_a_sample(store.as_ref()).await;
        support::suite::read_the_sample(store.as_ref()).await;

        let mut conn = sqlx::PgConnection::connect(&verified).await.unwrap();
        let (encrypted, plain): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl)
             FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
             WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap();
        assert!(encrypted >= 1, "the store holds an encrypted session");
        assert_eq!(plain, 0, "and no plain one");
        drop(store);

        let refused = |url: String| async move {
            let err = open(&at(&url)).await.unwrap_err();
            assert!(matches!(err, HistoryError::Unavailable(_)), "{err:?}");
            err.to_string()
        };
        let message = refused(format!("{url}?sslmode=verify-full")).await;
        assert!(message.contains("UnknownIssuer"), "{message}");
        let by_name = url.replace("127.0.0.1", "localhost");
        let message = refused(format!("{by_name}?sslmode=verify-full&sslrootcert={ca}")).await;
        assert!(message.contains("not valid for name"), "{message}");
        let message = refused(format!("{by_name}?sslmode=verify-ca&sslrootcert={ca}")).await;
        assert!(message.contains("not valid for name"), "{message}");
        open(&at(&format!("{url}?sslmode=verify-ca&sslrootcert={ca}")))
            .await
            .unwrap();
        open(&at(&format!("{url}?sslmode=require"))).await.unwrap();
        open(&at(&format!("{by_name}?sslmode=require&sslrootcert={ca}")))
            .await
            .unwrap();
    }

    /// A server whose databases take a session only with a client
    /// certificate its CA issued to the role (`cert` in its pg_hba.conf).
    /// With that certificate and key in `sslcert` and `sslkey` the store
    /// works, over TLS, and the server saw the certificate. Without one, the
    /// open fails with the server's reason; with a certificate for the same
    /// role from another CA, with the handshake's; in both, no byte of the
    /// key's file is in the message (the URL's paths may be).
    #[tokio::test]
    async fn a_client_certificate_in_the_url_is_presented_and_checked() {
        let server = support::postgres::private_client_certificate_server().await;
        let url = server.create_database().await;
        let ca = server.ca_file().display().to_string();
        let verified = format!("{url}?sslmode=verify-full&sslrootcert={ca}");
        let with = |identity: &support::postgres::Identity| {
            format!(
                "{verified}&sslcert={}&sslkey={}",
                identity.cert.display(),
                identity.key.display()
            )
        };
        let store = open(&at(&with(server.client_identity()))).await.unwrap();
        support::suite::write_a_sample(store.as_ref()).await;
        support::suite::read_the_sample(store.as_ref()).await;

        let mut conn = sqlx::PgConnection::connect(&with(server.client_identity()))
            .await
            .unwrap();
        let (encrypted, certified, plain): (i64, i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE s.ssl),
                count(*) FILTER (WHERE s.client_dn = '/CN=smg'),
                count(*) FILTER (WHERE NOT s.ssl)
             FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
             WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap();
        assert!(encrypted >= 1, "the store holds an encrypted session");
        assert_eq!(certified, encrypted, "each with the client certificate");
        assert_eq!(plain, 0, "and no plain one");
        drop(store);

        let key = std::fs::read_to_string(&server.stranger_identity().key).unwrap();
        let refused = |url: String| {
            let key = key.clone();
            async move {
                let err = open(&at(&url)).await.unwrap_err();
                assert!(matches!(err, HistoryError::Unavailable(_)), "{err:?}");
                let message = err.to_string();
                for line in key.lines().filter(|line| !line.starts_with("-----")) {
                    assert!(!message.contains(line), "{message}");
                }
                message
            }
        };
        let message = refused(verified.clone()).await;
        assert!(
            message.contains("connection requires a valid client certificate"),
            "{message}"
        );
        let message = refused(with(server.stranger_identity())).await;
        assert!(
            message.ends_with(&format!(
                "received fatal alert: UnknownCA (the server refused the client certificate: \
                 sslcert={})",
                server.stranger_identity().cert.display()
            )),
            "{message}"
        );
    }

    /// The certificate and key are read at each new connection: replaced
    /// under an open store by ones the server refuses, the next connection
    /// fails with that cause (in words a client may see); put back, the
    /// store finds the server again. So a rotated certificate takes effect
    /// without a restart.
    #[tokio::test]
    async fn a_client_certificate_is_read_at_each_connection() {
        let server = support::postgres::private_client_certificate_server().await;
        let url = server.create_database().await;
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("smg.crt"), dir.path().join("smg.key"));
        let install = |identity: &support::postgres::Identity| {
            std::fs::copy(&identity.cert, &cert).unwrap();
            std::fs::copy(&identity.key, &key).unwrap();
        };
        install(server.client_identity());
        let store = open(&HistoryConfig::Postgres {
            url: format!(
                "{url}?sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
                server.ca_file().display(),
                cert.display(),
                key.display()
            ),
            max_connections: 1,
            connect_timeout: Duration::from_secs(5),
        })
        .await
        .unwrap();

        // The open's own connection is closed, and the pool connects
        // lazily: the first call makes a connection with the new files.
        install(server.stranger_identity());
        let err = store.get_response("resp_absent").await.unwrap_err();
        let HistoryError::Unreachable { cause, detail } = err else {
            panic!("{err:?}");
        };
        assert_eq!(cause, "the server refused the client certificate");
        assert!(detail.contains("UnknownCA"), "{detail}");

        install(server.client_identity());
        let response = support::suite::response("resp_rotated", None);
        tokio::time::timeout(Duration::from_secs(30), async {
            while store.save_response(&response, &[]).await.is_err() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the store finds the server again within 30 s");
        assert_eq!(
            store.get_response("resp_rotated").await.unwrap(),
            Some(response)
        );
    }

    /// Run by [`libpq_environment_variables_set_tls_and_the_client_certificate`]
    /// in a process of its own, whose environment the parent sets (a test
    /// must not change the environment the other tests' threads read).
    /// Opens the store at the bare URL in `SMG_TEST_HISTORY_URL` and says
    /// what happened on stdout: `opened: ` with the sessions' TLS as the
    /// server saw them, or `refused: ` and the error.
    #[tokio::test]
    #[ignore = "the child process of libpq_environment_variables_set_tls_and_the_client_certificate"]
    async fn libpq_environment_child() {
        let url = std::env::var("SMG_TEST_HISTORY_URL").unwrap();
        match open(&at(&url)).await {
            Ok(store) => {
                support::suite::write_a_sample(store.as_ref()).await;
                support::suite::read_the_sample(store.as_ref()).await;
                let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
                let (ssl, client): (bool, Option<String>) = sqlx::query_as(
                    "SELECT ssl, client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                )
                .fetch_one(&mut conn)
                .await
                .unwrap();
                println!("opened: ssl={ssl} client={}", client.unwrap_or_default());
            }
            Err(err) => println!("refused: {err}"),
        }
    }

    /// sqlx reads libpq's `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT` and
    /// `PGSSLKEY` under the URL: with them alone (a URL without
    /// parameters) the store connects verified, with the client
    /// certificate. A file a variable names that is not there fails the
    /// open naming the variable and the file.
    #[tokio::test]
    async fn libpq_environment_variables_set_tls_and_the_client_certificate() {
        let server = support::postgres::private_client_certificate_server().await;
        let url = server.create_database().await;
        let identity = server.client_identity();
        let child = |cert: &std::path::Path| {
            let output = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "postgres::libpq_environment_child",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("SMG_TEST_HISTORY_URL", &url)
                .env("PGSSLMODE", "verify-full")
                .env("PGSSLROOTCERT", server.ca_file())
                .env("PGSSLCERT", cert)
                .env("PGSSLKEY", &identity.key)
                .output()
                .unwrap();
            assert!(output.status.success(), "{output:?}");
            String::from_utf8(output.stdout)
                .unwrap()
                .lines()
                // The harness prints "test NAME ... " before the line.
                .find_map(|line| {
                    ["opened: ", "refused: "]
                        .iter()
                        .find_map(|tag| line.find(tag).map(|at| line[at..].to_owned()))
                })
                .expect("the child says what happened")
        };
        assert_eq!(child(&identity.cert), "opened: ssl=true client=/CN=smg");
        let missing = std::path::Path::new("/nonexistent/smg.crt");
        let said = child(missing);
        assert!(
            said.starts_with("refused: ")
                && said.contains("PGSSLCERT=/nonexistent/smg.crt: cannot read it"),
            "{said}"
        );
    }

    /// A server without TLS: `sslmode=require` fails the open with sqlx's
    /// reason; `prefer` (the default) goes on in plain text. A
    /// certificate file that is not there fails before any connection,
    /// naming the parameter and the file.
    #[tokio::test]
    async fn a_server_without_tls_refuses_sslmode_require_clearly() {
        let (_server, url) = support::postgres::database_without_tls().await;
        let err = open(&at(&format!("{url}?sslmode=require")))
            .await
            .unwrap_err();
        assert!(matches!(err, HistoryError::Unavailable(_)), "{err:?}");
        assert!(
            err.to_string().contains("server does not support TLS"),
            "{err}"
        );

        let store = open(&at(&format!("{url}?sslmode=prefer"))).await.unwrap();
        let response = support::suite::response("resp_plain", None);
        store.save_response(&response, &[]).await.unwrap();
        assert_eq!(
            store.get_response("resp_plain").await.unwrap(),
            Some(response)
        );

        let err = open(&at(&format!(
            "{url}?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem"
        )))
        .await
        .unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("sslrootcert=/nonexistent/ca.pem: cannot read it"),
            "{message}"
        );
    }

    /// A server that cannot be reached is Unavailable at once, with the
    /// cause and the address: with a connect timeout of a minute, an open
    /// that waited for it (as sqlx's pool does on a refused connection)
    /// would fail the 30 s bound. The message never echoes the URL's
    /// password, nor does that of a URL sqlx cannot parse.
    #[tokio::test]
    async fn an_unreachable_server_fails_at_once_with_its_cause_and_without_the_password() {
        let minute = |url: &str| HistoryConfig::Postgres {
            url: url.to_owned(),
            max_connections: 1,
            connect_timeout: Duration::from_secs(60),
        };
        let bounded = |config: HistoryConfig| async move {
            tokio::time::timeout(Duration::from_secs(30), open(&config))
                .await
                .expect("open fails within 30 s")
                .unwrap_err()
        };
        // Port 1 on loopback: nothing listens there.
        let err = bounded(minute("postgres://smg:hunter2-secret@127.0.0.1:1/history")).await;
        assert!(matches!(err, HistoryError::Unavailable(_)), "{err:?}");
        let message = err.to_string();
        assert!(
            message.contains("cannot connect to postgres at 127.0.0.1:1: ")
                && message.contains("Connection refused"),
            "{message}"
        );
        assert!(!message.contains("hunter2-secret"), "{message}");

        let err = bounded(minute(
            "postgres://smg:hunter2-secret@127.0.0.1:notaport/history",
        ))
        .await;
        assert!(matches!(err, HistoryError::Unavailable(_)), "{err:?}");
        assert!(!err.to_string().contains("hunter2-secret"), "{err}");
    }

    /// A server that takes the connection and never answers fails the
    /// open when the connect timeout runs out, saying so. The listener
    /// never accepts: the kernel completes the handshake, and the first
    /// byte sqlx waits for never comes.
    #[tokio::test]
    async fn a_server_that_never_answers_fails_the_open_after_the_connect_timeout() {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = silent.local_addr().unwrap();
        let config = HistoryConfig::Postgres {
            url: format!("postgres://smg@{address}/history"),
            max_connections: 1,
            connect_timeout: Duration::from_secs(1),
        };
        let err = tokio::time::timeout(Duration::from_secs(30), open(&config))
            .await
            .expect("open fails within 30 s")
            .unwrap_err();
        assert!(matches!(err, HistoryError::Unavailable(_)), "{err:?}");
        assert_eq!(
            err.to_string(),
            format!(
                "history store unavailable: cannot connect to postgres at {address}: \
                 no answer within 1s"
            )
        );
    }
}
