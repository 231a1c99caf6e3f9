//! Running as a service and greeting a user: systemd's notify protocol (`READY=1` once the model
//! serves, `STOPPING=1` on the way down), the shutdown signals, and the start screen. Knows nothing
//! of flags or models: the caller says when it is ready and what to show.

mod notify;
mod screen;

pub use notify::{notify, notify_ready, notify_status, notify_stopping, notify_to};
pub use screen::{start_lines, start_screen, MemoryPool, Placement, StartInfo};

/// Resolves when the process is asked to stop (SIGTERM from systemd or `kill`, SIGINT from Ctrl-C)
/// and names the signal. Falls back to Ctrl-C alone if SIGTERM cannot be watched.
pub async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = tokio::signal::ctrl_c() => "SIGINT",
        },
        Err(e) => {
            log::warn!("cannot watch SIGTERM ({e}); only Ctrl-C stops the server cleanly");
            let _ = tokio::signal::ctrl_c().await;
            "SIGINT"
        }
    }
}
