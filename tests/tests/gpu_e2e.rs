//! End to end: the agent joins GPU state into requests. A simulated engine
//! whose GPU work runs in a child process ("GPU worker", as vLLM's API
//! server and workers); the scripted fake NVML puts only that child's pid
//! on a GPU; requests streamed at known rates. Every record must carry the
//! GPU, the scripted utilisation and memory, and an energy share that
//! follows the tokens; energy must be conserved (requests + idle = what the
//! GPU's counter says); and the OTLP receiver must see every GPU
//! instrument with the scripted values and attributes.

use std::{collections::BTreeSet, net::TcpStream, process::Command, time::Duration};

use opentelemetry_proto::tonic::{
    collector::metrics::v1::ExportMetricsServiceRequest,
    common::v1::any_value::Value as Any,
    metrics::v1::{metric::Data, number_data_point::Value as Num, NumberDataPoint},
};
use serde_json::{json, Value};
use tokentap_tests::{
    assert_root,
    fakenvml::install_fake_nvml,
    http, interrupt,
    otlp::{number_points, Receiver},
    read_jsonl, scratch_dir, start, RunAgent,
};

const GPU: &str = "GPU-e2e-0";
const OTHER_GPU: &str = "GPU-e2e-other";
const WORKER_BYTES: u64 = 80 << 30;
/// Scripted: 300 W, the counter steps 30 J every 100 ms from 1000 J.
const E0_J: f64 = 1000.0;

fn attr(p: &NumberDataPoint, k: &str) -> Option<String> {
    p.attributes.iter().find(|a| a.key == k).and_then(|a| {
        match a.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(Any::StringValue(s)) => Some(s.clone()),
            Some(Any::IntValue(i)) => Some(i.to_string()),
            _ => None,
        }
    })
}

fn value(p: &NumberDataPoint) -> f64 {
    match p.value {
        Some(Num::AsInt(i)) => i as f64,
        Some(Num::AsDouble(d)) => d,
        None => f64::NAN,
    }
}

/// Data points of metric `name` in the last export that has it.
fn points(exports: &[ExportMetricsServiceRequest], name: &str) -> Vec<NumberDataPoint> {
    for e in exports.iter().rev() {
        for m in e
            .resource_metrics
            .iter()
            .flat_map(|rm| &rm.scope_metrics)
            .flat_map(|sm| &sm.metrics)
            .filter(|m| m.name == name)
        {
            match &m.data {
                Some(Data::Gauge(g)) => return g.data_points.clone(),
                Some(Data::Sum(s)) => return s.data_points.clone(),
                _ => {}
            }
        }
    }
    vec![]
}

fn scenario(worker: u32, other: u32) -> Value {
    let steps: Vec<Value> = (0..600u64)
        .map(|k| {
            json!({"t_ms": k * 100, "devices": [
                {"util_gpu": 42, "util_memory": 7, "memory_total": 150_000_000_000u64,
                 "memory_used": 100_000_000_000u64, "power_mw": 300_000,
                 "energy_mj": 1_000_000 + 30_000 * k, "temperature_c": 55,
                 "sm_clock_mhz": 1980, "clocks_event_reasons": 4,
                 "compute_processes": [{"pid": worker, "used_bytes": WORKER_BYTES}]},
                {"util_gpu": 3, "util_memory": 1, "memory_total": 150_000_000_000u64,
                 "memory_used": 1_000_000_000u64, "power_mw": 90_000,
                 "energy_mj": 5_000_000 + 9_000 * k, "temperature_c": 40,
                 "sm_clock_mhz": 1000, "clocks_event_reasons": 0,
                 "compute_processes": [{"pid": other, "used_bytes": 1_000_000_000u64}]}
            ]})
        })
        .collect();
    json!({
        "devices": [{"uuid": GPU, "name": "NVIDIA H200"}, {"uuid": OTHER_GPU, "name": "NVIDIA H200"}],
        "steps": steps
    })
}

fn stream(port: u16, id: u64, tokens: u64, gap_ms: u64) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let body = json!({"model": "sim-gpu", "stream": true,
            "sim": {"id": id, "ttft_ms": 5, "gap_ms": gap_ms, "tokens": tokens}});
        let r = http::round_trip(&mut s, "/v1/chat/completions", &body.to_string()).unwrap();
        assert!(r.complete);
    })
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn requests_get_their_engines_gpu_utilisation_memory_and_a_token_share_of_its_energy() {
    assert_root("GPU join end to end");
    let otlp = Receiver::start();
    let dir = scratch_dir("gpu-e2e");
    let log = dir.join("requests.jsonl");

    let (engine, out) = start(
        Command::new(env!("CARGO_BIN_EXE_simengine")).arg("--gpu-worker"),
        "listening",
        "simengine",
    );
    let (mut worker, mut port) = (0u32, 0u16);
    while worker == 0 || port == 0 {
        let Ok(l) = out.recv_timeout(Duration::from_secs(10)) else {
            break;
        };
        if let Some(p) = l.strip_prefix("worker ") {
            worker = p.parse().unwrap();
        }
        if let Some(p) = l.strip_prefix("listening ") {
            port = p.parse().unwrap();
        }
    }
    assert!(
        worker > 0 && port > 0,
        "simengine said worker {worker} port {port}"
    );
    // An unrelated process on the other GPU.
    let mut other = tokentap_tests::Running(Command::new("sleep").arg("60").spawn().unwrap());
    let scen = dir.join("scenario.json");
    std::fs::write(&scen, scenario(worker, other.0.id()).to_string()).unwrap();
    let lib = install_fake_nvml(&dir);

    let (mut agent, agent_out) = RunAgent::new()
        .pid(engine.0.id())
        .args(["--gpu-interval", "0.2"])
        .requests_log(&log)
        .otlp(otlp.port)
        .arg("--nvml-library")
        .arg(&lib)
        .env("FAKE_NVML_SCENARIO", &scen)
        .start();
    // Let the sampler find the worker on the GPU.
    std::thread::sleep(Duration::from_millis(800));
    // A and B together: A writes tokens twice as fast (40 × 25 ms vs
    // 20 × 50 ms), so it must get twice B's energy.
    let a = stream(port, 1, 40, 25);
    let b = stream(port, 2, 20, 50);
    a.join().unwrap();
    b.join().unwrap();
    // Idle, then C alone.
    std::thread::sleep(Duration::from_millis(1000));
    stream(port, 3, 10, 50).join().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let (ok, lines) = interrupt(&mut agent, agent_out);
    let stderr = lines.join("\n");
    assert!(ok, "tokentap run failed: {stderr}");
    let _ = other.0.kill();

    let recs = read_jsonl(&log);
    assert_eq!(recs.len(), 3, "{recs:?}\n{stderr}");
    let by_id = |tokens: u64| {
        recs.iter()
            .find(|r| r["output_tokens"] == tokens)
            .unwrap_or_else(|| panic!("no record with {tokens} tokens: {recs:?}"))
    };
    let (ra, rb, rc) = (by_id(40), by_id(20), by_id(10));
    for r in [ra, rb, rc] {
        assert_eq!(r["gpu_uuids"], json!([GPU]), "{r}");
        assert!(
            (r["gpu_util_avg"].as_f64().unwrap() - 0.42).abs() < 1e-9,
            "{r}"
        );
        assert_eq!(r["gpu_mem_used_bytes"], WORKER_BYTES, "{r}");
        assert_eq!(r["energy_source"], "counter", "{r}");
        assert!(r["energy_j"].as_f64().unwrap() > 0.0, "{r}");
    }
    let (ea, eb, ec) = (
        ra["energy_j"].as_f64().unwrap(),
        rb["energy_j"].as_f64().unwrap(),
        rc["energy_j"].as_f64().unwrap(),
    );
    eprintln!("energy A {ea:.1} J, B {eb:.1} J, C {ec:.1} J");
    assert!(
        (1.6..=2.4).contains(&(ea / eb)),
        "A wrote twice B's tokens in the same intervals: {ea} vs {eb}"
    );
    // C alone: every interval it touched, whole (300 W × a multiple of
    // 0.2 s, at least its 0.5 s duration).
    assert!(ec >= 300.0 * 0.5 - 1e-6, "{ec}");

    let exports = otlp.metrics.exports();
    // Conservation: requests + idle = the GPU's counter since the first sample.
    let idle: f64 = points(&exports, "tokentap.gpu.idle_energy")
        .iter()
        .filter(|p| attr(p, "hw.id").as_deref() == Some(GPU))
        .map(value)
        .sum();
    let counter: f64 = points(&exports, "hw.energy")
        .iter()
        .filter(|p| attr(p, "hw.id").as_deref() == Some(GPU))
        .map(value)
        .sum();
    let total = counter - E0_J;
    eprintln!(
        "GPU energy {total:.1} J = requests {:.1} + idle {idle:.1}",
        ea + eb + ec
    );
    assert!(
        (ea + eb + ec + idle - total).abs() < 1e-6 * total.max(1.0),
        "requests {} + idle {idle} != {total}",
        ea + eb + ec
    );
    assert!(idle > 0.0, "the idle seconds are idle energy");

    // Every GPU instrument, with the scripted values and attributes.
    let names: BTreeSet<String> = exports
        .iter()
        .flat_map(|e| &e.resource_metrics)
        .flat_map(|rm| &rm.scope_metrics)
        .flat_map(|sm| &sm.metrics)
        .map(|m| m.name.clone())
        .collect();
    for n in [
        "hw.gpu.utilization",
        "hw.gpu.memory.usage",
        "hw.gpu.memory.limit",
        "hw.gpu.memory.utilization",
        "hw.power",
        "hw.energy",
        "hw.temperature",
        "tokentap.gpu.memory_controller.utilization",
        "tokentap.gpu.clock.sm",
        "tokentap.gpu.throttled",
        "tokentap.gpu.process.memory.usage",
        "tokentap.gpu.energy_per_output_token",
        "tokentap.engine.gpu",
        "tokentap.gpu.idle_energy",
    ] {
        assert!(names.contains(n), "{n} not exported: {names:?}");
    }
    let util = points(&exports, "hw.gpu.utilization");
    let u = util
        .iter()
        .find(|p| attr(p, "hw.id").as_deref() == Some(GPU))
        .expect("utilisation of the engine's GPU");
    assert!((value(u) - 0.42).abs() < 1e-9);
    assert_eq!(attr(u, "hw.vendor").as_deref(), Some("nvidia"));
    assert_eq!(attr(u, "hw.name").as_deref(), Some("NVIDIA H200"));
    let power = points(&exports, "hw.power");
    assert!(power
        .iter()
        .any(|p| attr(p, "hw.id").as_deref() == Some(GPU) && (value(p) - 300.0).abs() < 1e-9));
    let throttled = points(&exports, "tokentap.gpu.throttled");
    let t = throttled
        .iter()
        .find(|p| attr(p, "hw.id").as_deref() == Some(GPU))
        .unwrap();
    assert_eq!(value(t), 1.0);
    assert_eq!(
        attr(t, "tokentap.gpu.throttle_reason").as_deref(),
        Some("sw_power_cap")
    );
    // The engine → GPU map: only the worker's GPU, under the engine's pid.
    let map = points(&exports, "tokentap.engine.gpu");
    let engine_pid = engine.0.id().to_string();
    let gpus: Vec<String> = map
        .iter()
        .filter(|p| attr(p, "tokentap.engine.pid").as_deref() == Some(&engine_pid))
        .filter_map(|p| attr(p, "hw.id"))
        .collect();
    assert_eq!(gpus, vec![GPU.to_string()], "{map:?}");
    // Per-process memory: the worker, named with its engine.
    let mem = points(&exports, "tokentap.gpu.process.memory.usage");
    let w = mem
        .iter()
        .find(|p| attr(p, "process.pid") == Some(worker.to_string()))
        .expect("the worker's memory");
    assert_eq!(value(w), WORKER_BYTES as f64);
    assert_eq!(attr(w, "tokentap.engine.pid"), Some(engine_pid.clone()));
    let o = mem
        .iter()
        .find(|p| attr(p, "process.pid") == Some(other.0.id().to_string()))
        .expect("the unrelated process's memory");
    assert_eq!(attr(o, "tokentap.engine.pid"), None);
    // Energy per token while A and B ran: 300 W × 0.2 s over 12 tokens per
    // interval = 5 J/token (edge intervals differ: any point within 2×).
    let ept: Vec<f64> = number_points(&exports, "tokentap.gpu.energy_per_output_token")
        .iter()
        .map(value)
        .collect();
    assert!(!ept.is_empty() && ept.iter().all(|v| *v > 0.0), "{ept:?}");
    // No GPU UUID on request histograms.
    let ttft_attrs: Vec<String> = exports
        .iter()
        .flat_map(|e| &e.resource_metrics)
        .flat_map(|rm| &rm.scope_metrics)
        .flat_map(|sm| &sm.metrics)
        .filter(|m| m.name == "gen_ai.server.time_to_first_token")
        .filter_map(|m| match &m.data {
            Some(Data::Histogram(h)) => Some(h.data_points.clone()),
            _ => None,
        })
        .flatten()
        .flat_map(|p| p.attributes.into_iter().map(|a| a.key))
        .collect();
    assert!(!ttft_attrs.is_empty() && !ttft_attrs.iter().any(|k| k.starts_with("hw.")));
    drop(engine);
}

/// Starts simengine with a GPU worker child; returns it, the worker's pid
/// and the port.
fn start_engine() -> (tokentap_tests::Running, u32, u16) {
    let (engine, out) = start(
        Command::new(env!("CARGO_BIN_EXE_simengine")).arg("--gpu-worker"),
        "listening",
        "simengine",
    );
    let (mut worker, mut port) = (0u32, 0u16);
    while worker == 0 || port == 0 {
        let l = out
            .recv_timeout(Duration::from_secs(10))
            .expect("simengine says its worker and port");
        if let Some(p) = l.strip_prefix("worker ") {
            worker = p.parse().unwrap();
        }
        if let Some(p) = l.strip_prefix("listening ") {
            port = p.parse().unwrap();
        }
    }
    (engine, worker, port)
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn without_nvml_requests_are_measured_as_usual_and_the_cause_is_said_once() {
    assert_root("no NVML");
    let dir = scratch_dir("gpu-none");
    let log = dir.join("requests.jsonl");
    let missing = dir.join("no-such-dir/libnvidia-ml.so.1");
    let (engine, _worker, port) = start_engine();
    let (mut agent, out) = RunAgent::new()
        .pid(engine.0.id())
        .args(["--gpu-interval", "0.2"])
        .requests_log(&log)
        .arg("--nvml-library")
        .arg(&missing)
        .start();
    for i in 0..3 {
        stream(port, i, 5, 10).join().unwrap();
    }
    std::thread::sleep(Duration::from_millis(1500));
    let (ok, lines) = interrupt(&mut agent, out);
    assert!(ok, "{lines:?}");
    let said: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("GPU metrics off"))
        .collect();
    assert_eq!(said.len(), 1, "the cause, once: {lines:?}");
    assert!(said[0].contains("cannot be loaded"), "{}", said[0]);
    let recs = read_jsonl(&log);
    assert_eq!(recs.len(), 3, "{lines:?}");
    for r in &recs {
        assert!(r["ttft_s"].as_f64().is_some(), "{r}");
        assert_eq!(r["gpu_uuids"], Value::Null, "{r}");
        assert_eq!(r["energy_j"], Value::Null, "{r}");
    }
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn a_gpu_lost_mid_run_leaves_the_agent_measuring() {
    assert_root("GPU lost");
    let dir = scratch_dir("gpu-lost");
    let log = dir.join("requests.jsonl");
    let lib = install_fake_nvml(&dir);
    let scen = dir.join("scenario.json");
    // Written once the worker's pid is known; the agent reads it at init.
    let (engine, worker, port) = start_engine();
    // Healthy for 8 s (the scenario's clock starts at the agent's NVML
    // init, before its eBPF set-up and "ready": a loaded CI machine spent
    // most of 1.5 s there, and an AMD EPYC VM over 4 s — the GPU was lost
    // before the first request), then lost for good.
    let steps: Vec<Value> = (0..100u64)
        .map(|k| {
            json!({"t_ms": k * 100, "devices": [{
                "util_gpu": 50, "memory_total": 150_000_000_000u64, "memory_used": 1u64 << 30,
                "power_mw": 200_000, "energy_mj": 1_000 + 20_000 * k,
                "compute_processes": [{"pid": worker, "used_bytes": 1u64 << 30}],
                "lost": k >= 80}]})
        })
        .collect();
    std::fs::write(
        &scen,
        json!({"devices": [{"uuid": GPU, "name": "NVIDIA H200"}], "steps": steps}).to_string(),
    )
    .unwrap();
    // The agent's NVML init comes after its start: the loss is at least
    // 8 s from here.
    let spawned = std::time::Instant::now();
    let (mut agent, agent_out) = RunAgent::new()
        .pid(engine.0.id())
        .args(["--gpu-interval", "0.2"])
        .requests_log(&log)
        .arg("--nvml-library")
        .arg(&lib)
        .env("FAKE_NVML_SCENARIO", &scen)
        .start();
    std::thread::sleep(Duration::from_millis(500));
    stream(port, 1, 5, 20).join().unwrap(); // while the GPU answers
                                            // Lost from 8 s after the NVML init, itself after `spawned`; with
                                            // 1 s more for the init and a sample to see it.
    std::thread::sleep(
        (spawned + Duration::from_secs(9)).saturating_duration_since(std::time::Instant::now()),
    );
    stream(port, 2, 5, 20).join().unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    let (ok, lines) = interrupt(&mut agent, agent_out);
    assert!(ok, "the agent kept running and stopped cleanly: {lines:?}");
    assert!(
        lines
            .iter()
            .filter(|l| l.contains(&format!("GPU {GPU} (NVIDIA H200) is lost")))
            .count()
            == 1,
        "the loss is said once: {lines:?}"
    );
    let recs = read_jsonl(&log);
    assert_eq!(recs.len(), 2, "{lines:?}");
    let before = &recs[0];
    assert_eq!(before["gpu_uuids"], json!([GPU]), "{before}");
    let after = &recs[1];
    assert!(
        after["ttft_s"].as_f64().is_some(),
        "measured as usual: {after}"
    );
    assert_eq!(
        after["gpu_uuids"],
        Value::Null,
        "no GPU to join: {after}\n{lines:?}"
    );
}
