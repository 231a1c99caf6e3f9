//! Synthetic models: every tiny preset is written, read back with its hyper-parameters, and (when
//! the upstream build is present) loaded and served by upstream llama-server.

mod model_common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bloomery::model::synthetic::{preset, write_synthetic, QuantMix, SyntheticOptions, PRESETS};
use bloomery::model::{GgmlType, GgufFile, Hparams, Metadata};
use model_common::{cache_dir, gguf_py};

const TINY: &[&str] = &[
    "tiny-llama",
    "tiny-qwen3",
    "tiny-qwen3moe",
    "tiny-gemma3",
    "tiny-gpt-oss",
    "tiny-deepseek2",
    "tiny-deepseek2-kvb",
    "tiny-glm4moe",
];

fn vocab() -> Result<PathBuf, String> {
    Ok(gguf_py()?
        .parent()
        .unwrap()
        .join("models/ggml-vocab-llama-spm.gguf"))
}

fn write_tiny(name: &str, mix: QuantMix, dir: &Path) -> PathBuf {
    let out = dir.join(format!("{name}.gguf"));
    let opts = SyntheticOptions {
        preset: preset(name).unwrap(),
        mix,
        vocab: &vocab().unwrap(),
        seed: 5,
        expert_skew: 1.0,
    };
    write_synthetic(&opts, &out).unwrap_or_else(|e| panic!("{name}: {e}"));
    out
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("bloomery-synth-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn tiny_presets_read_back() {
    let _ = or_skip!(vocab());
    let dir = temp_dir("read");
    for name in TINY {
        let p = preset(name).unwrap();
        let path = write_tiny(name, QuantMix::uniform(GgmlType::Q4K), &dir);
        let f = GgufFile::open(&path).unwrap();
        let h = Hparams::read(&Metadata::new(&f, &[])).unwrap();
        assert_eq!(
            (h.arch.as_str(), h.n_layer, h.n_embd),
            (p.arch, p.n_layer, p.n_embd)
        );
        assert_eq!(h.n_vocab, 32000, "{name}");
        assert_eq!(h.moe.map(|m| m.n_expert).unwrap_or(0), p.n_expert);
        if p.arch == "deepseek2" {
            // the planner's cache widths: keys only in the absorbed form (values are read from
            // them), per-head keys and values in the attn_kv_b form
            let kv = bloomery::placement::Inventory::from_gguf(&f, &[])
                .unwrap()
                .kv[0];
            let (rank, rope) = (p.kv_lora_rank as u64, p.rope_dim as u64);
            let heads = p.n_head as u64;
            let want = if p.mla_absorbed {
                (rank + rope, 0)
            } else {
                (heads * p.head_dim as u64, heads * p.value_dim as u64)
            };
            assert_eq!((kv.k, kv.v), want, "{name}");
        }
        let o = f.tensor("blk.0.attn_output.weight").unwrap();
        assert_eq!(o.ggml_type, GgmlType::Q4K);
        // Weights are scaled like 1/sqrt(fan_in), output projections also by 1/sqrt(2 * n_layer).
        let mut y = vec![0f32; o.n_elements() as usize];
        bloomery::model::quants::dequantize(o.ggml_type, f.tensor_data(o), &mut y).unwrap();
        let rms = (y.iter().map(|v| v * v).sum::<f32>() / y.len() as f32).sqrt();
        let want = 1.0 / (o.shape[0] as f32 * 2.0 * p.n_layer as f32).sqrt();
        assert!(
            (rms / want - 1.0).abs() < 0.2,
            "{name}: rms {rms}, want {want}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn presets_have_consistent_shapes() {
    for p in PRESETS {
        assert_eq!(p.n_head % p.n_head_kv, 0, "{}", p.name);
        assert!(p.n_expert_used <= p.n_expert, "{}", p.name);
    }
}

/// Upstream llama-server, or why it is absent.
fn llama_server() -> Result<PathBuf, String> {
    let p = cache_dir()?.join("upstream/b11434/bin/llama-server");
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "{} is missing (scripts/upstream.sh builds it)",
            p.display()
        ))
    }
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

/// One HTTP/1.1 request; returns the status code and body.
fn http(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(120))).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    let status = resp.split_whitespace().nth(1)?.parse().ok()?;
    let body = resp.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}

#[test]
fn upstream_llama_server_serves_every_tiny_preset() {
    let server = or_skip!(llama_server());
    let _ = or_skip!(vocab());
    let dir = temp_dir("serve");
    let mixes = [
        QuantMix::uniform(GgmlType::Q4K),
        QuantMix {
            weights: GgmlType::Q8_0,
            experts: GgmlType::Mxfp4,
            embeddings: GgmlType::F16,
        },
    ];
    for name in TINY {
        for mix in mixes {
            let model = write_tiny(name, mix, &dir);
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let child = Command::new(&server)
                .arg("-m")
                .arg(&model)
                .args(["--port", &port.to_string(), "-c", "256", "-t", "1"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let mut srv = Server(child);
            let start = Instant::now();
            loop {
                if let Some((200, _)) = http(port, "GET", "/health", "") {
                    break;
                }
                if let Ok(Some(status)) = srv.0.try_wait() {
                    panic!("{name} {mix:?}: llama-server exited with {status} while loading");
                }
                assert!(
                    start.elapsed() < Duration::from_secs(180),
                    "{name} {mix:?}: llama-server not healthy after 180 s"
                );
                std::thread::sleep(Duration::from_millis(250));
            }
            let (status, body) = http(
                port,
                "POST",
                "/completion",
                r#"{"prompt":"Hello world","n_predict":4,"temperature":0}"#,
            )
            .expect("completion answered");
            assert_eq!(status, 200, "{name} {mix:?}: {body}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["tokens_predicted"], 4, "{name} {mix:?}: {body}");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}
