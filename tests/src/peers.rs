//! The real third-party peers installed by `tests/peers/install.sh`
//! (through `cargo xtask peers`): llama.cpp's two servers, the `openai` SDK
//! client and the Rotel collector. Every process started here is
//! killed when its handle drops and, should the test process die first,
//! by the kernel (`PR_SET_PDEATHSIG`), so no engine outlives a run.

use std::{
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
};

use serde_json::Value;

pub use crate::free_port;
use crate::{read_jsonl, start, Running};

/// The two llama.cpp HTTP stacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// llama-cpp-python's OpenAI-compatible server (uvicorn, FastAPI,
    /// sse-starlette) over the llama.cpp libraries.
    Python,
    /// llama.cpp's own C++ `llama-server` (cpp-httplib).
    Native,
}

impl Engine {
    pub fn name(self) -> &'static str {
        match self {
            Engine::Python => "llama-cpp-python",
            Engine::Native => "llama-server",
        }
    }
}

/// The installed peers (`tests/peers/`).
pub struct Peers {
    pub dir: PathBuf,
}

impl Peers {
    /// The installed peers; panics, naming the install command, when they
    /// are not installed (the tests that need them are `#[ignore]`d, so
    /// they only run when asked for, and then must not pass unrun).
    pub fn installed(what: &str) -> Peers {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers");
        assert!(
            dir.join(".installed").exists(),
            "{what}: the real peers are not installed in {}: run `cargo xtask peers` \
             (`cargo xtask test` does it as root when the fidelity tests are selected)",
            dir.display()
        );
        Peers { dir }
    }

    pub fn venv_bin(&self, name: &str) -> PathBuf {
        self.dir.join(".venv/bin").join(name)
    }

    pub fn model(&self) -> PathBuf {
        self.dir.join(".model/tiny-llama.gguf")
    }

    /// The llama-cpp-python sdist `install.sh` unpacked (llama.cpp's
    /// source tree is under `vendor/llama.cpp`): the one in `.build/`.
    pub fn sdist(&self) -> PathBuf {
        let build = self.dir.join(".build");
        std::fs::read_dir(&build)
            .ok()
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.is_dir()
                    && p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("llama_cpp_python-"))
            })
            .unwrap_or_else(|| panic!("no llama_cpp_python-* sdist in {}", build.display()))
    }

    pub fn lib_dir(&self) -> PathBuf {
        self.dir.join(".build/llama.cpp/bin")
    }

    /// Starts `kind` on 127.0.0.1:`port` with one inference thread (two
    /// threads on two cores make token gaps erratic) and returns once it
    /// accepts requests. `slots` parallel sequences (llama-server only).
    pub fn start_engine(
        &self,
        kind: Engine,
        port: u16,
        slots: u32,
    ) -> (Running, mpsc::Receiver<String>) {
        let model = self.model();
        let mut cmd;
        let ready;
        match kind {
            Engine::Python => {
                cmd = Command::new(self.venv_bin("python"));
                cmd.args(["-m", "llama_cpp.server", "--model"])
                    .arg(&model)
                    .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                    .args(["--n_threads", "1", "--n_threads_batch", "1"])
                    .args(["--n_ctx", "2048", "--verbose", "False"])
                    .env("LLAMA_CPP_LIB_PATH", self.lib_dir());
                ready = "Uvicorn running on";
            }
            Engine::Native => {
                cmd = Command::new(self.lib_dir().join("llama-server"));
                cmd.arg("-m")
                    .arg(&model)
                    .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                    .args(["-t", "1", "-tb", "1", "-c", &(2048 * slots).to_string()])
                    .args(["-np", &slots.to_string(), "--metrics"]);
                ready = "listening on http";
            }
        }
        cmd.env("PYTHONUNBUFFERED", "1");
        start(die_with_parent(&mut cmd), ready, kind.name())
    }

    /// Starts Rotel as an OTLP/gRPC (and HTTP) receiver that logs every
    /// metric it receives in detail and exports nowhere.
    pub fn start_rotel(&self, grpc_port: u16, http_port: u16) -> (Running, mpsc::Receiver<String>) {
        let bin = self
            .dir
            .join(".venv/lib/python3.11/site-packages/rotel/rotel-agent");
        let bin = if bin.exists() {
            bin
        } else {
            self.venv_bin("rotel")
        };
        let mut cmd = Command::new(bin);
        cmd.args(["start", "--exporter", "blackhole"])
            .args([
                "--debug-log",
                "metrics",
                "--debug-log-verbosity",
                "detailed",
            ])
            .arg("--otlp-grpc-endpoint")
            .arg(format!("127.0.0.1:{grpc_port}"))
            .arg("--otlp-http-endpoint")
            .arg(format!("127.0.0.1:{http_port}"));
        start(die_with_parent(&mut cmd), "Starting Rotel", "rotel")
    }

    /// Runs `client.py --self-test`: its read-timestamp rule, checked on a
    /// loopback socket (the client's TTFT is the ground truth the fidelity
    /// tests compare with, so its own clock is checked first).
    pub fn client_self_test(&self) {
        let out = die_with_parent(
            Command::new(self.venv_bin("python"))
                .arg(self.dir.join("client.py"))
                .arg("--self-test")
                .stdin(Stdio::null()),
        )
        .output()
        .expect("run client.py --self-test");
        assert!(
            out.status.success(),
            "client.py --self-test failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Runs the `openai` SDK client (`client.py`) against `base_url` and
    /// returns what it measured, one object per request.
    pub fn client(&self, base_url: &str, extra: &[&str], out: &Path) -> Vec<Value> {
        let st = die_with_parent(
            Command::new(self.venv_bin("python"))
                .arg(self.dir.join("client.py"))
                .args(["--base-url", base_url, "--out"])
                .arg(out)
                .args(extra)
                .stdin(Stdio::null()),
        )
        .status()
        .expect("run client.py");
        assert!(st.success(), "client.py failed: {st}");
        read_jsonl(out)
    }
}

/// The child gets SIGKILL when the thread that started it ends (a
/// panicking test included), so peers never outlive the run.
pub fn die_with_parent(cmd: &mut Command) -> &mut Command {
    // SAFETY: prctl is async-signal-safe; nothing else runs before exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// Runs the child at nice 19: for the agent, whose timestamps are the
/// kernel's, so it never needs to run ahead of the engine or the client.
pub fn lowest_priority(cmd: &mut Command) -> &mut Command {
    // SAFETY: setpriority is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::setpriority(libc::PRIO_PROCESS, 0, 19);
            Ok(())
        })
    }
}

/// The `p`-quantile (0..=1) of `v` by nearest rank; NaN when empty.
pub fn quantile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

/// One client request matched with its request-log record.
pub struct Pair<'a> {
    pub client: &'a Value,
    pub record: &'a Value,
}

/// Client measurements joined to tokentap's request log by the unique
/// `model` tag each client request carries.
pub struct Comparison<'a> {
    pub pairs: Vec<Pair<'a>>,
    /// Client tags with no record.
    pub missing: Vec<String>,
    /// Tags with more than one record.
    pub duplicated: Vec<String>,
    /// tokentap − client, seconds, streamed requests that completed and
    /// whose first event the client stamped with its own arrival.
    pub ttft_diff: Vec<f64>,
    /// Completed streams whose first event's receive stamp is a later
    /// segment's, or could not be vouched for (`first_rx_own: false`: the
    /// client had fallen behind and the kernel merged the two): no ground
    /// truth for TTFT or TPOT. Tag and tokentap − client TTFT (seconds;
    /// the client's figure is then an upper bound, so this is a lower
    /// bound of the true difference).
    pub client_behind: Vec<(String, f64)>,
    pub tpot_diff: Vec<f64>,
    /// tokentap TTFT − TTFT as the SDK hands the first chunk over (after
    /// its parsing): what an application timing around the SDK adds.
    pub ttft_sdk_diff: Vec<f64>,
    /// Client send → tokentap's t0 (the request waiting, unread, in the
    /// engine's socket), seconds; both clocks CLOCK_REALTIME.
    pub before_read: Vec<f64>,
    /// tokentap's t1 → the client's kernel receive time of the first
    /// content event, seconds (tokentap's own accuracy on the response
    /// side, plus loopback delivery).
    pub to_client: Vec<f64>,
}

impl<'a> Comparison<'a> {
    pub fn new(client: &'a [Value], records: &'a [Value]) -> Self {
        let mut by_tag: std::collections::HashMap<&str, Vec<&Value>> = Default::default();
        for r in records {
            if let Some(m) = r["request_model"].as_str() {
                by_tag.entry(m).or_default().push(r);
            }
        }
        let mut c = Comparison {
            pairs: vec![],
            missing: vec![],
            duplicated: vec![],
            ttft_diff: vec![],
            client_behind: vec![],
            tpot_diff: vec![],
            ttft_sdk_diff: vec![],
            before_read: vec![],
            to_client: vec![],
        };
        for q in client {
            let tag = q["tag"].as_str().expect("client record has a tag");
            match by_tag.get(tag).map(Vec::as_slice) {
                None | Some([]) => c.missing.push(tag.to_string()),
                Some([r]) => {
                    if !q["cancelled"].as_bool().unwrap_or(false) {
                        if let Some(a) = r["ttft_s"].as_f64() {
                            let own = q["first_rx_own"] != false;
                            if let (Some(b), false) = (q["ttft_s"].as_f64(), own) {
                                c.client_behind.push((tag.to_string(), a - b));
                            }
                            if let (Some(b), true) = (q["ttft_s"].as_f64(), own) {
                                c.ttft_diff.push(a - b);
                            }
                            if let Some(b) = q["ttft_sdk_s"].as_f64() {
                                c.ttft_sdk_diff.push(a - b);
                            }
                            if let (Some(send), Some(t0)) =
                                (q["send_ns"].as_i64(), r["t0_ns"].as_i64())
                            {
                                c.before_read.push((t0 - send) as f64 / 1e9);
                                if let (Some(rx), true) = (q["first_rx_ns"].as_i64(), own) {
                                    let t1 = t0 + (a * 1e9) as i64;
                                    c.to_client.push((rx - t1) as f64 / 1e9);
                                }
                            }
                        }
                    }
                    if let (Some(a), Some(b), true) = (
                        r["tpot_s"].as_f64(),
                        q["tpot_s"].as_f64(),
                        q["first_rx_own"] != false,
                    ) {
                        c.tpot_diff.push(a - b);
                    }
                    c.pairs.push(Pair {
                        client: q,
                        record: r,
                    });
                }
                Some(_) => c.duplicated.push(tag.to_string()),
            }
        }
        c
    }

    /// p50 and p99 of |difference|, in milliseconds.
    pub fn abs_ms(v: &[f64]) -> (f64, f64) {
        let a: Vec<f64> = v.iter().map(|d| d.abs() * 1e3).collect();
        (quantile(&a, 0.5), quantile(&a, 0.99))
    }
}
