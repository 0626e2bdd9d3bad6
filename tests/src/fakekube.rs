//! A fake Kubernetes API server, as much of it as a pod watcher uses:
//! `GET /api/v1/pods` lists (with `fieldSelector` `spec.nodeName=…` or
//! `status.podIP=…`) and watches (`watch=true`: chunked JSON lines of
//! `ADDED` / `MODIFIED` / `DELETED` events, held open). Plain HTTP; the
//! test writes a kubeconfig pointing at it. Every request's path and query
//! is kept, so a test can check what the agent asked for.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    net::{TcpListener, TcpStream},
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc, Mutex,
    },
    thread,
    time::Duration,
};

use serde_json::{json, Value};

#[derive(Default)]
struct State {
    /// uid → pod object.
    pods: BTreeMap<String, Value>,
    rv: u64,
    /// Open watches: the node they select (None: all) and their channel.
    watchers: Vec<(Option<String>, mpsc::Sender<String>)>,
    requests: Vec<String>,
}

pub struct FakeKube {
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    pub port: u16,
}

/// A pod object with what the agent reads.
pub fn pod(uid: &str, ns: &str, name: &str, node: &str, ip: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"uid": uid, "namespace": ns, "name": name, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "main"}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}
    })
}

/// Writes a kubeconfig for a server at `http://127.0.0.1:port`.
pub fn write_kubeconfig(path: &Path, port: u16) {
    std::fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:{port}\nusers:\n- name: u\n  user:\n    token: test-token\ncontexts:\n- name: c\n  context:\n    cluster: fake\n    user: u\n    namespace: default\ncurrent-context: c\n"
        ),
    )
    .unwrap();
}

fn decode(q: &str) -> String {
    let b = q.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let h = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(h, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn node_of(p: &Value) -> Option<&str> {
    p["spec"]["nodeName"].as_str()
}

impl FakeKube {
    /// Serves on 127.0.0.1:`port` (0: any).
    pub fn start(port: u16) -> FakeKube {
        let l = TcpListener::bind(("127.0.0.1", port)).expect("fake API server port");
        let port = l.local_addr().unwrap().port();
        l.set_nonblocking(true).unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (state.clone(), stop.clone());
        thread::spawn(move || {
            while !sp.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((s, _)) => {
                        let (st, sp) = (st.clone(), sp.clone());
                        thread::spawn(move || {
                            let _ = serve(s, &st, &sp);
                        });
                    }
                    Err(_) => thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        FakeKube { state, stop, port }
    }

    /// Adds a pod, or replaces the one with its uid (`ADDED` / `MODIFIED`).
    pub fn put(&self, mut p: Value) {
        let mut st = self.state.lock().unwrap();
        st.rv += 1;
        p["metadata"]["resourceVersion"] = json!(st.rv.to_string());
        let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
        let kind = if st.pods.contains_key(&uid) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        st.pods.insert(uid, p.clone());
        notify(&mut st, kind, &p);
    }

    pub fn delete(&self, uid: &str) {
        let mut st = self.state.lock().unwrap();
        st.rv += 1;
        if let Some(mut p) = st.pods.remove(uid) {
            p["metadata"]["resourceVersion"] = json!(st.rv.to_string());
            notify(&mut st, "DELETED", &p);
        }
    }

    /// Paths (with decoded queries) of every request so far.
    pub fn requests(&self) -> Vec<String> {
        self.state.lock().unwrap().requests.clone()
    }
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn notify(st: &mut State, kind: &str, p: &Value) {
    let line = json!({"type": kind, "object": p}).to_string();
    st.watchers.retain(|(node, tx)| {
        if node.as_deref().is_some_and(|n| Some(n) != node_of(p)) {
            return true;
        }
        tx.send(line.clone()).is_ok()
    });
}

fn serve(s: TcpStream, st: &Mutex<State>, stop: &AtomicBool) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    let mut r = BufReader::new(s.try_clone()?);
    let mut w = s;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let target = line.split(' ').nth(1).unwrap_or("").to_string();
        loop {
            let mut h = String::new();
            if r.read_line(&mut h)? == 0 || h == "\r\n" {
                break;
            }
        }
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        let params: BTreeMap<String, String> = query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), decode(v)))
            .collect();
        st.lock()
            .unwrap()
            .requests
            .push(format!("{path}?{}", decode(query)));
        if path != "/api/v1/pods" {
            let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":404}"#;
            write!(
                w,
                "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )?;
            continue;
        }
        let selector = params.get("fieldSelector").cloned().unwrap_or_default();
        let node = selector.strip_prefix("spec.nodeName=").map(str::to_string);
        let ip = selector.strip_prefix("status.podIP=").map(str::to_string);
        if params.get("watch").is_some_and(|v| v == "true" || v == "1") {
            let (tx, rx) = mpsc::channel();
            st.lock().unwrap().watchers.push((node, tx));
            write!(
                w,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            )?;
            w.flush()?;
            while !stop.load(Ordering::Relaxed) {
                match rx.recv_timeout(Duration::from_millis(200)) {
                    Ok(ev) => {
                        let ev = ev + "\n";
                        write!(w, "{:x}\r\n{ev}\r\n", ev.len())?;
                        w.flush()?;
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(_) => break,
                }
            }
            return Ok(());
        }
        let body = {
            let st = st.lock().unwrap();
            let items: Vec<&Value> = st
                .pods
                .values()
                .filter(|p| node.as_deref().is_none_or(|n| node_of(p) == Some(n)))
                .filter(|p| {
                    ip.as_deref()
                        .is_none_or(|i| p["status"]["podIP"].as_str() == Some(i))
                })
                .collect();
            json!({"apiVersion": "v1", "kind": "PodList",
                   "metadata": {"resourceVersion": st.rv.to_string()}, "items": items})
            .to_string()
        };
        write!(
            w,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
        w.flush()?;
    }
}
