//! Embeds the eBPF object that `cargo xtask build` compiled (or the one
//! named by `TOKENTAP_EBPF_OBJ`). Without one the agent still builds (so
//! `cargo check`, clippy and pure unit tests need no nightly toolchain), and
//! says at run time how to get a capture-capable binary.
use std::{env, fs, path::PathBuf};

fn main() {
    println!("cargo::rustc-check-cfg=cfg(tokentap_has_ebpf)");
    println!("cargo:rerun-if-env-changed=TOKENTAP_EBPF_OBJ");
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let default = manifest.join("../target/bpf/bpfel-unknown-none/release/agent-ebpf");
    let src = env::var_os("TOKENTAP_EBPF_OBJ")
        .map(PathBuf::from)
        .unwrap_or(default);
    println!("cargo:rerun-if-changed={}", src.display());
    let out =
        PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("tokentap-ebpf.o");
    match fs::read(&src) {
        Ok(bytes) if !bytes.is_empty() => {
            fs::write(&out, bytes).expect("write embedded eBPF object");
            println!("cargo:rustc-cfg=tokentap_has_ebpf");
        }
        _ => fs::write(&out, b"").expect("write empty eBPF placeholder"),
    }
}
