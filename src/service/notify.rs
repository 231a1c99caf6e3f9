//! systemd's `sd_notify` protocol: one datagram of `KEY=value` lines to the socket named by
//! `NOTIFY_SOCKET` (a path, or `@name` for an abstract socket). Without that variable nothing is
//! sent, so the same binary runs under `Type=notify`, `Type=simple` or a terminal.

use std::ffi::OsStr;
use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Sends `state` to `NOTIFY_SOCKET`; `Ok(false)` when the variable is unset or empty.
pub fn notify(state: &str) -> io::Result<bool> {
    match std::env::var_os("NOTIFY_SOCKET") {
        Some(addr) if !addr.is_empty() => notify_to(&addr, state).map(|()| true),
        _ => Ok(false),
    }
}

/// Sends `state` to the notify socket `addr` (a path or `@abstract-name`).
pub fn notify_to(addr: &OsStr, state: &str) -> io::Result<()> {
    let bytes = addr.as_bytes();
    let socket = UnixDatagram::unbound()?;
    let target = match bytes.strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name)?,
        None if bytes.starts_with(b"/") => SocketAddr::from_pathname(addr)?,
        None => {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "NOTIFY_SOCKET={} is neither a path nor an @abstract name",
                    addr.to_string_lossy()
                ),
            ))
        }
    };
    let sent = socket.send_to_addr(state.as_bytes(), &target)?;
    if sent != state.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("sent {sent} of {} bytes to NOTIFY_SOCKET", state.len()),
        ));
    }
    Ok(())
}

fn send_logged(state: &str) {
    if let Err(e) = notify(state) {
        log::warn!("systemd notify '{}' failed: {e}", state.replace('\n', " "));
    }
}

/// Tells systemd the model is loaded and the server accepts requests.
pub fn notify_ready() {
    send_logged("READY=1");
}

/// Tells systemd the server is shutting down (sent before draining requests).
pub fn notify_stopping() {
    send_logged("STOPPING=1");
}

/// A one-line status shown by `systemctl status` (e.g. download or load progress).
pub fn notify_status(text: &str) {
    send_logged(&format!("STATUS={}", text.replace('\n', " ")));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagrams_reach_path_and_abstract_sockets() {
        let dir = std::env::temp_dir().join(format!("bloomery-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixDatagram::bind(&path).unwrap();
        notify_to(path.as_os_str(), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        let name = format!("bloomery-notify-test-{}", std::process::id());
        let abstract_addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = UnixDatagram::bind_addr(&abstract_addr).unwrap();
        notify_to(OsStr::new(&format!("@{name}")), "STOPPING=1").unwrap();
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");

        let err = notify_to(OsStr::new("vsock:2:1234"), "READY=1").unwrap_err();
        assert!(err.to_string().contains("vsock:2:1234"), "{err}");
    }
}
