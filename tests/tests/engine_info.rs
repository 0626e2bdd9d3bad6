//! Each engine's info endpoint answer (`tests/golden/engine_info/`: real
//! responses where one could be found or recorded — llama.cpp's `/props`
//! recorded from the test peers' llama-server — and what each file says it
//! is) reads as the engine's build and the catalogue's settings, and
//! nothing else of it is kept (SGLang's carries the server's `api_key`).

use std::path::Path;

use serde_json::Value;
use tokentap::{engines::Engine, identity::engine_info};

#[test]
fn every_engines_info_answer_reads_as_its_build_and_settings() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/engine_info");
    let mut seen = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        let g: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let engine = Engine::from_name(g["engine"].as_str().unwrap())
            .unwrap_or_else(|| panic!("{}: unknown engine", path.display()));
        let body = g["body"].as_str().unwrap();
        let got = engine_info::parse(engine, body.as_bytes())
            .unwrap_or_else(|| panic!("{}: not read", path.display()));
        assert_eq!(
            got.version.as_deref(),
            g["expect"]["version"].as_str(),
            "{}",
            path.display()
        );
        let want: std::collections::BTreeMap<String, String> =
            serde_json::from_value(g["expect"]["settings"].clone()).unwrap();
        assert_eq!(got.settings, want, "{}", path.display());
        assert!(!format!("{got:?}").contains("api_key"));
        seen.push(engine);
    }
    seen.sort();
    let with_endpoint: Vec<Engine> = Engine::ALL
        .into_iter()
        .filter(|e| e.spec().info.is_some())
        .collect();
    assert_eq!(
        seen, with_endpoint,
        "one answer per engine with an info endpoint"
    );
}

#[test]
fn an_answer_that_is_not_an_object_or_says_nothing_is_not_read() {
    for body in ["", "[]", "\"1.0\"", "{}", "{\"version\":{}}", "<html>"] {
        assert_eq!(
            engine_info::parse(Engine::Vllm, body.as_bytes()),
            None,
            "{body}"
        );
    }
    // An engine without an info endpoint reads nothing.
    assert_eq!(
        engine_info::parse(Engine::Lmdeploy, b"{\"version\":\"1\"}"),
        None
    );
}
