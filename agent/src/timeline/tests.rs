//! The detectors on a simulated clock: an hour of steady traffic with
//! realistic noise gives no anomaly event; each anomaly, injected into the
//! same traffic, is named on the right tenant and nobody else.

use super::*;
use crate::{record::RequestRecord, vocab::ErrorType};

/// xorshift64*: deterministic noise.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit().max(1e-12), self.unit());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
    fn lognormal(&mut self, median: f64, sigma: f64) -> f64 {
        median * (sigma * self.normal()).exp()
    }
    fn exp(&mut self, rate: f64) -> f64 {
        -(1.0 - self.unit()).max(1e-12).ln() / rate
    }
}

#[derive(Clone)]
struct Tenant {
    name: &'static str,
    /// Mean requests per second.
    rate: f64,
    input_median: f64,
    output_median: f64,
}

/// What a test changes in a tenant's traffic from `from_s` on.
#[derive(Clone, Copy, PartialEq)]
enum Anomaly {
    None,
    /// Request rate × this, with TTFT rising with it.
    Surge(f64),
    /// Every request answered 403.
    Forbidden,
    /// Timeouts, then each body retried several times.
    RetryStorm,
    /// Prompts growing by this factor per minute.
    PromptGrowth(f64),
}

const T0: u64 = 1_800_000_000_000_000_000;

fn finished(rec: RequestRecord, fp: u64) -> Finished {
    Finished {
        record: rec,
        seq: 0,
        content_events: 0,
        self_request: false,
        chunk_gaps_s: vec![],
        prompt_fp: Some(fp),
        text: None,
    }
}

/// Simulated traffic of `tenants` for `secs` seconds; `anomaly` applies to
/// tenant `target` from `from_s`. Returns the events, in order.
fn simulate(
    cfg: Config,
    tenants: &[Tenant],
    secs: f64,
    target: usize,
    anomaly: Anomaly,
    from_s: f64,
    seed: u64,
) -> Vec<Event> {
    let mut rng = Rng(seed);
    let mut recs: Vec<(u64, Finished)> = Vec::new();
    let mut fp_next = 1u64;
    for (i, t) in tenants.iter().enumerate() {
        let mut now = rng.unit() * 2.0;
        // A slow swing (±30 % over 20 min, phase per tenant) and a
        // per-minute jitter of ±20 %.
        let phase = rng.unit() * std::f64::consts::TAU;
        let mut minute_factor = 1.0;
        let mut minute = -1i64;
        while now < secs {
            let m = (now / 60.0) as i64;
            if m != minute {
                minute = m;
                minute_factor = 0.8 + 0.4 * rng.unit();
            }
            let on = i == target && now >= from_s;
            let swing = 1.0 + 0.3 * (now / 1200.0 * std::f64::consts::TAU + phase).sin();
            let mut rate = t.rate * swing * minute_factor;
            if let (true, Anomaly::Surge(k)) = (on, anomaly) {
                rate *= k;
            }
            now += rng.exp(rate);
            let growth = match (on, anomaly) {
                (true, Anomaly::PromptGrowth(g)) => g.powf((now - from_s) / 60.0),
                _ => 1.0,
            };
            let input = rng.lognormal(t.input_median * growth, 0.6).max(1.0) as u64;
            let output = rng.lognormal(t.output_median, 0.5).max(1.0) as u64;
            let mut ttft = rng.lognormal(0.08, 0.4);
            if let (true, Anomaly::Surge(k)) = (on, anomaly) {
                ttft *= k; // queueing behind its own requests
            }
            let dur = ttft + output as f64 * rng.lognormal(0.02, 0.2);
            let mut rec = RequestRecord {
                tenant: Some(t.name.to_string()),
                caller: Some(format!("10.0.0.{i}")),
                model_version: Some("v1".into()),
                request_type: Some("chat".into()),
                response_model: Some("llama".into()),
                provider: Some("vllm".into()),
                pid: 100,
                status: Some(200),
                stream: true,
                ttft_s: Some(ttft),
                duration_s: Some(dur),
                input_tokens: Some(input),
                output_tokens: Some(output),
                t0_ns: T0 + (now * 1e9) as u64,
                ..Default::default()
            };
            // Background noise everyone has: 1 % 5xx, 0.5 % 429, 0.5 %
            // clients that give up; a failed request is retried once.
            let u = rng.unit();
            let fail = if u < 0.01 {
                Some((503, ErrorType::Http5xx))
            } else if u < 0.015 {
                Some((429, ErrorType::Http429))
            } else if u < 0.02 {
                Some((200, ErrorType::ClientDisconnect))
            } else {
                None
            };
            let fp = fp_next;
            fp_next += 1;
            match (on, anomaly) {
                (true, Anomaly::Forbidden) => {
                    rec.status = Some(403);
                    rec.error_type = Some(ErrorType::Http4xx);
                    rec.ttft_s = None;
                    rec.duration_s = Some(0.002);
                    recs.push((rec.t0_ns, finished(rec, fp)));
                }
                (true, Anomaly::RetryStorm) => {
                    // Times out after 1 s, retried 4 times at once.
                    rec.error_type = Some(ErrorType::ClientDisconnect);
                    rec.ttft_s = None;
                    rec.duration_s = Some(1.0);
                    for k in 0..5u64 {
                        let mut r = rec.clone();
                        r.t0_ns += k * 1_050_000_000;
                        recs.push((r.t0_ns, finished(r, fp)));
                    }
                }
                _ => {
                    if let Some((status, e)) = fail {
                        let mut r = rec.clone();
                        r.status = Some(status);
                        r.error_type = Some(e);
                        r.ttft_s = None;
                        r.duration_s = Some(0.01);
                        recs.push((r.t0_ns, finished(r, fp)));
                        rec.t0_ns += 500_000_000; // the retry
                    }
                    recs.push((rec.t0_ns, finished(rec, fp)));
                }
            }
        }
    }
    // Fed in the order requests end, with a tick every second.
    recs.sort_by_key(|(_, f)| f.t0_ns + (f.duration_s.unwrap_or(0.0) * 1e9) as u64);
    let mut tl = Timeline::new(cfg);
    let node = NodeState::default();
    let mut out = Vec::new();
    let mut next_tick = T0;
    for (_, f) in &recs {
        let end = f.t0_ns + (f.duration_s.unwrap_or(0.0) * 1e9) as u64;
        while next_tick <= end {
            tl.on_tick(next_tick, &node, 3, &mut out);
            next_tick += 1_000_000_000;
        }
        tl.on_record(f, &mut out);
    }
    tl.finish(&mut out);
    out
}

fn tenants() -> Vec<Tenant> {
    vec![
        Tenant {
            name: "search",
            rate: 8.0,
            input_median: 1500.0,
            output_median: 200.0,
        },
        Tenant {
            name: "chatbot",
            rate: 3.0,
            input_median: 600.0,
            output_median: 350.0,
        },
        Tenant {
            name: "batch-summaries",
            rate: 1.0,
            input_median: 6000.0,
            output_median: 500.0,
        },
        Tenant {
            name: "agent",
            rate: 0.5,
            input_median: 3000.0,
            output_median: 120.0,
        },
        Tenant {
            name: "tiny",
            rate: 0.05,
            input_median: 80.0,
            output_median: 30.0,
        },
    ]
}

fn anomalies(ev: &[Event]) -> Vec<&Event> {
    ev.iter()
        .filter(|e| e.kind != kind::CALLER_NEW && e.kind != kind::MODEL_VERSION_NEW)
        .collect()
}

fn named<'a>(ev: &'a [Event], tenant: &str) -> Vec<&'a Event> {
    ev.iter()
        .filter(|e| e.attr("tokentap.tenant").and_then(|v| v.as_str()) == Some(tenant))
        .collect()
}

#[test]
fn an_hour_of_steady_noisy_traffic_gives_no_anomaly_event() {
    for seed in [1, 2, 3] {
        let ev = simulate(
            Config::default(),
            &tenants(),
            3600.0,
            0,
            Anomaly::None,
            0.0,
            seed,
        );
        let bad = anomalies(&ev);
        assert!(
            bad.is_empty(),
            "seed {seed}: {} anomaly events, first: {:?}",
            bad.len(),
            bad.first()
        );
        let new: Vec<&str> = ev
            .iter()
            .filter(|e| e.kind == kind::CALLER_NEW)
            .filter_map(|e| e.attr("tokentap.tenant").and_then(|v| v.as_str()))
            .collect();
        assert_eq!(new.len(), 5, "one caller.new per tenant: {new:?}");
    }
}

#[test]
fn a_surge_names_its_tenant_with_the_ttft_rise_and_nobody_else() {
    let ev = simulate(
        Config::default(),
        &tenants(),
        1800.0,
        1,
        Anomaly::Surge(5.0),
        1200.0,
        7,
    );
    let bad = anomalies(&ev);
    assert_eq!(bad.len(), 2, "{bad:#?}");
    let e = bad[0];
    assert_eq!(e.kind, kind::CALLER_SURGE);
    // The served model's TTFT shifted: one latency.shift, its cause the
    // surge, naming the tenant.
    let l = bad[1];
    assert_eq!(l.kind, kind::LATENCY_SHIFT, "{l:#?}");
    assert_eq!(l.attr("metric").unwrap(), "ttft");
    assert_eq!(l.attr("cause").unwrap(), "traffic", "{l:#?}");
    assert_eq!(l.attr("cause_event").unwrap(), kind::CALLER_SURGE);
    assert_eq!(l.attr("tokentap.tenant").unwrap(), "chatbot", "{l:#?}");
    assert_eq!(l.attr("direction").unwrap(), "up");
    let (b, a) = (
        &l.attr("before").unwrap()["p95"],
        &l.attr("after").unwrap()["p95"],
    );
    assert!(a.as_f64().unwrap() > 2.0 * b.as_f64().unwrap(), "{l:#?}");
    assert_eq!(e.attr("tokentap.tenant").unwrap(), "chatbot");
    let p95 = e.attr("ttft_p95_s").unwrap().as_f64().unwrap();
    let base = e.attr("baseline_ttft_p95_s").unwrap().as_f64().unwrap();
    assert!(p95 > 2.0 * base, "TTFT rise in the window: {e:?}");
    let rate = e.attr("rate_rps").unwrap().as_f64().unwrap();
    let base_rate = e.attr("baseline_rps").unwrap().as_f64().unwrap();
    assert!(rate > 3.0 * base_rate, "{e:?}");
    assert!(e.ts_ns >= T0 + 1_200_000_000_000, "not before it began");
}

#[test]
fn a_permission_change_is_an_error_burst_of_its_kind() {
    let ev = simulate(
        Config::default(),
        &tenants(),
        900.0,
        2,
        Anomaly::Forbidden,
        600.0,
        11,
    );
    let bad = anomalies(&ev);
    assert_eq!(bad.len(), 2, "{bad:#?}");
    assert_eq!(bad[0].kind, kind::CALLER_ERROR_BURST);
    assert_eq!(bad[0].attr("tokentap.tenant").unwrap(), "batch-summaries");
    assert_eq!(bad[0].attr("error.type").unwrap(), "http_401_403");
    // The served model's auth errors shifted, in that tenant's requests
    // only.
    let e = bad[1];
    assert_eq!(e.kind, kind::ERRORS_SHIFT, "{e:#?}");
    assert_eq!(e.attr("error.class").unwrap(), "auth");
    assert_eq!(
        e.attr("tokentap.tenant").unwrap(),
        "batch-summaries",
        "{e:#?}"
    );
    assert_eq!(
        e.attr("moved").unwrap(),
        &serde_json::json!(["batch-summaries"])
    );
}

#[test]
fn timeouts_then_retries_are_a_storm_and_growing_prompts_a_drift_of_their_own_tenants() {
    let ev = simulate(
        Config::default(),
        &tenants(),
        1500.0,
        0,
        Anomaly::RetryStorm,
        1200.0,
        5,
    );
    let storm: Vec<_> = named(&ev, "search")
        .into_iter()
        .filter(|e| e.kind == kind::CALLER_RETRY_STORM)
        .collect();
    assert_eq!(storm.len(), 1, "{ev:#?}");
    assert!(
        storm[0]
            .attr("repeated_requests")
            .unwrap()
            .as_u64()
            .unwrap()
            >= 10
    );
    for t in ["chatbot", "batch-summaries", "agent", "tiny"] {
        let n: Vec<_> = named(&ev, t)
            .into_iter()
            .filter(|e| e.kind != kind::CALLER_NEW)
            .collect();
        assert!(n.is_empty(), "{t}: {n:#?}");
    }

    // Prompts growing 10 % a minute: drift on input tokens, up; outputs
    // unchanged.
    let ev = simulate(
        Config::default(),
        &tenants(),
        2400.0,
        1,
        Anomaly::PromptGrowth(1.1),
        1200.0,
        9,
    );
    let bad = anomalies(&ev);
    assert!(!bad.is_empty());
    for e in &bad {
        assert_eq!(e.kind, kind::TOKENS_DRIFT, "{e:?}");
        assert_eq!(e.attr("tokentap.tenant").unwrap(), "chatbot");
        assert_eq!(e.attr("gen_ai.token.type").unwrap(), "input");
        assert_eq!(e.attr("direction").unwrap(), "up");
        assert!(e.ts_ns > T0 + 1_200_000_000_000);
    }
}

#[test]
fn events_serialise_as_one_line_with_ts_kind_message_attributes() {
    let e = Event::new(T0, kind::CALLER_NEW, "tenant a: first request".into())
        .with("tokentap.tenant", "a")
        .with("tokentap.request.type", None::<&str>);
    let v: serde_json::Value = serde_json::to_value(&e).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"ts": "2027-01-15T08:00:00.000000Z", "kind": "caller.new",
            "message": "tenant a: first request", "attributes": {"tokentap.tenant": "a"}})
    );
}

/// A chat request of `tenant` ending at `t_ns`.
fn request_of(tenant: &str, t_ns: u64) -> Finished {
    finished(
        RequestRecord {
            tenant: Some(tenant.to_string()),
            operation: Some(crate::vocab::Operation::Chat),
            method: "POST".into(),
            path: "/v1/chat/completions".into(),
            status: Some(200),
            provider: Some("vllm".into()),
            request_model: Some("m".into()),
            t0_ns: t_ns,
            duration_s: Some(0.1),
            ttft_s: Some(0.05),
            input_tokens: Some(10),
            output_tokens: Some(10),
            ..Default::default()
        },
        t_ns,
    )
}

#[test]
fn thousands_of_end_users_make_named_callers_events_and_one_summary_per_window() {
    let cfg = Config {
        named_callers: 3,
        ..Config::default()
    };
    let mut t = Timeline::new(cfg);
    let mut ev = vec![];
    // 5,000 distinct users over 3 minutes; user 7 sends five times per
    // window, the others once.
    for i in 0..5000u64 {
        let ts = T0 + i * 36_000_000; // 180 s in all
        let user = format!("user-{i}");
        t.on_record(&request_of(&user, ts), &mut ev);
        if i % 1000 == 7 {
            for k in 0..4 {
                t.on_record(&request_of("user-7", ts + k), &mut ev);
            }
        }
    }
    t.finish(&mut ev);
    let new: Vec<&Event> = ev.iter().filter(|e| e.kind == kind::CALLER_NEW).collect();
    let (summaries, one_by_one): (Vec<&Event>, Vec<&Event>) =
        new.iter().partition(|e| e.attr("summary").is_some());
    assert_eq!(one_by_one.len(), 3, "the named ones: {one_by_one:?}");
    // 180 s of requests; the last ones end just into a fourth window.
    assert_eq!(summaries.len(), 4, "one per window: {summaries:?}");
    let counted: u64 = summaries
        .iter()
        .map(|e| e.attr("new_callers").unwrap().as_u64().unwrap())
        .sum();
    assert_eq!(counted, 4997, "every unnamed user counted once");
    assert!(
        summaries[0].message.contains("tenant user-"),
        "{}",
        summaries[0].message
    );
    assert!(ev.len() < 20, "{} events", ev.len());
}

#[test]
fn over_the_ceiling_events_are_folded_and_said_once_per_minute() {
    let cfg = Config {
        named_callers: 10_000,
        max_events_per_minute: 10,
        ..Config::default()
    };
    let mut t = Timeline::new(cfg);
    let mut ev = vec![];
    // 100 new tenants in the first minute, 5 in the second.
    for i in 0..100u64 {
        t.on_record(&request_of(&format!("t{i}"), T0 + i * 500_000_000), &mut ev);
    }
    for i in 0..5u64 {
        t.on_record(
            &request_of(&format!("u{i}"), T0 + 61_000_000_000 + i),
            &mut ev,
        );
    }
    t.finish(&mut ev);
    let folded: Vec<&Event> = ev
        .iter()
        .filter(|e| e.kind == kind::EVENTS_FOLDED)
        .collect();
    assert_eq!(t.folded(), 90, "{ev:?}");
    assert!(!folded.is_empty());
    let total: u64 = folded
        .iter()
        .map(|e| e.attr("folded").unwrap().as_u64().unwrap())
        .sum();
    assert_eq!(total, t.folded());
    let new = ev.iter().filter(|e| e.kind == kind::CALLER_NEW).count();
    assert_eq!(
        new,
        10 + 5,
        "ten in the first minute, all five in the second"
    );
}
