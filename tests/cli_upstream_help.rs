//! Walks upstream llama-server b11434's `--help` and proves every option, alias and `(env: ...)`
//! variable in it is accepted by ours with the same spellings, value hint (arity), variable and
//! help group, and that each one lands in `Config` or `PlacementIntent`.

use bloomery::cli::table::{all_options, Opt, GROUPS};
use bloomery::cli::{parse, Exit, Parsed};
use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;

/// One option as upstream's help lists it.
#[derive(Debug)]
struct UpstreamOpt {
    group: String,
    spellings: Vec<String>,
    hint: String,
    env: Option<String>,
}

fn shared_dir() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("BLOOMERY_SHARED").map(PathBuf::from),
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared")),
        Some(PathBuf::from("/work/shared")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|d| d.join("upstream/llama-server-help-b11434.txt").is_file())
}

fn upstream_help() -> Option<String> {
    let Some(dir) = shared_dir() else {
        eprintln!("skipped: llama-server-help-b11434.txt not found (set BLOOMERY_SHARED)");
        return None;
    };
    std::fs::read_to_string(dir.join("upstream/llama-server-help-b11434.txt")).ok()
}

/// Splits an option's first help line into its spellings and value hint. Upstream pads the
/// spellings to column 40, or puts the help on the next line when they are longer than 37.
fn parse_head(line: &str) -> (Vec<String>, String) {
    let head = if line.len() > 40 && line[..40].ends_with(' ') && line[..40].trim_end().len() <= 37
    {
        line[..40].trim_end()
    } else {
        line.trim_end()
    };
    let pieces: Vec<&str> = head.split(',').map(str::trim).collect();
    // a hint may itself contain commas (`N0,N1,...`); spellings always start with '-'
    let mut spellings = Vec::new();
    let mut rest = Vec::new();
    for piece in pieces {
        if rest.is_empty() && piece.starts_with('-') {
            match piece.split_once(' ') {
                Some((s, hint)) => {
                    spellings.push(s.to_string());
                    rest.push(hint.to_string());
                }
                None => spellings.push(piece.to_string()),
            }
        } else {
            rest.push(piece.to_string());
        }
    }
    (spellings, rest.join(","))
}

fn parse_upstream(help: &str) -> Vec<UpstreamOpt> {
    let mut out: Vec<UpstreamOpt> = Vec::new();
    let mut group = String::new();
    for line in help.lines() {
        if let Some(title) = line
            .strip_prefix("----- ")
            .and_then(|l| l.strip_suffix(" -----"))
        {
            group = title.to_string();
        } else if line.starts_with('-') {
            let (spellings, hint) = parse_head(line);
            out.push(UpstreamOpt {
                group: group.clone(),
                spellings,
                hint,
                env: None,
            });
        } else if let Some(env) = line
            .trim()
            .strip_prefix("(env: ")
            .and_then(|l| l.strip_suffix(')'))
        {
            if let Some(last) = out.last_mut() {
                last.env = Some(env.to_string());
            }
        }
    }
    out
}

fn ours_by_spelling() -> HashMap<&'static str, (&'static str, &'static Opt)> {
    let mut map = HashMap::new();
    for g in GROUPS {
        for o in g.options {
            for s in o.spellings() {
                map.insert(s, (g.title, o));
            }
        }
    }
    map
}

fn hint_of(o: &Opt) -> String {
    if o.hint2.is_empty() {
        o.hint.to_string()
    } else {
        format!("{} {}", o.hint, o.hint2)
    }
}

#[test]
fn every_upstream_option_has_our_spellings_hint_env_and_group() {
    let Some(help) = upstream_help() else { return };
    let upstream = parse_upstream(&help);
    assert_eq!(upstream.len(), 256, "the help file lists 256 options");
    assert_eq!(
        upstream.iter().filter(|u| u.env.is_some()).count(),
        149,
        "and 149 variables"
    );
    let ours = ours_by_spelling();
    for u in &upstream {
        let (group, o) = ours
            .get(u.spellings[0].as_str())
            .unwrap_or_else(|| panic!("{} is missing from our table", u.spellings[0]));
        let our_spellings: Vec<&str> = o.spellings().collect();
        assert_eq!(
            our_spellings, u.spellings,
            "spellings of {}",
            u.spellings[0]
        );
        assert_eq!(
            hint_of(o),
            u.hint,
            "value hint (arity) of {}",
            u.spellings[0]
        );
        assert_eq!(o.env, u.env.as_deref(), "variable of {}", u.spellings[0]);
        assert_eq!(*group, u.group, "help group of {}", u.spellings[0]);
    }
    // and nothing of ours outside bloomery's own group is unknown upstream
    let upstream_spellings: Vec<&str> = upstream
        .iter()
        .flat_map(|u| u.spellings.iter().map(String::as_str))
        .collect();
    for g in GROUPS.iter().filter(|g| g.title != "bloomery params") {
        for o in g.options {
            assert!(
                upstream_spellings.contains(&o.names[0]),
                "{} is not an upstream option",
                o.names[0]
            );
        }
    }
}

#[test]
fn our_help_has_upstreams_groups_in_order() {
    let Some(help) = upstream_help() else { return };
    let titles = |text: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| {
                l.strip_prefix("----- ")
                    .and_then(|l| l.strip_suffix(" -----"))
            })
            .map(String::from)
            .collect()
    };
    let mut expected = titles(&help);
    expected.push("bloomery params".into());
    assert_eq!(titles(&bloomery::cli::docs::help()), expected);
}

/// A file that is valid as a key file, template, grammar and JSON schema.
fn scratch() -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("bloomery-cli-walk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("value.json");
    std::fs::write(&file, "{\"type\": \"object\"}\n").expect("temp file");
    (dir, file)
}

/// A valid value, different from the default, for an option (by long name, then by hint).
fn sample(o: &Opt, dir: &str, file: &str) -> Vec<String> {
    let by_name = match o.long_name() {
        "--prio" | "--prio-batch" | "--spec-draft-prio" | "--spec-draft-prio-batch" => "2",
        "--numa" => "isolate",
        "--load-mode" => "mlock",
        "--lazy-mode" => "off",
        "--chat-template-kwargs" => "{\"k\": \"v\"}",
        "--slot-save-path" | "--media-path" => dir,
        "--reasoning-format" => "none",
        "--fit" => "off",
        "--spec-draft-sampling" => "probabilistic",
        "--generate" => "man",
        _ => "",
    };
    if !by_name.is_empty() {
        return vec![by_name.to_string()];
    }
    let v = match o.hint {
        "FNAME" | "FILE" | "PATH" | "JINJA_TEMPLATE_FILE" => file,
        "TYPE" => "q8_0",
        "M" => "ff",
        "lo-hi" => "0-3",
        "<0|1>" => "1",
        "[on|off|auto]" => "on",
        "SAMPLERS" => "top_k;temperature",
        "SEQUENCE" => "kt",
        "TOKEN_ID(+/-)BIAS" => "15043+1",
        "SCHEMA" | "JSON" => "{\"type\": \"object\"}",
        "KEY=TYPE:VALUE,..." => "a.b=bool:false",
        "<tensor name pattern>=<buffer type>,..." => "exps=CPU",
        "FNAME:SCALE,..." => "x.gguf:0.5",
        "START" => return vec!["1".into(), "5".into()],
        "<dev1,dev2,..>" | "DEVICE" => "CUDA0",
        "N0,N1,N2,..." => "3,1",
        "MiB0,MiB1,MiB2,..." => "512",
        "HOST" => "0.0.0.0",
        "TOOL1,TOOL2,..." => "read_file",
        "OPTION" => "docker:img",
        "LEVEL" => "high",
        "JINJA_TEMPLATE" => "chatml",
        "SIMILARITY" | "P" | "L" => "0.5",
        "P0,P1,..." => "0.5,0.25",
        "a|bp|N+M" => "0+1",
        "DEV=SIZE,..." => "CUDA0=38G",
        h if h.starts_with("none,draft") => "ngram-mod",
        h if h.starts_with('{') => h
            .trim_matches(['{', '}'])
            .rsplit(',')
            .next()
            .unwrap_or_default(),
        _ => "7",
    };
    vec![v.to_string()]
}

/// The JSON of the parsed values with every origin stripped, so only values are compared.
fn values(p: &Parsed) -> Value {
    fn strip(v: Value) -> Value {
        match v {
            Value::Object(mut m) => {
                m.remove("origins");
                if m.len() == 2 && m.contains_key("value") && m.contains_key("source") {
                    return strip(m.remove("value").unwrap_or(Value::Null));
                }
                Value::Object(m.into_iter().map(|(k, v)| (k, strip(v))).collect())
            }
            Value::Array(a) => Value::Array(a.into_iter().map(strip).collect()),
            other => other,
        }
    }
    strip(serde_json::from_str(&p.config_json()).expect("config JSON"))
}

fn run(args: &[String], env: &HashMap<String, String>) -> Result<Parsed, String> {
    let mut argv = vec!["bloomery-serve".to_string()];
    argv.extend_from_slice(args);
    parse(&argv, &|k| env.get(k).cloned()).map_err(|f| f.message)
}

/// Options upstream answers by exiting: (long name, exit requested).
fn exit_of(o: &Opt) -> Option<Exit> {
    Some(match o.long_name() {
        "--help" => Exit::Help,
        "--version" => Exit::Version,
        "--cache-list" => Exit::CacheList,
        "--completion-bash" => Exit::CompletionBash,
        "--list-devices" => Exit::ListDevices,
        "--print-config" => Exit::PrintConfig,
        "--generate" => Exit::Generate(bloomery::cli::docs::DocKind::Man),
        _ => return None,
    })
}

/// Options upstream refuses whatever the value, with the reason it gives.
fn refusal_of(o: &Opt) -> Option<&'static str> {
    if o.long_name() == "--rpc" {
        Some("RPC not supported in this build")
    } else if o.help.starts_with("retired:") {
        Some("the argument has been removed. use ")
    } else {
        None
    }
}

#[test]
fn every_spelling_and_variable_lands_in_config_or_placement() {
    let (dir, file) = scratch();
    let (dir, file) = (format!("{}", dir.display()), format!("{}", file.display()));
    let none = HashMap::new();
    let baseline = values(&run(&[], &none).expect("no arguments parse"));
    let mut checked = 0;
    for o in all_options() {
        let value = if o.is_switch() {
            Vec::new()
        } else {
            sample(o, &dir, &file)
        };
        for spelling in o.spellings() {
            let mut args = vec![spelling.to_string()];
            args.extend(value.iter().cloned());
            if let Some(why) = refusal_of(o) {
                let err = run(&args, &none).err().unwrap_or_default();
                assert!(
                    err.contains(why),
                    "{spelling}: expected refusal '{why}', got '{err}'"
                );
                continue;
            }
            // a following option must still be read as an option: same arity as upstream
            let sentinel = if o.long_name() == "--metrics" {
                "--props"
            } else {
                "--metrics"
            };
            args.push(sentinel.to_string());
            let p =
                run(&args, &none).unwrap_or_else(|e| panic!("{spelling} {value:?} refused: {e}"));
            if let Some(exit) = exit_of(o) {
                assert_eq!(p.exit, Some(exit), "{spelling}");
                continue;
            }
            assert!(
                p.config.serve.metrics || p.config.serve.props,
                "{spelling} took the wrong number of values"
            );
            let mut without_sentinel = args.clone();
            without_sentinel.pop();
            let alone = run(&without_sentinel, &none).expect("parsed once already");
            if o.negs.is_empty() {
                assert_ne!(
                    values(&alone),
                    baseline,
                    "{spelling} {value:?} changed nothing"
                );
            } else {
                let other = if o.negs.contains(&spelling) {
                    o.names[0]
                } else {
                    o.negs[0]
                };
                let flipped = run(&[other.to_string()], &none).expect("toggle parses");
                assert_ne!(
                    values(&alone),
                    values(&flipped),
                    "{spelling} and {other} land the same"
                );
            }
            checked += 1;
        }
        if let Some(var) = o.env {
            let text = match o.is_switch() {
                true => "1".to_string(),
                false => value.join(" "),
            };
            let env: HashMap<String, String> = [(var.to_string(), text.clone())].into();
            if let Some(why) = refusal_of(o) {
                let err = run(&[], &env).err().unwrap_or_default();
                assert!(
                    err.starts_with(&format!(
                        "error while handling environment variable \"{var}\": {why}"
                    )),
                    "{var}: {err}"
                );
                continue;
            }
            let p = run(&[], &env).unwrap_or_else(|e| panic!("{var}={text} refused: {e}"));
            assert_eq!(
                p.config.origins.get(o.long_name()),
                Some(&bloomery::cli::Source::Env(var.into())),
                "{var}"
            );
            if o.negs.is_empty() {
                assert_ne!(values(&p), baseline, "{var}={text} changed nothing");
            } else {
                let off: HashMap<String, String> = [(var.to_string(), "0".to_string())].into();
                assert_ne!(
                    values(&p),
                    values(&run(&[], &off).expect("0 parses")),
                    "{var} 1 and 0 land the same"
                );
            }
            checked += 1;
        }
    }
    assert!(
        checked > 400,
        "only {checked} spellings and variables checked"
    );
    std::fs::remove_dir_all(&dir).expect("temp dir removed");
}
