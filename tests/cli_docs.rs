//! The generated documents come from the option table: the committed man page is current, and
//! every completion script offers every option.

use bloomery::cli::docs::{completion_bash, generate, man_page, DocKind};
use bloomery::cli::table::all_options;

#[test]
fn committed_man_page_is_current() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/man/bloomery-serve.1");
    let committed = std::fs::read_to_string(path).expect("man/bloomery-serve.1 is committed");
    assert!(
        committed == man_page(),
        "man/bloomery-serve.1 is stale: run scripts/gen-docs.sh"
    );
}

#[test]
fn man_page_names_every_spelling_and_variable() {
    let man = man_page();
    for o in all_options() {
        for s in o.spellings() {
            assert!(
                man.contains(&format!("\\fB{}\\fR", s.replace('-', "\\-"))),
                "{s} missing from the man page"
            );
        }
        if let Some(env) = o.env {
            assert!(
                man.contains(&format!(".B {}\n", env.replace('-', "\\-"))),
                "{env} missing"
            );
        }
    }
}

#[test]
fn upstream_style_bash_completion_offers_every_spelling() {
    let script = completion_bash();
    let words: Vec<&str> = script
        .lines()
        .find_map(|l| l.trim().strip_prefix("opts=\""))
        .and_then(|l| l.strip_suffix('"'))
        .expect("opts line")
        .split(' ')
        .collect();
    for o in all_options() {
        for s in o.names {
            assert!(words.contains(s), "{s} missing from --completion-bash");
        }
    }
    assert!(script.ends_with("complete -F _bloomery_serve_completions bloomery-serve\n"));
}

#[test]
fn clap_completions_offer_every_long_spelling() {
    for kind in [DocKind::Bash, DocKind::Zsh, DocKind::Fish] {
        let script = generate(kind);
        for o in all_options() {
            for s in o.spellings().filter(|s| s.starts_with("--")) {
                let long = &s[2..];
                let found = match kind {
                    DocKind::Fish => {
                        script.contains(&format!("-l {long} "))
                            || script.contains(&format!("-l {long}\n"))
                    }
                    _ => script.contains(s),
                };
                assert!(found, "{s} missing from the {kind:?} completions");
            }
        }
    }
}
