//! The README's examples run as written.
//!
//! Every fenced block whose info string is `sh runnable` is run by bash
//! (`set -euo pipefail`) and must exit 0 with output; a `sh runnable
//! background` block (the demo) is started first and left running, and
//! the others wait for its `smg ready` line. What the test changes, and
//! nothing else:
//! - the demo's fixed ports (30000, 29000, 30001) become free ones, in
//!   every block, and `smg demo` is given them as flags (its defaults);
//! - the blocks run in a scratch directory whose `target/release` is the
//!   directory of the binaries this test build made, and `cargo build` is
//!   a no-op there (those binaries are already built; a release build
//!   inside the test suite would take minutes).
//!
//! It also checks the table of contents: every `## ` section is linked,
//! by the anchor GitHub gives its heading, and every link lands on one.

mod support;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README.md")
}

/// A fenced block: its info string and its text.
#[derive(Debug)]
struct Block {
    info: String,
    text: String,
}

fn blocks(markdown: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut lines = markdown.lines();
    while let Some(line) = lines.next() {
        let Some(info) = line.trim_start().strip_prefix("```") else {
            continue;
        };
        let mut text = String::new();
        for line in lines.by_ref() {
            if line.trim_start().starts_with("```") {
                break;
            }
            text.push_str(line);
            text.push('\n');
        }
        blocks.push(Block {
            info: info.trim().to_owned(),
            text,
        });
    }
    blocks
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free port")
}

/// The demo's default ports, and the free ones that replace them.
struct Ports(Vec<(u16, u16)>);

impl Ports {
    fn new() -> Self {
        Ports(
            [30000, 29000, 30001]
                .map(|fixed| (fixed, free_port()))
                .to_vec(),
        )
    }

    fn apply(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for (fixed, free) in &self.0 {
            text = text.replace(&format!(":{fixed}"), &format!(":{free}"));
        }
        let [(_, http), (_, metrics), (_, admin)] = self.0[..] else {
            unreachable!("three ports")
        };
        text.replace(
            "smg demo",
            &format!("smg demo --port {http} --prometheus-port {metrics} --admin-port {admin}"),
        )
    }
}

/// A scratch directory whose `target/release` holds this build's binaries.
fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a scratch directory");
    let binaries: PathBuf = Path::new(env!("CARGO_BIN_EXE_smg"))
        .parent()
        .expect("the binaries' directory")
        .to_owned();
    std::fs::create_dir(dir.path().join("target")).expect("target/");
    std::os::unix::fs::symlink(binaries, dir.path().join("target/release"))
        .expect("target/release");
    dir
}

/// bash running `block` in `dir`, with `cargo build` a no-op.
fn bash(dir: &Path, block: &str) -> Command {
    let script = format!(
        "set -euo pipefail\n\
         cargo() {{ if [ \"$1\" = build ]; then return 0; fi; command cargo \"$@\"; }}\n\
         {block}"
    );
    let mut command = Command::new("bash");
    command
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .env_remove("RUST_LOG");
    command
}

/// A background block, its process group killed on drop.
struct Background(Child);

impl Drop for Background {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.0.id()) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let _ = self.0.wait();
    }
}

/// Starts a background block and waits for its `smg ready` line.
fn start_background(dir: &Path, block: &str) -> Background {
    let mut child = bash(dir, block)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("bash");
    let stdout = child.stdout.take().expect("piped stdout");
    let background = Background(child);
    let (sender, ready) = mpsc::channel();
    std::thread::spawn(move || {
        let mut printed = Vec::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("smg ready") {
                let _ = sender.send(Ok(()));
            }
            printed.push(line);
        }
        let _ = sender.send(Err(printed));
    });
    match ready.recv_timeout(Duration::from_secs(60)) {
        Ok(Ok(())) => background,
        other => panic!("the background block never printed `smg ready`: {block}\n{other:?}"),
    }
}

#[test]
fn the_runnable_blocks_run_as_written() {
    let blocks = blocks(&readme());
    let runnable: Vec<&Block> = blocks
        .iter()
        .filter(|block| block.info.starts_with("sh runnable"))
        .collect();
    assert!(runnable.len() >= 3, "the demo and curl blocks are marked");
    let dir = workspace();
    let ports = Ports::new();
    let _background: Vec<Background> = runnable
        .iter()
        .filter(|block| block.info == "sh runnable background")
        .map(|block| start_background(dir.path(), &ports.apply(&block.text)))
        .collect();
    for block in runnable.iter().filter(|block| block.info == "sh runnable") {
        let output = bash(dir.path(), &ports.apply(&block.text))
            .output()
            .expect("bash");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && !stdout.trim().is_empty(),
            "{}\nexit {:?}\nstdout: {stdout}\nstderr: {}",
            block.text,
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// GitHub's anchor for a heading: lowercased, spaces to `-`, punctuation
/// other than `-` and `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn the_table_of_contents_links_every_section() {
    let readme = readme();
    let (head, _) = readme
        .split_once("\n## ")
        .expect("sections after the introduction");
    let contents = head
        .split_once("**Contents:**")
        .expect("a table of contents before the first section")
        .1;
    let links: Vec<&str> = contents
        .split("](#")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .collect();
    let mut outside_code = String::new();
    let mut in_code = false;
    for line in readme.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code {
            outside_code.push_str(line);
            outside_code.push('\n');
        }
    }
    let anchors: Vec<String> = outside_code
        .lines()
        .filter_map(|line| {
            line.strip_prefix("## ")
                .or_else(|| line.strip_prefix("### "))
        })
        .map(anchor)
        .collect();
    for section in outside_code.lines().filter_map(|l| l.strip_prefix("## ")) {
        let wanted = anchor(section);
        assert!(
            links.contains(&wanted.as_str()),
            "the contents do not link {section:?} (#{wanted})"
        );
    }
    for link in links {
        assert!(
            anchors.iter().any(|anchor| anchor == link),
            "#{link} is not a heading"
        );
    }
}

#[test]
fn anchors_follow_github() {
    assert_eq!(anchor("Try it: the demo"), "try-it-the-demo");
    assert_eq!(anchor("HTTP API"), "http-api");
    assert_eq!(
        anchor("Load testing with smg-bench"),
        "load-testing-with-smg-bench"
    );
}
