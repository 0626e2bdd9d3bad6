//! What changed, as root: a vLLM-compatible engine (`simengine` named like
//! vLLM's API server, answering `GET /version` as vLLM does) in its own
//! network namespace, served four times on the same port with the same
//! model, the agent started first:
//! 1. `--max-num-seqs 64`, build 0.6.1;
//! 2. `--max-num-seqs 256`;
//! 3. build 0.6.2;
//! 4. plus `--api-key <secret>`.
//!
//! Records carry each round's `engine_version` and `serving_config_version`;
//! the events are exactly one `engine.config.change` naming `max-num-seqs`
//! 64 → 256 after (2), one `engine.version.change` 0.6.1 → 0.6.2 after
//! (3), and no `model_version.*` event after (1); the secret is in no file,
//! no output line and no export.

use std::{path::Path, time::Duration};

use serde_json::{json, Value};
use tokentap_tests::{
    assert_root, free_port, http, interrupt, otlp, read_jsonl, scratch_dir, start, Netns, RunAgent,
};

const SECRET: &str = "sk-tokentap-test-7f3a9c1e5b";

fn ask(addr: &str, model: &str) {
    let body = json!({"model": model, "stream": true,
        "sim": {"ttft_ms": 3, "gap_ms": 1, "tokens": 2}})
    .to_string();
    let req = http::post_with_headers(
        "/v1/chat/completions",
        "engine",
        &[("Connection", "close")],
        &body,
    );
    let (r, _) = http::exchange(addr, &req).expect("a response from the engine");
    assert!(
        String::from_utf8_lossy(&r.body).contains("[DONE]"),
        "{model}: no stream"
    );
}

#[test]
#[ignore = "needs root: eBPF, network namespaces (cargo xtask test runs it as root)"]
fn an_engines_build_and_serving_flags_are_versioned_apart_from_its_model() {
    assert_root("engineversion");
    let dir = scratch_dir("engineversion");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (metrics, logs, rport) = otlp::start_receiver_with_logs(&rt, 0);
    let ns = Netns::create("tev", 76);
    let port = free_port();
    let (log, events) = (dir.join("requests.jsonl"), dir.join("events.jsonl"));
    let (mut agent, agent_out) = RunAgent::new()
        .port(port)
        .no_gpu()
        .otlp(rport)
        .requests_log(&log)
        .events_log(&events)
        .start();
    let addr = format!("{}:{port}", ns.ns_addr);
    let rounds: [(&str, &str, bool); 4] = [
        ("0.6.1", "64", false),
        ("0.6.1", "256", false),
        ("0.6.2", "256", false),
        ("0.6.2", "256", true),
    ];
    for (i, (version, seqs, secret)) in rounds.iter().enumerate() {
        let mut cmd = ns.command(Path::new(env!("CARGO_BIN_EXE_simengine")));
        cmd.env("SIMENGINE_VERSION", version)
            .args(["--addr", "0.0.0.0", "--port", &port.to_string()])
            .args([
                "vllm.entrypoints.openai.api_server",
                "--model",
                "/models/tiny-chat",
            ])
            .args(["--max-num-seqs", seqs]);
        if *secret {
            cmd.args(["--api-key", SECRET]);
        }
        let (engine, _out) = start(&mut cmd, "listening", "simengine");
        // The agent names the new process at its listen(2) and asks its
        // /version at its next tick (1 s).
        std::thread::sleep(Duration::from_millis(2500));
        for j in 0..3 {
            ask(&addr, &format!("r{}-{j}", i + 1));
        }
        std::thread::sleep(Duration::from_millis(300));
        drop(engine);
        std::thread::sleep(Duration::from_millis(500));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let (ok, lines) = interrupt(&mut agent, agent_out);
    assert!(ok, "tokentap run failed: {lines:#?}");

    let records = read_jsonl(&log);
    let mut config_versions = Vec::new();
    for (i, (version, _, _)) in rounds.iter().enumerate() {
        let rs: Vec<&Value> = records
            .iter()
            .filter(|r| {
                r["request_model"]
                    .as_str()
                    .is_some_and(|m| m.starts_with(&format!("r{}-", i + 1)))
            })
            .collect();
        assert_eq!(rs.len(), 3, "round {}: {records:#?}", i + 1);
        for r in &rs {
            assert_eq!(r["engine_version"], *version, "round {}: {r}", i + 1);
            assert_eq!(r["provider"], "vllm", "{r}");
            assert!(r["serving_config_version"].is_string(), "{r}");
            assert_eq!(r["serving_config_version"], rs[0]["serving_config_version"]);
            assert!(r["model_version"].is_string(), "a model version: {r}");
            assert_eq!(r["model_version"], records[0]["model_version"], "one model");
        }
        config_versions.push(
            rs[0]["serving_config_version"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_ne!(
        config_versions[0], config_versions[1],
        "--max-num-seqs changed"
    );
    assert_eq!(
        config_versions[1], config_versions[2],
        "only the build changed"
    );
    assert_eq!(
        config_versions[2], config_versions[3],
        "a secret is no parameter"
    );

    let evs = read_jsonl(&events);
    let of = |k: &str| evs.iter().filter(|e| e["kind"] == k).collect::<Vec<_>>();
    let config = of("engine.config.change");
    assert_eq!(config.len(), 1, "{evs:#?}");
    let a = &config[0]["attributes"];
    assert_eq!(a["changed"], json!(["max-num-seqs"]), "{a}");
    assert_eq!(a["previous"], json!({"max-num-seqs": "64"}), "{a}");
    assert_eq!(a["current"], json!({"max-num-seqs": "256"}), "{a}");
    // The whole new set: the simengine's own flags ride along, constant.
    assert_eq!(a["serving_config"]["max-num-seqs"], "256", "{a}");
    assert!(a["serving_config"].get("port").is_none(), "{a}");
    assert_eq!(
        a["tokentap.serving_config.version"],
        config_versions[1].as_str()
    );
    let version = of("engine.version.change");
    assert_eq!(version.len(), 1, "{evs:#?}");
    let a = &version[0]["attributes"];
    assert_eq!(a["tokentap.engine.version.previous"], "0.6.1", "{a}");
    assert_eq!(a["tokentap.engine.version"], "0.6.2", "{a}");
    let model_events: Vec<_> = evs
        .iter()
        .filter(|e| e["kind"].as_str().unwrap().starts_with("model_version."))
        .collect();
    assert_eq!(
        model_events.len(),
        1,
        "only the first round's model_version.new: {model_events:#?}"
    );
    assert_eq!(model_events[0]["kind"], "model_version.new");
    // The order: the config change after round 2 began, the build change
    // after round 3 began.
    let ts = |e: &Value| e["ts"].as_str().unwrap().to_string();
    let first_of = |round: usize| {
        records
            .iter()
            .filter(|r| {
                r["request_model"]
                    .as_str()
                    .unwrap()
                    .starts_with(&format!("r{round}-"))
            })
            .map(|r| r["ts"].as_str().unwrap().to_string())
            .min()
            .unwrap()
    };
    assert!(
        ts(config[0]) < first_of(3) && ts(version[0]) < first_of(4),
        "{evs:#?}"
    );

    // The gauge: each round's engine process with its versions.
    let exports = metrics.exports();
    let seen = format!("{exports:?}");
    assert!(
        seen.contains("tokentap.engine.info"),
        "no tokentap.engine.info exported"
    );
    for v in &config_versions {
        assert!(seen.contains(v.as_str()), "{v} not on tokentap.engine.info");
    }

    // The secret: nowhere.
    let mut everywhere = String::new();
    for f in [&log, &events] {
        everywhere.push_str(&std::fs::read_to_string(f).unwrap());
    }
    everywhere.push_str(&lines.join("\n"));
    everywhere.push_str(&seen);
    everywhere.push_str(&format!("{:?}", logs.records()));
    assert!(!everywhere.contains(SECRET), "the secret leaked");
    assert!(
        !everywhere.contains("api-key"),
        "the secret's flag is no parameter"
    );
}
