//! docs/usage.md's flag reference is written from `tokentap run --help`:
//! each heading of the help and, under it, each flag with the first
//! sentence of its help, between two markers. The help (the flags' doc
//! comments in `agent/src/pipeline/plan.rs`) is the one text; this test
//! fails when the page lags behind it, and `cargo xtask bless`
//! (`TOKENTAP_BLESS=1`) writes the page's section anew. No root needed.

use std::path::PathBuf;

const BEGIN: &str = "<!-- BEGIN flag reference: written from `tokentap run --help` by `cargo xtask bless`; edit the flags' help in agent/src/pipeline/plan.rs, not here -->";
const END: &str = "<!-- END flag reference -->";

/// The first sentence of a flag's help (up to the first ". " that does
/// not close "e.g." or "i.e.", or all of it).
fn first_sentence(help: &str) -> String {
    let help = help.trim();
    let end = help.match_indices(". ").map(|(i, _)| i).find(|&i| {
        let before = &help[..i];
        !(before.ends_with("e.g") || before.ends_with("i.e"))
    });
    match end {
        Some(i) => help[..=i].to_string(),
        None => help.trim_end_matches('.').to_string() + ".",
    }
}

/// The markdown section made from `run --help`'s text.
fn reference(help: &str) -> String {
    let mut out = String::new();
    let mut lines = help.lines().peekable();
    while let Some(l) = lines.next() {
        // A heading: "Targets:" at column 0, not the usage line.
        if !l.starts_with(' ') && l.ends_with(':') && l != "Options:" {
            out += &format!("\n**{}**\n\n", l.trim_end_matches(':'));
            continue;
        }
        let t = l.trim_start();
        if !(l.starts_with("      --") || l.starts_with("  -"))
            || t.starts_with("-h,")
            || t.starts_with("-V,")
        {
            continue;
        }
        // The flag line, then its help up to a blank line.
        let mut text = String::new();
        while let Some(h) = lines.peek() {
            if h.trim().is_empty() {
                break;
            }
            text += " ";
            text += h.trim();
            lines.next();
        }
        if out.is_empty() {
            continue; // Options: only -h/-V
        }
        out += &format!("* `{t}` — {}\n", first_sentence(&text));
    }
    out
}

#[test]
fn usage_md_flag_reference_is_run_help() {
    let help = std::process::Command::new(tokentap_tests::tokentap_bin())
        .args(["run", "--help"])
        .env("COLUMNS", "10000")
        .output()
        .expect("tokentap run --help");
    assert!(help.status.success());
    let help = String::from_utf8(help.stdout).expect("utf-8 help");
    let want = reference(&help);
    assert!(
        want.matches("**").count() >= 12,
        "headings found in --help:\n{want}"
    );
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/usage.md");
    let page = std::fs::read_to_string(&path).expect("docs/usage.md");
    let (Some(b), Some(e)) = (page.find(BEGIN), page.find(END)) else {
        panic!("docs/usage.md has no flag reference markers ({BEGIN} … {END})");
    };
    let have = &page[b + BEGIN.len()..e];
    let want_block = format!("\n{}\n", want.trim());
    if have != want_block {
        if std::env::var_os("TOKENTAP_BLESS").is_some() {
            let new = format!("{}{want_block}{}", &page[..b + BEGIN.len()], &page[e..]);
            std::fs::write(&path, new).expect("write docs/usage.md");
            return;
        }
        panic!(
            "docs/usage.md's flag reference is not what `tokentap run --help` says: run `cargo xtask bless`.\nWanted:\n{want_block}"
        );
    }
}
