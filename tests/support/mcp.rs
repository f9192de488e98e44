//! The MCP test server (`smg-mcp-test-server`) as a process a test owns:
//! started on an ephemeral loopback port, read back from its ready line,
//! killed on drop.

use std::process::{Child, Command, Stdio};

/// A running `smg-mcp-test-server`.
#[derive(Debug)]
pub struct McpTestServer {
    child: Child,
    /// `http://127.0.0.1:PORT/mcp`.
    pub url: String,
}

impl McpTestServer {
    /// Starts the server with `extra` flags (`--require-bearer T`,
    /// `--page-size N`) and waits for its `listening on URL` line.
    pub fn start(extra: &[&str]) -> McpTestServer {
        let child = Command::new(env!("CARGO_BIN_EXE_smg-mcp-test-server"))
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn smg-mcp-test-server");
        let (child, line) = super::wait_ready(child, "smg-mcp-test-server");
        let url = line
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected ready line {line:?}"))
            .to_owned();
        McpTestServer { child, url }
    }

    /// The URL on `localhost` instead of `127.0.0.1` (a name the resolver
    /// vets, rather than an IP literal).
    pub fn url_by_name(&self) -> String {
        self.url.replacen("127.0.0.1", "localhost", 1)
    }
}

impl Drop for McpTestServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
