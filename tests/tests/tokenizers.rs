//! The engine's tokenizer path against Python's, without root: the
//! vectors `tests/peers/tokenizer_vectors.py` wrote (run by the peers'
//! install) from real `tokenizer.json` files shipped in PyPI packages,
//! encoded by the Python `tokenizers` package, and the chat templates
//! llama.cpp ships (the llama-cpp-python sdist's `models/templates/`),
//! rendered by Hugging Face `transformers`' own renderer on conversations
//! with system prompts, tools, tool calls and multi-turn history.
//!
//! What must hold: every encoding's length and ids equal; every template
//! renders byte-identical (or fails where Python's raised).

use std::{collections::BTreeMap, path::PathBuf};

use serde_json::Value;
use tokentap::tokenize::{
    template::{ChatTemplate, Json},
    HfFiles, Tokenizer,
};

/// `s` from 20 bytes before `at` to 40 after, on character boundaries.
fn around(s: &str, at: usize) -> &str {
    let mut a = at.saturating_sub(20).min(s.len());
    while !s.is_char_boundary(a) {
        a -= 1;
    }
    let mut b = (at + 40).min(s.len());
    while !s.is_char_boundary(b) {
        b += 1;
    }
    &s[a..b]
}

/// Differences between minijinja and Python's Jinja2 that are known and
/// small (a few characters of a tool schema), by what they are.
fn known_divergence(ours: &str, python: &str, at: usize) -> Option<&'static str> {
    let (o, p) = (around(ours, at), around(python, at));
    // `"default: " ~ 1e-05`: `~` writes minijinja's float (0.00001, 3),
    // not Python's str() (1e-05, 3.0); `{{ x }}` and `|string` write
    // Python's.
    let floaty =
        |s: &str| s[s.len().min(20)..].starts_with(|c: char| c.is_ascii_digit() || c == '.');
    if floaty(o) && floaty(p) && (p.contains("e-0") || p.contains(".0")) {
        return Some("a float joined with ~ prints as minijinja's, not Python's");
    }
    // `"…"|safe + text`: Python's Markup escapes the plain operand.
    if python[at..].starts_with("&#") || python[at..].starts_with("&amp;") {
        return Some("Markup + str escapes the str in Python");
    }
    None
}

fn vectors() -> (PathBuf, Value) {
    let dir = tokentap_tests::peers::Peers::installed("tokenizer vectors")
        .dir
        .join(".tokenizers");
    let v = std::fs::read(dir.join("vectors.json")).unwrap_or_else(|e| {
        panic!(
            "{}: {e}: run `cargo xtask peers` (install.sh writes it)",
            dir.join("vectors.json").display()
        )
    });
    (
        dir,
        serde_json::from_slice(&v).expect("vectors.json is JSON"),
    )
}

#[test]
#[ignore = "needs the real peers (cargo xtask test installs them as root and runs it)"]
fn hf_tokenizers_encode_as_pythons_tokenizers() {
    let (dir, v) = vectors();
    let toks = v["tokenizers"].as_array().expect("tokenizers");
    assert!(toks.len() >= 3, "at least 3 real tokenizer.json files");
    let mut checked = 0;
    let mut wrong = Vec::new();
    for t in toks {
        let name = t["name"].as_str().unwrap();
        let files = HfFiles {
            tokenizer_json: std::fs::read(dir.join(t["path"].as_str().unwrap())).unwrap(),
            config: None,
            template: None,
        };
        let tok = Tokenizer::from_hf(&files).unwrap_or_else(|e| panic!("{name}: {e}"));
        for c in t["cases"].as_array().unwrap() {
            let text = c["text"].as_str().unwrap();
            let add = c["add_special"].as_bool().unwrap();
            let want: Vec<u32> = c["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i.as_u64().unwrap() as u32)
                .collect();
            let got = tok.encode_ids(text, add).unwrap();
            checked += 1;
            if got != want {
                wrong.push(format!(
                    "{name} add_special={add} {:?}: {} ids, Python {}",
                    text.chars().take(40).collect::<String>(),
                    got.len(),
                    want.len()
                ));
            }
            assert_eq!(tok.encode_len(text, add).unwrap(), got.len() as u64);
        }
    }
    eprintln!(
        "{checked} encodings over {} tokenizers ({}), {} differ",
        toks.len(),
        v["versions"],
        wrong.len()
    );
    assert!(
        wrong.is_empty(),
        "differ from Python:\n{}",
        wrong.join("\n")
    );
}

/// The vectors read with every object's keys in file order (Python's
/// dict order: what a template iterating a tool's properties sees).
fn ordered(path: &std::path::Path) -> Json {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn get<'a>(j: &'a Json, k: &str) -> &'a Json {
    j.get(k).unwrap_or_else(|| panic!("no {k}"))
}

fn items(j: &Json) -> &[Json] {
    match j {
        Json::Array(a) => a,
        _ => panic!("not a list"),
    }
}

#[test]
#[ignore = "needs the real peers (cargo xtask test installs them as root and runs it)"]
fn chat_templates_render_as_transformers_renders_them() {
    let peers = tokentap_tests::peers::Peers::installed("chat templates");
    let path = peers.dir.join(".tokenizers/vectors.json");
    let v = ordered(&path);
    let sdist = peers.sdist();
    let templates = items(get(&v, "templates"));
    let mut rendered = 0;
    let mut raised = 0;
    let mut clock = 0;
    let mut known: BTreeMap<&str, usize> = BTreeMap::new();
    let mut families = std::collections::BTreeSet::new();
    let mut wrong = Vec::new();
    for t in templates {
        let file = get(t, "file").as_str().unwrap();
        let src = std::fs::read_to_string(sdist.join(file)).unwrap();
        let tpl = match ChatTemplate::new(&src, BTreeMap::new()) {
            Ok(t) => t,
            Err(e) => {
                wrong.push(format!("{file}: does not compile: {e}"));
                continue;
            }
        };
        for c in items(get(t, "cases")) {
            // The context as Python passed it, key order kept.
            let Json::Object(kv) = get(c, "context").clone() else {
                panic!()
            };
            let vars = kv.into_iter().map(|(k, v)| (k, v.to_value())).collect();
            let got = tpl.render(vars);
            match (&got, c.get("output").and_then(Json::as_str)) {
                (Ok(g), Some(want)) if g == want => {
                    rendered += 1;
                    families.insert(file);
                }
                (Ok(g), Some(want)) => {
                    if c.get("clock_dependent").and_then(Json::as_bool) == Some(true) {
                        // strftime_now: Python's frozen clock, not ours.
                        clock += 1;
                        continue;
                    }
                    let at = g
                        .bytes()
                        .zip(want.bytes())
                        .position(|(a, b)| a != b)
                        .unwrap_or(g.len().min(want.len()));
                    if let Some(why) = known_divergence(g, want, at) {
                        *known.entry(why).or_insert(0) += 1;
                        continue;
                    }
                    wrong.push(format!(
                        "{file}: differs at byte {at}: ours …{:?}… Python's …{:?}…",
                        around(g, at),
                        around(want, at)
                    ));
                }
                (Err(_), None) => raised += 1,
                (Err(e), Some(_)) => {
                    wrong.push(format!("{file}: fails where Python renders: {e:#}"))
                }
                (Ok(_), None) => {
                    let msg = c.get("message").and_then(Json::as_str).unwrap_or("");
                    // minijinja iterates None as empty and `map` gives a
                    // list where Python's gives a generator: Python's
                    // engine answers such a request 400 (no tokens).
                    let why = if msg.contains("'NoneType' object is not iterable") {
                        Some("Python cannot iterate None; minijinja iterates it as empty")
                    } else if msg.contains("generator is not JSON serializable") {
                        Some("Python's map() is a generator tojson refuses; minijinja's is a list")
                    } else {
                        None
                    };
                    match why {
                        Some(w) => *known.entry(w).or_insert(0) += 1,
                        None => wrong.push(format!("{file}: renders where Python raised ({msg})")),
                    }
                }
            }
        }
    }
    eprintln!(
        "{} templates: {rendered} renders byte-identical, {raised} raise on both sides, {clock} depend on the clock, {} known divergences {known:?}, {} differ",
        templates.len(),
        known.values().sum::<usize>(),
        wrong.len()
    );
    assert!(families.len() >= 5, "at least 5 model families rendered");
    assert!(
        wrong.is_empty(),
        "differ from transformers:\n{}",
        wrong.join("\n")
    );
    // Renders that differ in a known way stay rare (Python-side
    // exceptions are not renders).
    let n_known: usize = known
        .iter()
        .filter(|(w, _)| !w.starts_with("Python"))
        .map(|(_, n)| n)
        .sum();
    assert!(
        n_known * 100 <= rendered * 3,
        "known divergences past 3% of the identical renders: {known:?}"
    );
}

#[test]
#[ignore = "needs the real peers (cargo xtask test installs them as root and runs it)"]
fn a_conversations_repeated_prefix_is_counted_once_and_exactly() {
    let peers = tokentap_tests::peers::Peers::installed("prefix cache");
    let files = HfFiles {
        tokenizer_json: std::fs::read(peers.dir.join(".tokenizers/tok/llama2/tokenizer.json"))
            .unwrap(),
        config: None,
        template: None,
    };
    let tok = Tokenizer::from_hf(&files).unwrap();
    let mut prompt = String::from("<s>[system] You are a careful assistant. ");
    prompt.push_str(&"Answer with facts, cite sources, and keep it short. ".repeat(20));
    prompt.push_str("</s>");
    for turn in 0..40 {
        prompt.push_str(&format!(
            "<s>[user] Question {turn}: what is {turn} × 7, and why — in plain words?</s><s>[assistant] {turn} × 7 is {}, because seven groups of {turn} make it.</s>",
            turn * 7
        ));
        assert_eq!(
            tok.prompt_len(&prompt).unwrap(),
            tok.encode_len(&prompt, false).unwrap(),
            "turn {turn}"
        );
    }
    let st = tok.prefix_stats();
    assert!(!st.off, "{st:?}");
    assert!(st.hits > st.misses * 10, "the history is reused: {st:?}");
    assert!(st.verified >= 8, "{st:?}");
}
