//! Everything printed about the options, generated from the table: `--help` (upstream's layout),
//! `--completion-bash` (upstream's script shape), clap_complete scripts for bash, zsh and fish,
//! and the roff man page committed as `man/bloomery-serve.1`.

use super::table::{all_options, Group, Opt, GROUPS};
use clap::{Arg, ArgAction, Command, ValueHint};

const BIN: &str = "bloomery-serve";
/// Column where help text starts, and the width help text wraps at.
const HELP_COLUMN: usize = 40;
const HELP_WIDTH: usize = 70;

/// A generated document (`--generate KIND`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DocKind {
    Man,
    Bash,
    Zsh,
    Fish,
}

impl DocKind {
    pub fn from_name(name: &str) -> Option<DocKind> {
        Some(match name {
            "man" => DocKind::Man,
            "complete-bash" => DocKind::Bash,
            "complete-zsh" => DocKind::Zsh,
            "complete-fish" => DocKind::Fish,
            _ => return None,
        })
    }
}

/// The help text with its `(env: ...)` line, as printed.
fn full_help(opt: &Opt) -> String {
    match opt.env {
        Some(env) => format!("{}\n(env: {env})", opt.help),
        None => opt.help.to_string(),
    }
}

/// Splits help into lines, word-wrapping lines longer than `HELP_WIDTH`.
fn wrap(help: &str) -> Vec<String> {
    let mut lines = Vec::new();
    for line in help.lines() {
        if line.len() <= HELP_WIDTH {
            lines.push(line.to_string());
            continue;
        }
        let mut current = String::new();
        for word in line.split_whitespace() {
            if !current.is_empty() && current.len() + 1 + word.len() > HELP_WIDTH {
                lines.push(std::mem::take(&mut current));
            }
            if !current.is_empty() {
                current.push(' ');
            }
            current.push_str(word);
        }
        if !current.is_empty() {
            lines.push(current);
        }
    }
    lines
}

/// One option as `--help` shows it: spellings and value hints, then the help in a column.
pub fn option_usage(opt: &Opt) -> String {
    let spellings: Vec<&str> = opt.spellings().collect();
    let mut head = if spellings.len() == 1 {
        spellings[0].to_string()
    } else {
        format!(
            "{:<7}{}",
            format!("{}, ", spellings[0]),
            spellings[1..].join(", ")
        )
    };
    for hint in [opt.hint, opt.hint2] {
        if !hint.is_empty() {
            head.push(' ');
            head.push_str(hint);
        }
    }
    let indent = " ".repeat(HELP_COLUMN);
    let mut out = if head.len() > HELP_COLUMN - 3 {
        format!("{head}\n{indent}")
    } else {
        format!("{head:<HELP_COLUMN$}")
    };
    for (n, line) in wrap(&full_help(opt)).iter().enumerate() {
        if n > 0 {
            out.push_str(&indent);
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// `--help`.
pub fn help() -> String {
    let sections: Vec<String> = GROUPS
        .iter()
        .map(|g: &Group| {
            let body: String = g.options.iter().map(option_usage).collect();
            format!("----- {} -----\n\n{body}", g.title)
        })
        .collect();
    sections.join("\n\n")
}

/// `--version`, on stderr like upstream.
pub fn version() -> String {
    format!(
        "version: {} (bloomery-serve, compatible with llama.cpp b11434)\nbuilt with rustc for {}-{}\n",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH,
        std::env::consts::OS
    )
}

/// `--completion-bash`: every positive spelling, with file completion for the options that take
/// a model, grammar or template file.
pub fn completion_bash() -> String {
    let words: Vec<&str> = all_options()
        .flat_map(|o| o.names.iter().copied())
        .collect();
    format!(
        r#"_bloomery_serve_completions() {{
    local cur prev opts
    COMPREPLY=()
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"

    opts="{}"

    case "$prev" in
        --model|-m)
            COMPREPLY=( $(compgen -f -X '!*.gguf' -- "$cur") $(compgen -d -- "$cur") )
            return 0
            ;;
        --grammar-file)
            COMPREPLY=( $(compgen -f -X '!*.gbnf' -- "$cur") $(compgen -d -- "$cur") )
            return 0
            ;;
        --chat-template-file)
            COMPREPLY=( $(compgen -f -X '!*.jinja' -- "$cur") $(compgen -d -- "$cur") )
            return 0
            ;;
        *)
            COMPREPLY=( $(compgen -W "${{opts}}" -- "$cur") )
            return 0
            ;;
    esac
}}

complete -F _bloomery_serve_completions {BIN}
"#,
        words.join(" ")
    )
}

/// The allowed values when a hint lists them, as in `{none,layer,row}` or `[on|off|auto]`.
fn listed_values(hint: &str) -> Option<Vec<&str>> {
    let inner = hint
        .strip_prefix('{')
        .and_then(|h| h.strip_suffix('}'))
        .or_else(|| hint.strip_prefix('[').and_then(|h| h.strip_suffix(']')))?;
    Some(inner.split([',', '|']).collect())
}

fn value_hint(hint: &str) -> ValueHint {
    match hint {
        "FNAME" | "FILE" | "JINJA_TEMPLATE_FILE" => ValueHint::FilePath,
        "PATH" | "DIR" => ValueHint::AnyPath,
        "URL" | "MODEL_URL" => ValueHint::Url,
        "HOST" => ValueHint::Hostname,
        _ => ValueHint::Other,
    }
}

fn short_of(spelling: &str) -> Option<char> {
    let rest = spelling.strip_prefix('-')?;
    let mut chars = rest.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None) if c != '-' => Some(c),
        _ => None,
    }
}

/// One clap argument for a set of spellings. clap cannot express multi-letter single-dash
/// spellings such as `-ngl`; those are completed through their `--` twin.
fn clap_arg(id: String, spellings: &[&'static str], opt: &Opt, takes_value: bool) -> Option<Arg> {
    let longs: Vec<&'static str> = spellings
        .iter()
        .filter_map(|s| s.strip_prefix("--"))
        .collect();
    let short = spellings.iter().find_map(|s| short_of(s));
    let (first_long, more_longs) = longs.split_first()?;
    let mut arg = Arg::new(id)
        .long(*first_long)
        .visible_aliases(more_longs.to_vec())
        .help(opt.help.lines().next().unwrap_or_default().to_string());
    if let Some(c) = short {
        arg = arg.short(c);
    }
    if !takes_value {
        return Some(arg.action(ArgAction::SetTrue));
    }
    let count = if opt.hint2.is_empty() { 1 } else { 2 };
    arg = arg
        .num_args(count)
        .value_name(opt.hint)
        .action(ArgAction::Append)
        .value_hint(value_hint(opt.hint));
    if let Some(values) = listed_values(opt.hint) {
        arg = arg.value_parser(values);
    }
    Some(arg)
}

/// A clap `Command` mirroring the table, used only to generate completion scripts.
pub fn clap_command() -> Command {
    let mut cmd = Command::new(BIN)
        .about("A drop-in replacement for llama.cpp's llama-server")
        .disable_help_flag(true)
        .disable_version_flag(true);
    for opt in all_options() {
        let takes_value = !opt.is_switch();
        if let Some(arg) = clap_arg(opt.long_name().to_string(), opt.names, opt, takes_value) {
            cmd = cmd.arg(arg);
        }
        if !opt.negs.is_empty() {
            let id = format!("{}:negative", opt.long_name());
            if let Some(arg) = clap_arg(id, opt.negs, opt, false) {
                cmd = cmd.arg(arg);
            }
        }
    }
    cmd
}

fn clap_completion(shell: clap_complete::Shell) -> String {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut clap_command(), BIN, &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Escapes text for roff: backslashes, hyphens, and a leading dot or quote.
fn roff(text: &str) -> String {
    let escaped = text.replace('\\', "\\e").replace('-', "\\-");
    if escaped.starts_with('.') || escaped.starts_with('\'') {
        format!("\\&{escaped}")
    } else {
        escaped
    }
}

/// The man page, in roff.
pub fn man_page() -> String {
    let mut m = String::new();
    m.push_str(&format!(
        ".TH BLOOMERY\\-SERVE 1 \"\" \"bloomery {}\" \"User Commands\"\n",
        env!("CARGO_PKG_VERSION")
    ));
    m.push_str(
        ".SH NAME\nbloomery\\-serve \\- a drop\\-in replacement for llama.cpp's llama\\-server\n",
    );
    m.push_str(".SH SYNOPSIS\n.B bloomery\\-serve\n[\\fIOPTIONS\\fR]\n");
    m.push_str(".SH DESCRIPTION\n");
    m.push_str(
        "Serves a GGUF model over HTTP with the API of llama.cpp's llama\\-server (build b11434). ",
    );
    m.push_str("It takes the same options and the same LLAMA_ARG_* environment variables; a variable applies ");
    m.push_str("unless the matching option is also given on the command line, which wins. ");
    m.push_str("Options whose feature is not built yet are accepted and named in a warning at start\\-up.\n");
    for g in GROUPS {
        m.push_str(&format!(".SH {}\n", roff(&g.title.to_uppercase())));
        for opt in g.options {
            let mut head: Vec<String> = opt
                .spellings()
                .map(|s| format!("\\fB{}\\fR", roff(s)))
                .collect();
            for hint in [opt.hint, opt.hint2] {
                if !hint.is_empty() {
                    let last = head.pop().unwrap_or_default();
                    head.push(format!("{last} \\fI{}\\fR", roff(hint)));
                }
            }
            m.push_str(&format!(".TP\n{}\n", head.join(", ")));
            let lines: Vec<String> = full_help(opt).lines().map(roff).collect();
            m.push_str(&lines.join("\n.br\n"));
            m.push('\n');
        }
    }
    m.push_str(".SH ENVIRONMENT\n");
    m.push_str(
        "Each variable below sets its option. For options with a \\fB\\-\\-no\\-\\fR form, ",
    );
    m.push_str("LLAMA_ARG_NO_\\fINAME\\fR set to anything turns the option off. ");
    m.push_str("Booleans accept on, enabled, true, 1 and off, disabled, false, 0.\n");
    for opt in all_options() {
        if let Some(env) = opt.env {
            m.push_str(&format!(
                ".TP\n.B {}\n{}\n",
                roff(env),
                roff(opt.long_name())
            ));
        }
    }
    m.push_str(".SH EXIT STATUS\n0 on success or after an informational option (\\fB\\-\\-help\\fR, \\fB\\-\\-version\\fR, ...); ");
    m.push_str("1 when an option or variable is refused.\n");
    m
}

/// `--generate KIND`.
pub fn generate(kind: DocKind) -> String {
    match kind {
        DocKind::Man => man_page(),
        DocKind::Bash => clap_completion(clap_complete::Shell::Bash),
        DocKind::Zsh => clap_completion(clap_complete::Shell::Zsh),
        DocKind::Fish => clap_completion(clap_complete::Shell::Fish),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clap_command_is_consistent() {
        clap_command().debug_assert();
    }

    #[test]
    fn usage_pads_short_heads_and_breaks_long_ones() {
        let port = all_options().find(|o| o.long_name() == "--port").unwrap();
        let u = option_usage(port);
        assert!(
            u.starts_with("--port PORT                             port"),
            "{u}"
        );
        let ot = all_options()
            .find(|o| o.long_name() == "--override-tensor")
            .unwrap();
        assert!(option_usage(ot)
            .starts_with("-ot,   --override-tensor <tensor name pattern>=<buffer type>,...\n"));
    }
}
