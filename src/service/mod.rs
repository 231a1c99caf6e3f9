//! Running as a service and greeting a user: systemd's notify protocol (`READY=1` once the model
//! serves, `STOPPING=1` on the way down), the shutdown signals, and the start screen. Knows nothing
//! of flags or models: the caller says when it is ready and what to show.

mod notify;
mod screen;

pub use notify::{notify, notify_ready, notify_status, notify_stopping, notify_to};
pub use screen::{start_lines, start_screen, MemoryPool, Placement, StartInfo};

/// The stop signals (SIGTERM from systemd or `kill`, SIGINT from Ctrl-C), watched from the moment
/// [`StopSignals::install`] returns: install before telling systemd READY=1, or a stop sent right
/// after it kills the process instead of shutting it down.
pub struct StopSignals {
    runtime: tokio::runtime::Runtime,
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    pub fn install() -> std::io::Result<StopSignals> {
        use tokio::signal::unix::{signal, SignalKind};
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let _context = runtime.enter();
        let term = signal(SignalKind::terminate())?;
        let int = signal(SignalKind::interrupt())?;
        Ok(StopSignals { runtime, term, int })
    }

    /// Blocks until a stop signal arrives and names it.
    pub fn wait(mut self) -> &'static str {
        let (term, int) = (&mut self.term, &mut self.int);
        self.runtime.block_on(async {
            tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            }
        })
    }
}
