//! The HTTP server: llama-server's routes on actix-web, over a scheduler thread that owns the
//! engine. Does no model math: logits come from the engine through [`crate::engine::Forward`],
//! tokens from [`crate::sampling`].
//!
//! Life cycle: [`Server::start`] binds and answers 503 "Loading model" on every route;
//! [`Server::attach`] hands it the loaded engine; [`Server::wait`] serves until SIGINT/SIGTERM,
//! then ends in-flight tasks and returns. [`run`] does all three.

pub mod chat;
pub mod checkpoints;
pub mod codec;
pub mod embed;
mod format;
mod http;
mod infill;
mod peer;
mod prompt_cache;
pub mod request;
pub mod scheduler;
pub mod task;
pub mod testing;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use actix_web::{middleware::from_fn, web, App, HttpServer};

pub use chat::{ChatRenderer, PlainChat, Reply, ReplyParsing, ReplyStream};
pub use codec::TextCodec;
pub use scheduler::{CacheOptions, SchedulerConfig, SchedulerHandle};
pub use task::{Event, TaskParams, TaskRequest};

use crate::engine::Forward;
use http::{AppState, Ready};

/// Everything the server needs from the command line, as plain data (the CLI maps its `Config`
/// onto this).
#[derive(Clone, Debug)]
pub struct ServerParams {
    /// Addresses to listen on, all on `port`; a name ending in `.sock` is a UNIX socket path.
    pub hosts: Vec<String>,
    /// `--api-prefix`: every route is served under it (`/v1` -> `/v1/health`); empty = none.
    pub api_prefix: String,
    /// 0 picks a free port (tests).
    pub port: u16,
    pub n_parallel: usize,
    /// Per-slot context; 0 takes the engine's `n_ctx_seq`.
    pub n_ctx_slot: usize,
    pub n_batch: usize,
    pub n_ubatch: usize,
    /// Context checkpoints and the host prompt cache.
    pub cache: CacheOptions,
    /// `--spm-infill`: `/infill` prompts put the suffix before the prefix.
    pub spm_infill: bool,
    pub api_keys: Vec<String>,
    /// HTTP read/write timeout, seconds.
    pub timeout_s: u64,
    /// HTTP worker threads; -1 picks as upstream does.
    pub threads_http: i32,
    pub slot_save_path: Option<PathBuf>,
    pub slot_prompt_similarity: f32,
    pub ctx_shift: bool,
    pub endpoint_slots: bool,
    /// `LLAMA_SERVER_SLOTS_DEBUG`: `/slots` shows full parameters, prompt and generated text.
    pub slots_debug: bool,
    pub endpoint_props: bool,
    pub endpoint_metrics: bool,
    pub cors_origins: String,
    pub cors_methods: String,
    pub cors_headers: String,
    pub cors_credentials: bool,
    /// Request defaults: sampling, `n_predict`, `cache_prompt`, `n_cache_reuse`, stop words.
    pub defaults: TaskParams,
    /// Reported as `build_info` and `system_fingerprint`.
    pub build_info: String,
    /// `--reasoning-format`: how chat replies split thinking from content (a request's own
    /// `reasoning_format` wins); `None` (`--skip-chat-parsing`) leaves replies unparsed.
    pub reasoning_format: Option<String>,
    /// `--reasoning-budget-message`: what chat replies get before the end tag when their
    /// thinking budget runs out (a request's own `reasoning_budget_message` wins).
    pub reasoning_budget_message: String,
    /// `chat_template_kwargs` every chat request starts from (`--chat-template-kwargs`,
    /// `--reasoning`, `--reasoning-preserve`); a request's own entries win.
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// `--embeddings` (or `--reranking`): the embedding routes answer.
    pub embedding: bool,
    /// `--pooling` (`--reranking` sets rank); `None` takes the model's.
    pub pooling: Option<embed::Pooling>,
}

impl Default for ServerParams {
    fn default() -> Self {
        ServerParams {
            hosts: vec!["127.0.0.1".into()],
            api_prefix: String::new(),
            port: 8080,
            n_parallel: 4,
            n_ctx_slot: 0,
            n_batch: 2048,
            n_ubatch: 512,
            cache: CacheOptions::default(),
            spm_infill: false,
            api_keys: Vec::new(),
            timeout_s: 3600,
            threads_http: -1,
            slot_save_path: None,
            slot_prompt_similarity: 0.1,
            ctx_shift: false,
            endpoint_slots: true,
            slots_debug: false,
            endpoint_props: false,
            endpoint_metrics: false,
            cors_origins: "*".into(),
            cors_methods: "GET, POST, DELETE, OPTIONS".into(),
            cors_headers: "*".into(),
            cors_credentials: true,
            defaults: TaskParams::default(),
            build_info: format!("bloomery-{}", env!("CARGO_PKG_VERSION")),
            reasoning_format: Some("deepseek".into()),
            reasoning_budget_message: String::new(),
            chat_template_kwargs: crate::chat::server_default_kwargs(),
            embedding: false,
            pooling: None,
        }
    }
}

/// What `/v1/models` and `/props` say about the model.
#[derive(Clone, Debug, Default)]
pub struct ModelInfo {
    /// The alias, or the model file's name.
    pub name: String,
    pub aliases: Vec<String>,
    /// `--tags`: shown in `/v1/models`, never used for routing.
    pub tags: Vec<String>,
    pub path: String,
    pub ftype: String,
    pub vocab_type: i32,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub n_embd: usize,
    pub n_params: u64,
    pub size: u64,
    pub bos_token: String,
    pub eos_token: String,
    /// The model's own pooling (`{arch}.pooling_type`; none when absent).
    pub pooling: embed::Pooling,
    /// `tokenizer.chat_template.rerank`: how a reranking prompt puts query and document.
    pub rerank_template: Option<String>,
}

/// One address the server listens on.
enum Listener {
    Tcp(std::net::TcpListener),
    Unix(String),
}

/// Binds the TCP addresses (so a busy port is refused before the model loads) and lists the UNIX
/// socket paths, as upstream reads `--host`: with several TCP addresses an IPv6 one listens on
/// IPv6 only, so `::` and `0.0.0.0` can sit side by side, and the port cannot be left to the
/// system (each address would get its own).
fn listeners(hosts: &[String], port: u16) -> std::io::Result<Vec<Listener>> {
    use std::net::ToSocketAddrs;
    let n_tcp = hosts.iter().filter(|h| !h.ends_with(".sock")).count();
    if port == 0 && n_tcp > 1 {
        return Err(std::io::Error::other(
            "--port 0 is not supported with multiple TCP addresses",
        ));
    }
    hosts
        .iter()
        .map(|host| {
            if host.ends_with(".sock") {
                return Ok(Listener::Unix(host.clone()));
            }
            let addr = (host.as_str(), port)
                .to_socket_addrs()?
                .next()
                .ok_or_else(|| std::io::Error::other(format!("{host} names no address")))?;
            let domain = socket2::Domain::for_address(addr);
            let socket = socket2::Socket::new(domain, socket2::Type::STREAM, None)?;
            if addr.is_ipv6() && n_tcp > 1 {
                socket.set_only_v6(true)?;
            }
            socket.set_reuse_address(true)?;
            socket
                .bind(&addr.into())
                .and_then(|()| socket.listen(1024))
                .map_err(|e| {
                    std::io::Error::new(e.kind(), format!("cannot listen on {host}:{port}: {e}"))
                })?;
            Ok(Listener::Tcp(socket.into()))
        })
        .collect()
}

/// A running HTTP server.
pub struct Server {
    state: web::Data<AppState>,
    addrs: Vec<SocketAddr>,
    http: actix_web::dev::ServerHandle,
    http_thread: Option<JoinHandle<std::io::Result<()>>>,
    scheduler: OnceLock<(SchedulerHandle, JoinHandle<()>)>,
}

impl Server {
    /// Binds and starts answering (503 until [`Server::attach`]).
    pub fn start(params: ServerParams) -> std::io::Result<Server> {
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let workers = if params.threads_http > 0 {
            params.threads_http as usize
        } else {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            (params.n_parallel + 2).max(cores.saturating_sub(1))
        };
        let timeout = Duration::from_secs(params.timeout_s.max(1));
        let listeners = listeners(&params.hosts, params.port)?;
        // actix lists a placeholder for each UNIX socket; only the TCP addresses are reported
        let tcp_addrs = listeners
            .iter()
            .filter_map(|l| match l {
                Listener::Tcp(tcp) => Some(tcp.local_addr()),
                Listener::Unix(_) => None,
            })
            .collect::<std::io::Result<Vec<SocketAddr>>>()?;
        let prefix = params.api_prefix.clone();
        let state = web::Data::new(AppState {
            params,
            ready: OnceLock::new(),
            started,
        });
        let app_state = state.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let http_thread = std::thread::Builder::new()
            .name("http".into())
            .spawn(move || {
                actix_web::rt::System::new().block_on(async move {
                    let bound = HttpServer::new(move || {
                        App::new()
                            .app_data(app_state.clone())
                            .app_data(web::PayloadConfig::new(256 << 20))
                            .wrap(from_fn(http::gate))
                            .service(web::scope(&prefix).configure(http::configure))
                            .default_service(web::to(http::not_found))
                    })
                    .on_connect(|conn, data| {
                        if let Some(p) = peer::Peer::of(conn) {
                            data.insert(std::sync::Arc::new(p));
                        }
                    })
                    .workers(workers)
                    .disable_signals()
                    .client_request_timeout(timeout)
                    .keep_alive(timeout)
                    .shutdown_timeout(5);
                    let bound = listeners.into_iter().try_fold(bound, |server, l| match l {
                        Listener::Tcp(tcp) => server.listen(tcp),
                        Listener::Unix(path) => server.bind_uds(path),
                    });
                    let server = match bound {
                        Ok(s) => s,
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return Ok(());
                        }
                    };
                    let running = server.run();
                    let _ = tx.send(Ok(running.handle()));
                    running.await
                })
            })?;
        let http = rx
            .recv()
            .map_err(|_| std::io::Error::other("the HTTP thread ended before binding"))??;
        for a in &tcp_addrs {
            log::info!("server is listening on http://{a}");
        }
        Ok(Server {
            state,
            addrs: tcp_addrs,
            http,
            http_thread: Some(http_thread),
            scheduler: OnceLock::new(),
        })
    }

    /// The bound addresses (the real port when 0 was asked for).
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Hands over the loaded model: routes start serving.
    pub fn attach(
        &self,
        engine: Box<dyn Forward>,
        codec: Arc<dyn TextCodec>,
        chat: Arc<dyn ChatRenderer>,
        model: ModelInfo,
    ) -> std::io::Result<()> {
        let p = &self.state.params;
        // `--pooling` (or `--reranking`'s), else the model's own
        let pooling = p.pooling.unwrap_or(model.pooling);
        let config = SchedulerConfig {
            n_slots: p.n_parallel.max(1),
            n_ctx_slot: p.n_ctx_slot,
            n_ubatch: p.n_ubatch.max(1),
            n_batch: p.n_batch.max(1),
            cache: p.cache.clone(),
            slot_prompt_similarity: p.slot_prompt_similarity,
            ctx_shift: p.ctx_shift,
            slot_save_path: p.slot_save_path.clone(),
            n_predict: p.defaults.n_predict,
            pooling,
        };
        let (handle, thread) = scheduler::spawn(engine, codec.clone(), config)?;
        let ready = Ready {
            pooling,
            scheduler: handle.clone(),
            codec,
            chat,
            model,
        };
        if self.state.ready.set(ready).is_err() {
            handle.shutdown();
            return Err(std::io::Error::other("a model is already attached"));
        }
        let _ = self.scheduler.set((handle, thread));
        log::info!("model loaded, all slots are idle");
        Ok(())
    }

    /// Serves until SIGINT or SIGTERM, then stops.
    pub fn wait(self, signals: crate::service::StopSignals) {
        let name = signals.wait();
        log::info!("received {name}, shutting down");
        self.stop();
    }

    /// Ends in-flight tasks (their clients get an error event), stops HTTP and the scheduler.
    pub fn stop(mut self) {
        if let Some((handle, _)) = self.scheduler.get() {
            handle.shutdown();
        }
        let http = self.http.clone();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        if let Ok(rt) = rt {
            rt.block_on(http.stop(true));
        }
        if let Some(t) = self.http_thread.take() {
            let _ = t.join();
        }
        if let Some((_, thread)) = self.scheduler.take() {
            let _ = thread.join();
        }
    }
}

/// Starts, attaches the model and serves until a stop signal (the binary's entry point).
pub fn run(
    params: ServerParams,
    engine: Box<dyn Forward>,
    codec: Arc<dyn TextCodec>,
    chat: Arc<dyn ChatRenderer>,
    model: ModelInfo,
) -> std::io::Result<()> {
    let signals = crate::service::StopSignals::install()?;
    let server = Server::start(params)?;
    server.attach(engine, codec, chat, model)?;
    server.wait(signals);
    Ok(())
}
