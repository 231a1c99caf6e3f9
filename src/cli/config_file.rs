//! llama.cpp's config files, applied before the environment as upstream does:
//! `/etc/llama.cpp/config.ini`, then `${XDG_CONFIG_HOME:-$HOME/.config}/llama.cpp/config.ini`.
//! Keys are option spellings without dashes (`ctx-size`, `ngl`, `no-mmproj`) or variable names
//! (`LLAMA_ARG_CTX_SIZE`); the global section `[*]` applies, then the keys before any section or
//! under `[default]`. Other sections are router-mode presets, which are not read here.

use super::table::{all_options, Opt};
use super::values::is_truthy;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The config files that exist, in the order they apply.
pub fn system_config_paths(env: &dyn Fn(&str) -> Option<String>) -> Vec<PathBuf> {
    let user_dir = env("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            env("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".config"))
        });
    let mut paths = vec![PathBuf::from("/etc/llama.cpp/config.ini")];
    paths.extend(user_dir.map(|d| d.join("llama.cpp").join("config.ini")));
    paths.into_iter().filter(|p| p.exists()).collect()
}

type Sections = BTreeMap<String, BTreeMap<String, String>>;

fn is_key(k: &str) -> bool {
    let mut chars = k.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
}

/// The text before an end-of-line comment (`;` or `#`), without trailing blanks.
fn before_comment(s: &str) -> &str {
    s.find([';', '#'])
        .map_or(s, |i| &s[..i])
        .trim_end_matches([' ', '\t'])
}

/// Sections of key/value pairs, keys before any header going to `default`; `None` when a line
/// is neither a header, a `key = value`, a comment nor blank.
fn parse_ini(text: &str) -> Option<Sections> {
    let mut sections = Sections::new();
    let mut current = "default".to_string();
    for raw in text.split("\r\n").flat_map(|l| l.split(['\n', '\r'])) {
        let line = raw.trim_start_matches([' ', '\t']);
        if line.is_empty() || line.starts_with([';', '#']) {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let (name, tail) = rest.split_once(']')?;
            if !before_comment(tail).is_empty() || name.trim().is_empty() {
                return None;
            }
            current = name.trim().to_string();
            sections.entry(current.clone()).or_default();
            continue;
        }
        let (key, value) = line.split_once('=')?;
        let key = key.trim_end_matches([' ', '\t']);
        if !is_key(key) {
            return None;
        }
        let value = before_comment(value.trim_start_matches([' ', '\t']));
        sections
            .entry(current.clone())
            .or_default()
            .insert(key.to_string(), value.to_string());
    }
    Some(sections)
}

/// The option a key names, and whether it names it through a negative spelling.
fn option_for_key(key: &str) -> Option<(&'static Opt, bool)> {
    all_options().find_map(|o| {
        let by_env = o.env.is_some_and(|e| {
            e == key || (!o.negs.is_empty() && e.replacen("LLAMA_ARG_", "LLAMA_ARG_NO_", 1) == key)
        });
        if by_env || o.names.iter().any(|n| n.trim_start_matches('-') == key) {
            Some((o, false))
        } else if o.negs.iter().any(|n| n.trim_start_matches('-') == key) {
            Some((o, true))
        } else {
            None
        }
    })
}

/// One value to apply from a config file.
pub struct FileValue {
    pub opt: &'static Opt,
    pub value: String,
}

/// What one config file sets, in the order upstream applies it (global section first, then each
/// section's options sorted by their first spelling), and warnings for keys no option has.
pub fn read_config(path: &str, text: &str) -> Result<(Vec<FileValue>, Vec<String>), String> {
    let sections =
        parse_ini(text).ok_or_else(|| format!("failed to parse server config file: {path}"))?;
    let mut warnings = Vec::new();
    let mut values = Vec::new();
    for name in ["*", "default"] {
        let Some(pairs) = sections.get(name) else {
            continue;
        };
        let mut chosen: BTreeMap<&'static str, FileValue> = BTreeMap::new();
        for (key, value) in pairs {
            if key == "version" {
                continue;
            }
            let Some((opt, negative)) = option_for_key(key) else {
                warnings.push(format!(
                    "ignoring option '{key}' from {path}: not supported by this program"
                ));
                continue;
            };
            let value = if negative {
                if is_truthy(value) { "false" } else { "true" }.to_string()
            } else {
                value.clone()
            };
            chosen.insert(opt.names[0], FileValue { opt, value });
        }
        values.extend(chosen.into_values());
    }
    Ok((values, warnings))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ini_grammar() {
        let s = parse_ini("a = 1 ; note\n[*]\n  b=two words  \n# c = 3\n[x:Q4]\nd =\n").unwrap();
        assert_eq!(s["default"]["a"], "1");
        assert_eq!(s["*"]["b"], "two words");
        assert_eq!(s["x:Q4"]["d"], "");
        assert!(parse_ini("just text\n").is_none());
        assert!(parse_ini("9key = 1\n").is_none());
        assert!(parse_ini("[open\n").is_none());
    }

    #[test]
    fn keys_name_options_by_spelling_or_variable() {
        let (values, warnings) = read_config(
            "c.ini",
            "ctx-size = 4096\nLLAMA_ARG_PORT = 9000\nno-cont-batching = true\nbogus = 1\nversion = 1\n",
        )
        .unwrap();
        let got: Vec<(&str, &str)> = values
            .iter()
            .map(|v| (v.opt.long_name(), v.value.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("--port", "9000"),
                ("--ctx-size", "4096"),
                ("--cont-batching", "false")
            ]
        );
        assert_eq!(
            warnings,
            vec!["ignoring option 'bogus' from c.ini: not supported by this program"]
        );
    }
}
