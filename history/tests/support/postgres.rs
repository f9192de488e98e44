//! A real PostgreSQL server for the tests (and the benchmark) of one
//! binary, private to it.
//!
//! Why it exists: the postgres backend must pass the same contract as the
//! others against a real server, on a developer's machine and in CI alike,
//! without a system service or a fixed port. The first caller starts one
//! server (`initdb` into a temp dir, `postgres` on a free loopback port);
//! every test then gets a database of its own from [`fresh_database`].
//! With `SMG_TEST_POSTGRES_URL` set, that server is used instead (its role
//! must be allowed to CREATE DATABASE).
//!
//! The server dies with the test binary: it runs under a small `sh` that
//! holds the read end of a pipe whose write end only this process has. When
//! the process exits (or the [`PgServer`] is dropped), `read` sees the end
//! of the pipe, and the shell stops the server and removes its directory.
//! A `static` is never dropped, so this is what cleans up after a test
//! binary.
//!
//! There is no silent skip: with no server to be had, the test fails and
//! says how to get one.
//!
//! A test that must see the store go away (the gateway's outage tests in
//! smg's `tests/responses_storage.rs`) takes a server of its own from
//! [`private_server`], and stops and starts it again on the same port and
//! data directory: the shell also reads `stop` and `start` lines.
//!
//! A test of TLS takes a server of its own from [`private_tls_server`]:
//! `ssl=on` with a certificate for `127.0.0.1` issued, at start, by a CA
//! made for that server alone ([`PgServer::ca_file`] is what a client
//! trusts). The shared server stays without TLS, so the other tests and
//! the benchmark measure the store, not the handshake.
//!
//! A test of client certificates takes one from
//! [`private_client_certificate_server`]: the same, and its own
//! `pg_hba.conf` lets a session into a test's database only over TLS with a
//! certificate the server's CA issued to the role (`cert` authentication:
//! its common name is `smg`). The maintenance database `postgres` stays
//! open to `smg` without one, so making databases and waiting for the server
//! work as on the others. [`PgServer::client_identity`] is such a
//! certificate and key; [`PgServer::stranger_identity`] one for `smg` from
//! a CA the server does not know.

use std::{
    ffi::OsStr,
    io::{Read, Write},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use sqlx::{Connection, PgConnection};
use tokio::sync::OnceCell;

/// The variable naming an existing server to use instead.
pub const URL_VAR: &str = "SMG_TEST_POSTGRES_URL";
/// How long a fresh server may take to accept connections.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// Fresh ports to try if another process took the one picked.
const START_ATTEMPTS: usize = 3;

/// What postgres logs last when it stops (a start that failed, e.g. on a
/// port another process took, ends with it too). The shell outlives the
/// server until its stdin closes, so the log is the sign the server is gone.
const SHUT_DOWN: &str = "database system is shut down";

/// The shell that runs `postgres` until its standard input closes, then
/// stops it (fast shutdown) and removes the server's directory ($1).
/// Meanwhile a `stop` line stops the server (and leaves the file `stopped`
/// once it is down), a `start` line starts it again (with an empty log, and
/// `stopped` removed, before it runs).
const LIFELINE: &str = r#"dir="$1"; shift
run() { "$@" >"$dir/server.log" 2>&1 & pid=$!; }
run "$@"
while read -r order; do
  case "$order" in
    stop) kill -INT "$pid" 2>/dev/null; wait "$pid"; : >"$dir/stopped" ;;
    start) : >"$dir/server.log"; rm -f "$dir/stopped"; run "$@" ;;
  esac
done
kill -INT "$pid" 2>/dev/null
wait "$pid"
rm -rf "$dir""#;

/// The file the shell leaves while the server is stopped.
const STOPPED: &str = "stopped";

/// A running server, or the one named by `SMG_TEST_POSTGRES_URL`.
#[derive(Debug)]
pub struct PgServer {
    /// The URL of the server's maintenance database (`postgres`).
    admin_url: url::Url,
    /// The shell holding the server (none for an outside server).
    lifeline: Option<(Child, ChildStdin)>,
    /// The server's directory (none for an outside server).
    dir: Option<PathBuf>,
    /// The PEM file of the CA that issued the server's certificate (a
    /// server with TLS on only).
    ca: Option<PathBuf>,
    /// Client certificates: one the server's CA issued, one from another
    /// CA (a server that requires them only).
    clients: Option<(Identity, Identity)>,
}

/// A client certificate (PEM, for the role `smg`) and its private key
/// (PEM, mode 0600), as `sslcert` and `sslkey` name them.
#[derive(Debug, Clone)]
pub struct Identity {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Whether a server starts with TLS on, and whether its test databases
/// require a client certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tls {
    Off,
    On,
    ClientCertificates,
}

/// The `pg_hba.conf` of a server that requires client certificates: the
/// maintenance database as on the others (for [`PgServer::create_database`]
/// and the readiness poll), every other one over TLS with a certificate
/// naming the role.
const CLIENT_CERTIFICATE_HBA: &str = "\
local all all trust
host postgres smg 127.0.0.1/32 trust
hostssl all smg 127.0.0.1/32 cert
";

impl Drop for PgServer {
    fn drop(&mut self) {
        if let Some((mut shell, stdin)) = self.lifeline.take() {
            drop(stdin);
            let _ = shell.wait();
        }
    }
}

static SERVER: OnceCell<Result<PgServer, String>> = OnceCell::const_new();
static DATABASES: AtomicUsize = AtomicUsize::new(0);

/// This binary's server, started on first use. Panics, saying how to get a
/// server, when there is none to be had.
pub async fn server() -> &'static PgServer {
    let server = SERVER
        .get_or_init(|| async {
            match std::env::var(URL_VAR) {
                Ok(url) => PgServer::outside(&url),
                Err(_) => PgServer::start(Tls::Off).await,
            }
        })
        .await;
    match server {
        Ok(server) => server,
        Err(why) => panic!(
            "no PostgreSQL server for the history tests: {why}\n\
             Install Debian's `postgresql` package (`.ci/run` installs it when \
             `initdb` is missing) or set {URL_VAR} to a server whose role may \
             CREATE DATABASE."
        ),
    }
}

/// The URL of a new, empty database on this binary's server.
pub async fn fresh_database() -> String {
    server().await.create_database().await
}

/// A server of the caller's own, which it may stop and start again while
/// the shared one serves other tests. Always started here, even with
/// `SMG_TEST_POSTGRES_URL` set (an outside server is not ours to stop);
/// dropping it stops it and removes its files.
#[allow(dead_code)] // Used by smg's tests/responses_storage.rs.
pub async fn private_server() -> PgServer {
    start_private(Tls::Off).await
}

/// A server of the caller's own with TLS on (and plain connections still
/// allowed): its certificate names `127.0.0.1`, and [`PgServer::ca_file`]
/// is the CA that issued it.
#[allow(dead_code)] // Used by tests/contract.rs.
pub async fn private_tls_server() -> PgServer {
    start_private(Tls::On).await
}

/// A server of the caller's own with TLS on whose test databases take a
/// session only with a client certificate its CA issued to `smg`
/// ([`PgServer::client_identity`]); [`PgServer::ca_file`] is that CA.
#[allow(dead_code)] // Used by tests/contract.rs.
pub async fn private_client_certificate_server() -> PgServer {
    start_private(Tls::ClientCertificates).await
}

/// A new database on a server without TLS, and the server when it is one
/// of the caller's own: this binary's server, unless that is an outside
/// one (which may speak TLS), then a private one.
#[allow(dead_code)] // Used by tests/contract.rs.
pub async fn database_without_tls() -> (Option<PgServer>, String) {
    if std::env::var_os(URL_VAR).is_none() {
        return (None, fresh_database().await);
    }
    let server = private_server().await;
    let url = server.create_database().await;
    (Some(server), url)
}

async fn start_private(tls: Tls) -> PgServer {
    PgServer::start(tls).await.unwrap_or_else(|why| {
        panic!(
            "no private PostgreSQL server for this test: {why}\n\
             Install Debian's `postgresql` package (`.ci/run` installs it when \
             `initdb` is missing)."
        )
    })
}

impl PgServer {
    fn outside(url: &str) -> Result<Self, String> {
        let admin_url =
            url::Url::parse(url).map_err(|err| format!("{URL_VAR} is not a URL: {err}"))?;
        Ok(Self {
            admin_url,
            lifeline: None,
            dir: None,
            ca: None,
            clients: None,
        })
    }

    /// The PEM file of the CA that issued a TLS server's certificate (what
    /// `sslrootcert` names).
    #[allow(dead_code)] // Used by tests/contract.rs.
    pub fn ca_file(&self) -> &Path {
        self.ca
            .as_deref()
            .expect("a server started by private_tls_server")
    }

    /// A client certificate for `smg` issued by the server's CA, and its
    /// key.
    #[allow(dead_code)] // Used by tests/contract.rs.
    pub fn client_identity(&self) -> &Identity {
        &self.clients().0
    }

    /// A client certificate for `smg` issued by a CA the server does not
    /// trust, and its key.
    #[allow(dead_code)] // Used by tests/contract.rs.
    pub fn stranger_identity(&self) -> &Identity {
        &self.clients().1
    }

    fn clients(&self) -> &(Identity, Identity) {
        self.clients
            .as_ref()
            .expect("a server started by private_client_certificate_server")
    }

    /// The server's directory and the shell's stdin, for [`Self::stop`]
    /// and [`Self::start_again`].
    fn own(&mut self) -> (&Path, &mut ChildStdin) {
        match (&self.dir, &mut self.lifeline) {
            (Some(dir), Some((_, stdin))) => (dir, stdin),
            _ => panic!("an outside server cannot be stopped or started"),
        }
    }

    /// Stops the server (fast shutdown: its sessions are ended) and returns
    /// once it is down; its data stays.
    #[allow(dead_code)] // Used by smg's tests/responses_storage.rs.
    pub async fn stop(&mut self) {
        let (dir, stdin) = self.own();
        writeln!(stdin, "stop").expect("tell the shell to stop the server");
        let stopped = dir.join(STOPPED);
        wait_for("the server to stop", || stopped.exists()).await;
    }

    /// Starts a [`Self::stop`]ped server again on the same port and data,
    /// and returns once it accepts connections.
    #[allow(dead_code)] // Used by smg's tests/responses_storage.rs.
    pub async fn start_again(&mut self) {
        let (dir, stdin) = self.own();
        writeln!(stdin, "start").expect("tell the shell to start the server");
        let stopped = dir.join(STOPPED);
        wait_for("the shell to start the server", || !stopped.exists()).await;
        let dir = dir.to_owned();
        if let Err(why) = self.wait_ready(&dir).await {
            panic!("the server did not start again: {why}");
        }
    }

    /// A new database, named after this process and a counter.
    pub async fn create_database(&self) -> String {
        let name = format!(
            "smg_test_{}_{}",
            std::process::id(),
            DATABASES.fetch_add(1, Ordering::Relaxed)
        );
        let mut admin = PgConnection::connect(self.admin_url.as_str())
            .await
            .unwrap_or_else(|err| panic!("cannot reach the test server: {err}"));
        sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut admin)
            .await
            .unwrap_or_else(|err| panic!("cannot create database {name}: {err}"));
        let _ = admin.close().await;
        let mut url = self.admin_url.clone();
        url.set_path(&format!("/{name}"));
        url.to_string()
    }

    /// `initdb` into a temp dir, then `postgres` on a free loopback port
    /// (with a certificate made now, when `tls` is on).
    /// A start that fails leaves no directory behind (a server that did
    /// start removes its own when it stops).
    async fn start(tls: Tls) -> Result<Self, String> {
        let bin = find_bin_dir().ok_or_else(|| {
            "no `initdb` and `postgres` in PATH or /usr/lib/postgresql/*/bin".to_owned()
        })?;
        let dir = tempfile::Builder::new()
            .prefix("smg-pg-")
            .tempdir()
            .map_err(|err| format!("cannot make a temp dir: {err}"))?
            .keep();
        let started = Self::start_in(&bin, &dir, tls).await;
        if started.is_err() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        started
    }

    async fn start_in(bin: &Path, dir: &Path, tls: Tls) -> Result<Self, String> {
        let as_postgres = nix::unistd::geteuid().is_root();
        // initdb refuses to run as root: the server's files belong to the
        // `postgres` system user (Debian's package makes it).
        let owner = if as_postgres {
            let user = nix::unistd::User::from_name("postgres")
                .ok()
                .flatten()
                .ok_or("running as root and there is no `postgres` user to run the server as")?;
            Some((user.uid.as_raw(), user.gid.as_raw()))
        } else {
            None
        };
        let give = |path: &Path| match owner {
            Some((uid, gid)) => std::os::unix::fs::chown(path, Some(uid), Some(gid))
                .map_err(|err| format!("cannot chown {}: {err}", path.display())),
            None => Ok(()),
        };
        give(dir)?;
        let mut tls_settings = Vec::new();
        let mut clients = None;
        let ca = match tls {
            Tls::Off => None,
            Tls::On | Tls::ClientCertificates => {
                let files = make_certificates(dir, tls == Tls::ClientCertificates)?;
                give(&files.cert)?;
                give(&files.key)?;
                tls_settings = vec![
                    "-c".to_owned(),
                    "ssl=on".to_owned(),
                    "-c".to_owned(),
                    format!("ssl_cert_file={}", files.cert.display()),
                    "-c".to_owned(),
                    format!("ssl_key_file={}", files.key.display()),
                ];
                if let Some(issued) = files.clients {
                    let hba = dir.join("pg_hba.conf");
                    std::fs::write(&hba, CLIENT_CERTIFICATE_HBA)
                        .map_err(|err| format!("cannot write {}: {err}", hba.display()))?;
                    give(&hba)?;
                    tls_settings.extend([
                        "-c".to_owned(),
                        format!("ssl_ca_file={}", files.ca.display()),
                        "-c".to_owned(),
                        format!("hba_file={}", hba.display()),
                    ]);
                    clients = Some(issued);
                }
                Some(files.ca)
            }
        };
        let data = dir.join("data");
        let initdb = command(as_postgres, &bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args([
                "--auth=trust",
                "-U",
                "smg",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .output()
            .map_err(|err| format!("cannot run initdb: {err}"))?;
        if !initdb.status.success() {
            return Err(format!(
                "initdb failed ({}): {}",
                initdb.status,
                String::from_utf8_lossy(&initdb.stderr)
            ));
        }

        let mut last_error = String::new();
        for _ in 0..START_ATTEMPTS {
            let port = free_port()?;
            let mut shell = command(as_postgres, Path::new("sh"))
                .args(["-c", LIFELINE, "lifeline"])
                .arg(dir)
                .arg(bin.join("postgres"))
                .arg("-D")
                .arg(&data)
                .arg("-k")
                .arg(dir)
                .arg("-p")
                .arg(port.to_string())
                .args(["-c", "listen_addresses=127.0.0.1"])
                .args(&tls_settings)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|err| format!("cannot start postgres: {err}"))?;
            let stdin = shell.stdin.take().ok_or("the shell has no stdin")?;
            let server = Self {
                admin_url: url::Url::parse(&format!("postgres://smg@127.0.0.1:{port}/postgres"))
                    .map_err(|err| err.to_string())?,
                lifeline: Some((shell, stdin)),
                dir: Some(dir.to_owned()),
                ca: ca.clone(),
                clients: clients.clone(),
            };
            match server.wait_ready(dir).await {
                Ok(()) => return Ok(server),
                // Dropping `server` stops what is left of it.
                Err(why) => last_error = why,
            }
        }
        Err(last_error)
    }

    /// Polls a connection until the server accepts one (bounded).
    async fn wait_ready(&self, dir: &Path) -> Result<(), String> {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            match PgConnection::connect(self.admin_url.as_str()).await {
                Ok(conn) => {
                    let _ = conn.close().await;
                    return Ok(());
                }
                Err(err) if Instant::now() >= deadline => {
                    return Err(format!(
                        "postgres did not accept connections within {READY_WITHIN:?} ({err}); \
                         its log: {}",
                        read_log(dir)
                    ));
                }
                Err(_) => {}
            }
            let log = read_log(dir);
            if log.contains(SHUT_DOWN) {
                return Err(format!("postgres exited at start; its log: {log}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Polls `done` until it holds, panicking after [`READY_WITHIN`].
async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + READY_WITHIN;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "waited {READY_WITHIN:?} for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The files of a TLS server, in its directory.
struct TlsFiles {
    /// The CA's certificate (PEM), for clients.
    ca: PathBuf,
    /// The server's certificate (PEM), issued by the CA for `127.0.0.1`.
    cert: PathBuf,
    /// Its private key (PEM, mode 0600: postgres refuses a key others may
    /// read).
    key: PathBuf,
    /// Client certificates for `smg`: from the CA, and from another CA.
    clients: Option<(Identity, Identity)>,
}

/// A CA made for one server, and the certificate it issues that server
/// (and, with `clients`, a client certificate it issues `smg`, and one
/// for `smg` from a second CA).
fn make_certificates(dir: &Path, clients: bool) -> Result<TlsFiles, String> {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
        IsCa, KeyPair,
    };
    use std::os::unix::fs::PermissionsExt;

    let failed = |what: &'static str| move |err: rcgen::Error| format!("cannot make {what}: {err}");
    let make_ca = |name: &str| {
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(failed("CA params"))?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        CertifiedIssuer::self_signed(params, KeyPair::generate().map_err(failed("a key"))?)
            .map_err(failed("the CA"))
    };
    let write = |path: &Path, text: String| {
        std::fs::write(path, text).map_err(|err| format!("cannot write {}: {err}", path.display()))
    };
    let restrict = |path: &Path| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|err| format!("cannot restrict {}: {err}", path.display()))
    };
    let ca = make_ca("smg history test CA")?;
    let mut params =
        CertificateParams::new(vec!["127.0.0.1".to_owned()]).map_err(failed("server params"))?;
    params
        .distinguished_name
        .push(DnType::CommonName, "smg history test server");
    let key = KeyPair::generate().map_err(failed("a key"))?;
    let cert = params
        .signed_by(&key, &ca)
        .map_err(failed("the server's certificate"))?;
    // A certificate for the role `smg` (`cert` authentication matches
    // its common name), issued by `issuer`, written as NAME.crt and
    // NAME.key.
    let client = |issuer: &CertifiedIssuer<'_, KeyPair>, name: &str| {
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(failed("client params"))?;
        params.distinguished_name.push(DnType::CommonName, "smg");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().map_err(failed("a key"))?;
        let cert = params
            .signed_by(&key, issuer)
            .map_err(failed("a client certificate"))?;
        let identity = Identity {
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
        };
        write(&identity.cert, cert.pem())?;
        write(&identity.key, key.serialize_pem())?;
        restrict(&identity.key)?;
        Ok::<_, String>(identity)
    };
    let clients = if clients {
        let stranger_ca = make_ca("a CA the server does not know")?;
        Some((client(&ca, "client")?, client(&stranger_ca, "stranger")?))
    } else {
        None
    };
    let files = TlsFiles {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.crt"),
        key: dir.join("server.key"),
        clients,
    };
    write(&files.ca, ca.pem())?;
    write(&files.cert, cert.pem())?;
    write(&files.key, key.serialize_pem())?;
    restrict(&files.key)?;
    Ok(files)
}

fn command(as_postgres: bool, program: &Path) -> Command {
    if as_postgres {
        let mut command = Command::new("runuser");
        command.args([OsStr::new("-u"), OsStr::new("postgres"), OsStr::new("--")]);
        command.arg(program);
        command
    } else {
        Command::new(program)
    }
}

/// A port nobody listens on now (the server binds it a moment later; a
/// clash makes it exit, and start picks another).
fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|err| err.to_string())?;
    listener
        .local_addr()
        .map(|addr| addr.port())
        .map_err(|err| err.to_string())
}

fn read_log(dir: &Path) -> String {
    let mut log = String::new();
    match std::fs::File::open(dir.join("server.log")) {
        Ok(mut file) => {
            let _ = file.read_to_string(&mut log);
            log
        }
        Err(err) => format!("(no log: {err})"),
    }
}

/// The directory with `initdb` and `postgres`: PATH first, then Debian's
/// versioned directories, newest first.
fn find_bin_dir() -> Option<PathBuf> {
    let has_both = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    if let Some(path) = std::env::var_os("PATH")
        && let Some(dir) = std::env::split_paths(&path).find(|dir| has_both(dir))
    {
        return Some(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, bin)| has_both(bin))
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}
