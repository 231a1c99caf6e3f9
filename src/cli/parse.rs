//! The parse loop, with llama-server's rules: llama.cpp's config files apply first, then every
//! option's environment variable (in table order), then the command line left to right, so a
//! flag always wins over its variable (with upstream's warning) and a variable over a file.
//! Refusals carry upstream's text; the exit status is 1.

use super::config::{Config, NotBuilt, PlacementIntent, Source, Sourced};
use super::config_file::{read_config, system_config_paths};
use super::docs::{self, DocKind};
use super::table::{all_options, Handler, Opt};
use super::values::{is_truthy, parse_bool, process_escapes, stoi, Applied};
use crate::hub;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

/// A request to print something and exit instead of serving.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Help,
    Version,
    CacheList,
    CompletionBash,
    ListDevices,
    PrintConfig,
    Generate(DocKind),
}

impl Exit {
    /// Upstream ends the process inside the handler for these, before later arguments are read.
    fn is_immediate(self) -> bool {
        matches!(self, Exit::Version | Exit::ListDevices | Exit::CacheList)
    }
}

/// The state options are applied to, and the result of a successful parse.
#[derive(Debug, Default)]
pub struct Parsed {
    pub config: Config,
    pub placement: PlacementIntent,
    pub exit: Option<Exit>,
    /// Lines to print on stderr, in the order upstream prints them.
    pub warnings: Vec<String>,
    source: Source,
    /// The first `--dry-sequence-breaker` replaces the default breakers; later ones add to them.
    pub(super) dry_breakers_given: bool,
}

impl Parsed {
    /// Wraps a placement value with the origin of the option being applied.
    pub(super) fn sourced<T>(&self, value: T) -> Sourced<T> {
        Sourced {
            value,
            source: self.source.clone(),
        }
    }

    pub(super) fn warn(&mut self, line: &str) {
        self.warnings.push(line.to_string());
    }

    fn apply(
        &mut self,
        opt: &Opt,
        source: Source,
        run: impl FnOnce(&mut Parsed) -> Applied,
    ) -> Applied {
        self.source = source.clone();
        run(self)?;
        self.config
            .origins
            .insert(opt.long_name().to_string(), source);
        if let Some(feature) = opt.pending {
            self.config.not_built.insert(NotBuilt {
                option: opt.long_name().to_string(),
                feature: feature.to_string(),
            });
        }
        Ok(())
    }

    /// What to print and the exit status, when an exit was requested.
    pub fn exit_output(&self) -> Option<ExitOutput> {
        let (stdout, stderr) = match self.exit? {
            Exit::Help => (docs::help(), String::new()),
            Exit::Version => (String::new(), docs::version()),
            Exit::CacheList => {
                let env = |name: &str| std::env::var(name).ok();
                let models =
                    hub::hf_cache_dir(&env).map_or_else(Vec::new, |dir| hub::cache_list(&dir));
                (hub::format_cache_list(&models), String::new())
            }
            Exit::CompletionBash => (docs::completion_bash(), String::new()),
            Exit::ListDevices => {
                use crate::backend::cuda::device;
                let cards = device::list().unwrap_or_else(|e| {
                    log::warn!("no CUDA card can be used: {e}");
                    Vec::new()
                });
                (device::list_text(&cards), String::new())
            }
            Exit::PrintConfig => (self.config_json() + "\n", String::new()),
            Exit::Generate(kind) => (docs::generate(kind), String::new()),
        };
        Some(ExitOutput {
            code: 0,
            stdout,
            stderr,
        })
    }

    /// The resolved `Config` and `PlacementIntent` as JSON; every placement value carries its
    /// source, and `config.origins` gives the source of each config option that was set.
    pub fn config_json(&self) -> String {
        let doc = serde_json::json!({
            "config": self.config,
            "placement": self.placement,
        });
        serde_json::to_string_pretty(&doc).unwrap_or_default()
    }

    /// One line per option the user set whose feature is not built yet.
    pub fn not_built_warnings(&self) -> Vec<String> {
        self.config
            .not_built
            .iter()
            .map(|n| {
                format!(
                    "warn: not built yet: {}; {} has no effect",
                    n.feature, n.option
                )
            })
            .collect()
    }
}

/// Text to print and the status to exit with.
#[derive(Debug, PartialEq, Eq)]
pub struct ExitOutput {
    pub code: u8,
    pub stdout: String,
    pub stderr: String,
}

/// A refused command line: the warnings printed before the refusal, then the refusal itself.
#[derive(Debug)]
pub struct Failure {
    pub warnings: Vec<String>,
    pub message: String,
}

impl Failure {
    /// Upstream exits with status 1 for every parse refusal.
    pub const EXIT_CODE: u8 = 1;
}

/// The value of an option's variable, and which variable gave it. A toggle's
/// `LLAMA_ARG_NO_...` twin counts as "false", and is looked at first.
fn env_value(opt: &Opt, env: &dyn Fn(&str) -> Option<String>) -> Option<(String, String)> {
    let name = opt.env?;
    if !opt.negs.is_empty() {
        let negated = name.replacen("LLAMA_ARG_", "LLAMA_ARG_NO_", 1);
        if negated != name && env(&negated).is_some() {
            return Some(("0".into(), negated));
        }
    }
    env(name).map(|v| (v, name.to_string()))
}

fn apply_env(p: &mut Parsed, opt: &Opt, value: &str, var: &str) -> Applied {
    let source = Source::Env(var.to_string());
    match opt.handler {
        Handler::Flag(f) if is_truthy(value) => p.apply(opt, source, f),
        Handler::Flag(_) | Handler::Pair(_) => Ok(()),
        Handler::Toggle(f) => {
            let on = parse_bool(value)?;
            p.apply(opt, source, |p| f(p, on))
        }
        Handler::Int(f) => {
            let n = stoi(value)?;
            p.apply(opt, source, |p| f(p, n))
        }
        Handler::Text(f) => p.apply(opt, source, |p| f(p, value)),
    }
}

/// Applies one command-line option whose values start at `args[*i + 1]`, advancing `i`.
fn apply_arg(
    p: &mut Parsed,
    opt: &Opt,
    spelled: &str,
    positive: bool,
    args: &[String],
    i: &mut usize,
) -> Applied {
    let source = Source::Flag(spelled.to_string());
    let mut next = || {
        *i += 1;
        args.get(*i)
            .cloned()
            .ok_or_else(|| "expected value for argument".to_string())
    };
    match opt.handler {
        Handler::Flag(f) => p.apply(opt, source, f),
        Handler::Toggle(f) => p.apply(opt, source, |p| f(p, positive)),
        Handler::Int(f) => {
            let n = stoi(&next()?)?;
            p.apply(opt, source, |p| f(p, n))
        }
        Handler::Text(f) => {
            let v = next()?;
            p.apply(opt, source, |p| f(p, &v))
        }
        Handler::Pair(f) => {
            let a = next()?;
            let b = next()?;
            p.apply(opt, source, |p| f(p, &a, &b))
        }
    }
}

fn apply_file_value(p: &mut Parsed, opt: &Opt, value: &str, path: &str) -> Applied {
    let source = Source::File(path.to_string());
    match opt.handler {
        Handler::Flag(f) => p.apply(opt, source, f),
        Handler::Toggle(f) => p.apply(opt, source, |p| f(p, is_truthy(value))),
        Handler::Int(f) => {
            let n = stoi(value)?;
            p.apply(opt, source, |p| f(p, n))
        }
        Handler::Text(f) => p.apply(opt, source, |p| f(p, value)),
        Handler::Pair(_) => {
            Err("apply_to_params: option with two values is not supported yet".into())
        }
    }
}

/// Applies llama.cpp's config files, which come before the environment.
fn apply_config_files(p: &mut Parsed, files: &[PathBuf]) -> Result<(), String> {
    for path in files {
        let shown = path.display().to_string();
        p.warn(&format!("using config file: {shown}"));
        let text = std::fs::read_to_string(path)
            .map_err(|_| format!("failed to open server preset file: {shown}"))?;
        let (values, warnings) = read_config(&shown, &text)?;
        p.warnings.extend(warnings);
        for v in values {
            apply_file_value(p, v.opt, &v.value, &shown)?;
        }
    }
    Ok(())
}

/// Parses `args` (program name first) with variables read through `env`, after llama.cpp's
/// config files (`/etc/llama.cpp/config.ini`, then the user's).
pub fn parse(args: &[String], env: &dyn Fn(&str) -> Option<String>) -> Result<Parsed, Failure> {
    parse_with_config_files(args, env, &system_config_paths(env))
}

/// Parses `args` after the given config files.
pub fn parse_with_config_files(
    args: &[String],
    env: &dyn Fn(&str) -> Option<String>,
    files: &[PathBuf],
) -> Result<Parsed, Failure> {
    let mut p = Parsed::default();
    if let Err(message) = apply_config_files(&mut p, files) {
        return Err(Failure {
            warnings: p.warnings,
            message,
        });
    }
    for opt in all_options() {
        let Some((value, var)) = env_value(opt, env) else {
            continue;
        };
        if let Err(why) = apply_env(&mut p, opt, &value, &var) {
            return Err(Failure {
                warnings: p.warnings,
                message: format!("error while handling environment variable \"{var}\": {why}\n\n"),
            });
        }
    }

    let mut by_spelling: HashMap<&str, (&Opt, bool)> = HashMap::new();
    for opt in all_options() {
        by_spelling.extend(opt.names.iter().map(|n| (*n, (opt, true))));
        by_spelling.extend(opt.negs.iter().map(|n| (*n, (opt, false))));
    }
    let mut seen = HashSet::new();
    let mut i = 1;
    while i < args.len() {
        let arg = if args[i].starts_with("--") {
            args[i].replace('_', "-")
        } else {
            args[i].clone()
        };
        let Some(&(opt, positive)) = by_spelling.get(arg.as_str()) else {
            return Err(Failure {
                warnings: p.warnings,
                message: format!("error: invalid argument: {arg}"),
            });
        };
        if !seen.insert(arg.clone()) && arg != "--spec-type" {
            p.warn(&format!(
                "DEPRECATED: argument '{arg}' specified multiple times, use comma-separated values instead (only last value will be used)"
            ));
        }
        if env_value(opt, env).is_some() {
            p.warn(&format!(
                "warn: {} environment variable is set, but will be overwritten by command line argument {arg}",
                opt.env.unwrap_or_default()
            ));
        }
        if let Err(why) = apply_arg(&mut p, opt, &arg, positive, args, &mut i) {
            return Err(Failure {
                warnings: p.warnings,
                message: format!(
                    "error while handling argument \"{arg}\": {why}\n\nusage:\n{}\n\nto show complete usage, run with -h",
                    docs::option_usage(opt)
                ),
            });
        }
        if p.exit.is_some_and(Exit::is_immediate) {
            return Ok(p);
        }
        i += 1;
    }
    finish(&mut p);
    Ok(p)
}

/// What upstream derives once every option is read.
fn finish(p: &mut Parsed) {
    let c = &mut p.config;
    if c.context.escape {
        for s in c
            .context
            .reverse_prompts
            .iter_mut()
            .chain(c.sampling.dry_sequence_breakers.iter_mut())
        {
            *s = process_escapes(s);
        }
    }
    let mcp = !c.serve.mcp_servers_config.is_empty() || !c.serve.mcp_servers_json.is_empty();
    if (!c.serve.tools.is_empty() || mcp) && !c.serve.cors_origins_explicit {
        c.serve.cors_origins = "localhost".into();
        p.warnings.push(
            "server tools or MCP servers are enabled, using localhost as default CORS origin (change via --cors-origins)".into(),
        );
    }
    // the server's default kwargs, as JSON text like the command line's, where it set none
    for (key, value) in crate::chat::server_default_kwargs() {
        p.config
            .chat
            .template_kwargs
            .entry(key)
            .or_insert_with(|| value.to_string());
    }
}

/// Parses this process's arguments and environment (`LLAMA_API_KEY`, `LLAMA_ARG_*`, `HF_TOKEN`,
/// `BLOOMERY_*`).
pub fn parse_process() -> Result<Parsed, Failure> {
    let args: Vec<String> = std::env::args().collect();
    parse(&args, &|name| std::env::var(name).ok())
}

/// A value that upstream refuses while parsing but bloomery can only check once it knows the
/// devices (`-dev` or `-ot` naming a device there is not), refused with upstream's text for
/// the option or variable it came from: `source`, and `why` as upstream words it. A value from a
/// config file has no upstream text of its own and gets `None`.
pub fn refusal_for(source: &Source, why: &str) -> Option<String> {
    match source {
        Source::Flag(spelling) => {
            let opt = all_options().find(|o| o.spellings().any(|s| s == spelling))?;
            Some(format!(
                "error while handling argument \"{spelling}\": {why}\n\nusage:\n{}\n\nto show complete usage, run with -h",
                docs::option_usage(opt)
            ))
        }
        Source::Env(var) => Some(format!(
            "error while handling environment variable \"{var}\": {why}\n\n"
        )),
        Source::Default | Source::File(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Parsed {
        let argv: Vec<String> = std::iter::once("bloomery-serve")
            .chain(args.iter().copied())
            .map(String::from)
            .collect();
        parse(&argv, &|_| None).unwrap_or_else(|f| panic!("{args:?}: {}", f.message))
    }

    #[test]
    fn escapes_apply_to_reverse_prompts_and_breakers_unless_disabled() {
        let p = run(&["-r", r"a\nb", "--dry-sequence-breaker", r"\t"]);
        assert_eq!(p.config.context.reverse_prompts, vec!["a\nb"]);
        assert_eq!(p.config.sampling.dry_sequence_breakers, vec!["\t"]);
        let p = run(&["--no-escape", "-r", r"a\nb"]);
        assert_eq!(p.config.context.reverse_prompts, vec![r"a\nb"]);
    }

    #[test]
    fn tools_narrow_cors_unless_origins_given() {
        let p = run(&["--tools", "all"]);
        assert_eq!(p.config.serve.cors_origins, "localhost");
        assert_eq!(p.warnings.len(), 1);
        let p = run(&["--tools", "all", "--cors-origins", "*"]);
        assert_eq!(p.config.serve.cors_origins, "*");
    }

    #[test]
    fn reasoning_kwargs() {
        let p = run(&[]);
        assert_eq!(p.config.chat.template_kwargs["preserve_reasoning"], "true");
        let p = run(&[
            "--no-reasoning-preserve",
            "-rea",
            "off",
            "--reasoning-effort",
            "high",
        ]);
        let kw = &p.config.chat.template_kwargs;
        assert_eq!(kw["preserve_reasoning"], "false");
        assert_eq!(kw["enable_thinking"], "false");
        assert_eq!(kw["reasoning_effort"], "\"high\"");
        assert_eq!(p.config.chat.reasoning, Some(false));
    }
}
