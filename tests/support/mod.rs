//! Shared harness for the end-to-end tests: starts real `smg-sim-worker`
//! processes on loopback (ephemeral ports, read back from their ready line),
//! kills them on drop, and computes the digests a worker's output must carry.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub mod chat;
#[path = "../sim-worker/digest.rs"]
pub mod digest;
pub mod mcp;
pub mod media;
pub mod proxy;
pub mod responses;
pub mod shm;

/// How long a worker may take to print its ready line.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

pub fn model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/model")
}

pub fn tokenizer() -> tokenizers::Tokenizer {
    tokenizers::Tokenizer::from_file(model_dir().join("tokenizer.json")).expect("fixture tokenizer")
}

/// Decodes ids the way a gateway shows them to a user.
pub fn decode(ids: &[u32]) -> String {
    tokenizer().decode(ids, true).expect("decodable ids")
}

/// Encodes text without special tokens.
pub fn encode(text: &str) -> Vec<u32> {
    tokenizer()
        .encode(text, false)
        .expect("encodable text")
        .get_ids()
        .to_vec()
}

/// A process's stdout, line by line, read on a thread of its own so the
/// process never blocks on a full pipe.
fn stdout_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().expect("piped stdout");
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = sender.send(line);
        }
    });
    receiver
}

/// The `host:port` of every worker URL named after `--worker-urls`,
/// `--prefill`, `--decode` or `--encode` in a launch command's arguments.
fn named_worker_addresses<'a>(args: impl Iterator<Item = &'a std::ffi::OsStr>) -> Vec<String> {
    let mut addresses = Vec::new();
    let mut in_list = false;
    for arg in args.filter_map(|arg| arg.to_str()) {
        if arg.starts_with("--") {
            in_list = matches!(arg, "--worker-urls" | "--prefill" | "--decode" | "--encode");
        } else if in_list && let Some((_, address)) = arg.split_once("://") {
            addresses.push(address.trim_end_matches('/').to_owned());
        }
    }
    addresses
}

/// The body of a plain-HTTP `GET path` on `address` (the admin listener),
/// or `None` unless it answered 200.
fn admin_get_blocking(address: SocketAddr, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).ok()?;
    stream.set_read_timeout(Some(STARTUP_TIMEOUT)).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

/// The next line of `lines` starting with `prefix` (a ready line), within
/// [`STARTUP_TIMEOUT`]; `None` if the process ended first or took longer.
fn next_line(lines: &mpsc::Receiver<String>, prefix: &str) -> Option<String> {
    let deadline = std::time::Instant::now() + STARTUP_TIMEOUT;
    loop {
        let left = deadline.checked_duration_since(std::time::Instant::now())?;
        match lines.recv_timeout(left) {
            Ok(line) if line.starts_with(prefix) => return Some(line),
            Ok(_) => {}
            Err(_) => return None,
        }
    }
}

/// Waits for a process's first stdout line (its ready line), then keeps
/// draining stdout.
fn wait_ready(mut child: Child, what: &str) -> (Child, String) {
    let lines = stdout_lines(&mut child);
    match next_line(&lines, "") {
        Some(line) => (child, line),
        None => {
            let _ = child.kill();
            panic!("{what} did not become ready");
        }
    }
}

/// The value of `key` (e.g. `grpc=`) in a ready line.
fn ready_field(line: &str, key: &str) -> String {
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(key))
        .unwrap_or_else(|| panic!("ready line {line:?} lacks {key}"))
        .to_owned()
}

/// A running simulated worker process.
#[derive(Debug)]
pub struct SimWorker {
    child: Child,
    pub grpc: SocketAddr,
    pub bootstrap: Option<SocketAddr>,
}

impl SimWorker {
    /// Starts `smg-sim-worker --protocol P --role R` plus `extra` flags.
    pub fn start(protocol: &str, role: &str, extra: &[&str]) -> SimWorker {
        SimWorker::start_with_model(protocol, role, &model_dir(), extra)
    }

    /// As [`SimWorker::start`], serving the model directory `model`.
    pub fn start_with_model(
        protocol: &str,
        role: &str,
        model: &std::path::Path,
        extra: &[&str],
    ) -> SimWorker {
        let child = Command::new(env!("CARGO_BIN_EXE_smg-sim-worker"))
            .args([
                "--protocol",
                protocol,
                "--role",
                role,
                "--host",
                "127.0.0.1",
            ])
            .arg("--model-path")
            .arg(model)
            .args(["--log-level", "warn"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn smg-sim-worker");
        let (child, line) = wait_ready(child, "smg-sim-worker");
        let field = |key: &str| ready_field(&line, key);
        let grpc = field("grpc=").parse().expect("grpc address");
        let bootstrap = match field("bootstrap=").as_str() {
            "none" => None,
            addr => Some(addr.parse().expect("bootstrap address")),
        };
        SimWorker {
            child,
            grpc,
            bootstrap,
        }
    }

    /// The URI a test's own tonic client dials (tonic wants `http://`);
    /// the gateway takes [`SimWorker::grpc_url`].
    pub fn url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    pub fn bootstrap_port(&self) -> u16 {
        self.bootstrap
            .expect("this worker has a bootstrap server")
            .port()
    }

    /// Waits for the process to exit on its own; `None` if it is still
    /// running after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for SimWorker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fresh file in /dev/shm holding `bytes`; returns its name.
pub fn shm_file(bytes: &[u8]) -> String {
    let name = format!(
        "smg-test-{}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    );
    std::fs::write(shm_path(&name), bytes).expect("write /dev/shm file");
    name
}

pub fn shm_path(name: &str) -> PathBuf {
    PathBuf::from("/dev/shm").join(name)
}

/// A deterministic pseudo-image tensor of `len` bytes.
pub fn pixels(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The text header a sim worker starts its output with for this prompt.
pub fn expected_header(input_ids: &[u32], items: &[[u8; 32]]) -> String {
    digest::output_header(&digest::prompt_digest(input_ids, items))
}

/// Bounds a future so a hang fails the test instead of stalling the suite.
pub async fn bounded<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within 30 s"))
}

/// How long [`poll_until`] waits between two looks.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Asks `probe` until it answers `Some`, failing the test after 30 s. For
/// conditions another process shows only when asked (an admin endpoint, a
/// load report): the sleep is the interval between two looks, never an
/// assumption that something happened meanwhile.
pub async fn poll_until<T>(what: &str, mut probe: impl AsyncFnMut() -> Option<T>) -> T {
    bounded(what, async {
        loop {
            if let Some(found) = probe().await {
                return found;
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    })
    .await
}

/// A running `smg launch` process.
#[derive(Debug)]
pub struct Gateway {
    child: Child,
    /// Its stdout lines not read yet (in a mutex: a `Gateway` is shared
    /// across tasks).
    lines: std::sync::Mutex<mpsc::Receiver<String>>,
    pub http: SocketAddr,
    pub metrics: SocketAddr,
    /// Where the admin routes are served: the admin listener, or `http`
    /// when control-plane keys put them on the public listener.
    pub admin: SocketAddr,
}

/// The flags every test gateway starts with: loopback, ephemeral ports,
/// the fixture model, and history in memory unless the test's own `args`
/// name a `--history-backend` (clap refuses the flag twice).
fn launch_command(model: Option<&std::path::Path>, args: &[&str]) -> Command {
    launch_program(std::path::Path::new(env!("CARGO_BIN_EXE_smg")), model, args)
}

/// [`launch_command`] for the `smg` binary at `program` (a benchmark
/// comparing builds).
fn launch_program(
    program: &std::path::Path,
    model: Option<&std::path::Path>,
    args: &[&str],
) -> Command {
    let mut command = Command::new(program);
    command.args([
        "launch",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--prometheus-port",
        "0",
        "--admin-port",
        "0",
    ]);
    if !args.contains(&"--history-backend") {
        // Each test gateway keeps its own history, and no file behind.
        command.args(["--history-backend", "memory"]);
    }
    if let Some(model) = model {
        command.arg("--model-path").arg(model);
    }
    command
}

impl Gateway {
    /// Starts `smg launch --host 127.0.0.1 --port 0 --prometheus-port 0
    /// --admin-port 0 --model-path <fixture>` plus `args`.
    pub fn start(args: &[&str]) -> Gateway {
        Gateway::start_with_model(Some(&model_dir()), args)
    }

    /// Starts `smg launch` as [`Gateway::start`] does, with `--model-path
    /// <model>` only when given (without it the tokenizer comes from the
    /// workers).
    pub fn start_with_model(model: Option<&std::path::Path>, args: &[&str]) -> Gateway {
        let mut command = launch_command(model, args);
        command.args(["--log-level", "warn"]).args(args);
        command.stderr(Stdio::inherit());
        Self::spawn(command)
    }

    /// As [`Gateway::start`], running the `smg` binary at `program`.
    pub fn start_program(program: &std::path::Path, args: &[&str]) -> Gateway {
        let mut command = launch_program(program, Some(&model_dir()), args);
        command.args(["--log-level", "warn"]).args(args);
        command.stderr(Stdio::inherit());
        Self::spawn(command)
    }

    /// As [`Gateway::start`], with its log (filtered by `rust_log`) written
    /// to `log` instead of the test's stderr.
    pub fn start_logged(args: &[&str], rust_log: &str, log: &std::path::Path) -> Gateway {
        let mut command = launch_command(Some(&model_dir()), args);
        command.args(args).env("RUST_LOG", rust_log);
        command.stderr(std::fs::File::create(log).expect("log file"));
        Self::spawn(command)
    }

    /// Starts `smg launch` as [`Gateway::start_with_model`] does, but
    /// returns once its listeners are open (`smg listening ...`), before
    /// its workers have necessarily answered.
    /// Its log goes to `log` when given (else to the test's stderr).
    pub fn start_listening(
        model: Option<&std::path::Path>,
        args: &[&str],
        log: Option<&std::path::Path>,
    ) -> Gateway {
        let mut command = launch_command(model, args);
        command.args(["--log-level", "warn"]).args(args);
        match log {
            Some(log) => command.stderr(std::fs::File::create(log).expect("log file")),
            None => command.stderr(Stdio::inherit()),
        };
        Self::spawn_until(command, "smg listening ")
    }

    fn spawn(command: Command) -> Gateway {
        let named = named_worker_addresses(command.get_args());
        let gateway = Self::spawn_until(command, "smg ready ");
        gateway.until_listed(&named);
        gateway
    }

    /// Waits until the admin API lists a worker at each of `addresses`
    /// (`host:port`). The gateway is ready once ONE worker of each role
    /// has answered; the others join as they answer, so a test counting on
    /// every worker it named (round robin over two) waits for them here.
    /// Does not wait when the admin API asks for a key.
    fn until_listed(&self, addresses: &[String]) {
        if addresses.len() < 2 {
            return;
        }
        let deadline = std::time::Instant::now() + STARTUP_TIMEOUT;
        loop {
            let Some(listed) = admin_get_blocking(self.admin, "/workers") else {
                return;
            };
            let missing = addresses
                .iter()
                .find(|address| !listed.contains(&format!("://{address}\"")));
            let Some(missing) = missing else {
                return;
            };
            assert!(
                std::time::Instant::now() < deadline,
                "worker {missing} never joined: {listed}"
            );
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// Spawns the gateway and waits for its stdout line starting with
    /// `prefix`, which gives its addresses.
    fn spawn_until(mut command: Command, prefix: &str) -> Gateway {
        let mut child = command.stdout(Stdio::piped()).spawn().expect("spawn smg");
        let lines = stdout_lines(&mut child);
        let Some(line) = next_line(&lines, prefix) else {
            let _ = child.kill();
            panic!("smg did not print {prefix:?}");
        };
        let field =
            |key: &str| -> SocketAddr { ready_field(&line, key).parse().expect("an address") };
        Gateway {
            http: field("http="),
            metrics: field("metrics="),
            admin: field("admin="),
            child,
            lines: std::sync::Mutex::new(lines),
        }
    }

    /// Waits for the `smg ready ...` line (the fleet serves); `None` if the
    /// gateway exited first.
    pub fn ready_line(&self) -> Option<String> {
        let lines = self
            .lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        next_line(&lines, "smg ready ")
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http)
    }

    /// The URL of an admin route (`/workers...`).
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// An admin API call (`/workers...`): its status and JSON body (null
    /// when the body is not JSON).
    pub async fn admin(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let mut request = chat::http().request(method, self.admin_url(path));
        if let Some(body) = body {
            request = request.json(&body);
        }
        bounded("an admin call", async {
            let response = request.send().await.expect("answered");
            let status = response.status().as_u16();
            (status, response.json().await.unwrap_or_default())
        })
        .await
    }

    /// Sends `signal` to the gateway process.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.pid()).expect("a pid"));
        nix::sys::signal::kill(pid, signal).expect("signal the gateway");
    }

    /// The gateway's exit status once it has exited (`None` while it runs).
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("the gateway's status")
    }

    /// Waits (at most 30 s) for the gateway to exit and returns its status.
    pub async fn exited(&mut self) -> std::process::ExitStatus {
        poll_until("the gateway exits", async || self.exit_status()).await
    }

    /// Runs `smg launch` with `args` and returns its exit status and stderr,
    /// for start-up failures.
    pub fn fail_to_start(args: &[&str]) -> (std::process::ExitStatus, String) {
        Self::fail_to_start_with_model(Some(&model_dir()), args)
    }

    /// As [`Gateway::fail_to_start`], with `--model-path <model>` only when
    /// given.
    pub fn fail_to_start_with_model(
        model: Option<&std::path::Path>,
        args: &[&str],
    ) -> (std::process::ExitStatus, String) {
        let output = launch_command(model, args)
            .args(args)
            .output()
            .expect("run smg");
        (
            output.status,
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl SimWorker {
    /// `grpc://host:port`, as `smg launch` takes worker URLs.
    pub fn grpc_url(&self) -> String {
        format!("grpc://{}", self.grpc)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` to the worker process (SIGUSR1 releases the streams
    /// `--hold-after-tokens` holds).
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.pid()).expect("a pid"));
        nix::sys::signal::kill(pid, signal).expect("signal the worker");
    }

    /// Kills the worker process now.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
