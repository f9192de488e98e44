//! `smg demo`: its simulated fleet never outlives it, even when the demo is
//! killed with SIGKILL (no destructor runs then; the kernel's parent-death
//! signal ends the workers).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free port")
}

/// Pids of a process's children (every thread's), from procfs.
fn children(pid: u32) -> Vec<u32> {
    let mut pids = Vec::new();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("procfs");
    for task in tasks.flatten() {
        if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
            pids.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    pids
}

/// Whether `pid` still runs (a zombie waiting for its reaper does not).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with(|c| c != 'Z' && c != 'X'))
        })
        .unwrap_or(false)
}

#[test]
fn a_killed_demo_takes_its_fleet_with_it() {
    let mut demo = Command::new(env!("CARGO_BIN_EXE_smg"))
        .args(["demo", "--mode", "pd", "--port"])
        .arg(free_port().to_string())
        .arg("--prometheus-port")
        .arg(free_port().to_string())
        .arg("--admin-port")
        .arg(free_port().to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("demo starts");
    let stdout = demo.stdout.take().expect("stdout");
    let started = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|line| line.starts_with("simulated fleet"));
    assert!(started, "the demo started its fleet");
    let workers = children(demo.id());
    assert_eq!(
        workers.len(),
        2,
        "a prefill and a decode worker: {workers:?}"
    );
    assert!(workers.iter().all(|&pid| running(pid)));

    demo.kill().expect("SIGKILL"); // no Drop runs in the demo
    demo.wait().expect("reaped");
    let deadline = Instant::now() + Duration::from_secs(10);
    while workers.iter().any(|&pid| running(pid)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left: Vec<u32> = workers.into_iter().filter(|&pid| running(pid)).collect();
    assert!(left.is_empty(), "workers outlived the demo: {left:?}");
}
