//! Our server started on loopback for tests that talk to the real binary: Gemma 3 270M from
//! the test-data cache, a free port, the process killed when dropped.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const OURS: &str = env!("CARGO_BIN_EXE_bloomery-serve");

/// The test-data cache (`BLOOMERY_CACHE`, default `~/.cache/bloomery`).
pub fn cache() -> PathBuf {
    std::env::var_os("BLOOMERY_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| dirs::home_dir().unwrap_or_default().join(".cache/bloomery"))
}

pub fn model() -> Option<PathBuf> {
    let path = cache().join("models/gemma-3-270m-q4_k_m.gguf");
    if path.exists() {
        Some(path)
    } else {
        eprintln!(
            "skipped: {} missing, run scripts/fetch-test-data.sh",
            path.display()
        );
        None
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Our server on a free loopback port; killed when dropped.
pub struct Served {
    child: Child,
    port: u16,
}

impl Served {
    pub fn start(model: &Path, args: &[&str]) -> Served {
        let port = free_port();
        let mut child = Command::new(OURS)
            .args(["-m", model.to_str().unwrap(), "--host", "127.0.0.1"])
            .args(["--port", &port.to_string(), "-c", "512", "-np", "1"])
            .args(args)
            .env("CUDA_VISIBLE_DEVICES", "")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        while http(port, "GET", "/health", "").0 != 200 {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("bloomery-serve {args:?} exited early: {status}");
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("bloomery-serve {args:?} not ready in time");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Served { child, port }
    }

    pub fn get(&self, path: &str) -> Value {
        let (_, text) = http(self.port, "GET", path, "");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, text) = http(self.port, "POST", path, &body.to_string());
        let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        (status, json)
    }
}

/// One HTTP/1.1 exchange on loopback: (status, body); status 0 where nothing answered.
pub fn http(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(60)));
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut raw = String::new();
    if s.write_all(req.as_bytes()).is_err() || s.read_to_string(&mut raw).is_err() {
        return (0, String::new());
    }
    let Some((head, body)) = raw.split_once("\r\n\r\n") else {
        return (0, String::new());
    };
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, body.to_string())
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
