//! The GGUF tokenizer (`tokenize::gguf`) against llama.cpp's own test
//! vectors: every `models/ggml-vocab-*.gguf` of the llama.cpp tree in the
//! llama-cpp-python sdist that has `.gguf.inp`/`.gguf.out` beside it, run
//! as `tests/test-tokenizer-0.cpp` runs them (inputs split on
//! `\n__ggml_vocab_test__\n`, one line of ids per input,
//! `add_special = false`, `parse_special = false`).
//!
//! What must hold: every vector of every vocabulary exact, except the
//! vocabularies listed in [`UNSUPPORTED`], which `from_gguf` must refuse
//! with an error (never encode wrongly). And the header reader refuses
//! every truncation of a real header without panicking.

use tokentap::tokenize::gguf::{GgufVocab, Header};

/// Vocabularies whose tokenizer type is not implemented, and why.
const UNSUPPORTED: &[(&str, &str)] = &[(
    "ggml-vocab-bert-bge.gguf",
    "WPM (bert): needs llama.cpp's NFD-first-code-point and lowercase tables",
)];

/// `read_tests` of test-tokenizer-0.cpp.
fn read_tests(inp: &str, out: &str) -> Vec<(String, Vec<u32>)> {
    let sep = "\n__ggml_vocab_test__\n";
    let mut ins = Vec::new();
    let mut pos = 0;
    while pos < inp.len() {
        match inp[pos..].find(sep) {
            Some(n) => {
                ins.push(inp[pos..pos + n].to_string());
                pos += n + sep.len();
            }
            None => {
                ins.push(inp[pos..].to_string());
                break;
            }
        }
    }
    let outs: Vec<&str> = out.lines().collect();
    assert_eq!(ins.len(), outs.len(), "inputs and outputs differ in number");
    ins.into_iter()
        .zip(outs)
        .map(|(i, o)| {
            let ids = o
                .split_whitespace()
                .map(|t| t.parse().expect("a token id"))
                .collect();
            (i, ids)
        })
        .collect()
}

fn models_dir() -> std::path::PathBuf {
    tokentap_tests::peers::Peers::installed("gguf vocab")
        .sdist()
        .join("vendor/llama.cpp/models")
}

#[test]
#[ignore = "needs the real peers (cargo xtask test installs them as root and runs it)"]
fn gguf_vocab_matches_llama_cpp_test_vectors() {
    let dir = models_dir();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("ggml-vocab-") && n.ends_with(".gguf"))
        .filter(|n| dir.join(format!("{n}.inp")).exists() && dir.join(format!("{n}.out")).exists())
        .collect();
    files.sort();
    assert!(
        files.len() >= 10,
        "llama.cpp ships more vocab tests: {files:?}"
    );

    let mut failures = Vec::new();
    let mut exact_files = 0;
    println!(
        "{:<34} {:<8} {:<16} {:>7} {:>6}",
        "vocab file", "model", "pre", "vectors", "exact"
    );
    for f in &files {
        let bytes = std::fs::read(dir.join(f)).unwrap();
        let inp = std::fs::read_to_string(dir.join(format!("{f}.inp"))).unwrap();
        let out = std::fs::read_to_string(dir.join(format!("{f}.out"))).unwrap();
        let tests = read_tests(&inp, &out);
        let unsupported = UNSUPPORTED.iter().find(|(n, _)| n == f);
        let v = match GgufVocab::from_gguf(&bytes) {
            Ok(v) => v,
            Err(e) => {
                println!("{f:<34} refused: {e}");
                match unsupported {
                    Some(_) => {}
                    None => failures.push(format!("{f}: refused: {e}")),
                }
                continue;
            }
        };
        if let Some((_, why)) = unsupported {
            failures.push(format!("{f}: listed unsupported ({why}) but loaded"));
        }
        let mut exact = 0;
        for (text, want) in &tests {
            match v.encode(text, false, false) {
                Ok(got) if &got == want => exact += 1,
                Ok(got) => failures.push(format!("{f}: {text:?}\n  want {want:?}\n  got  {got:?}")),
                Err(e) => failures.push(format!("{f}: {text:?}: error {e}")),
            }
        }
        if exact == tests.len() {
            exact_files += 1;
        }
        println!(
            "{f:<34} {:<8} {:<16} {:>7} {:>6}",
            v.model(),
            v.pre(),
            tests.len(),
            exact
        );
    }
    println!(
        "{exact_files} of {} vocabularies exact; refused as unsupported: {:?}",
        files.len(),
        UNSUPPORTED
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// `add_special` and `parse_special`, which the vectors leave off.
#[test]
#[ignore = "needs the real peers (cargo xtask test installs them as root and runs it)"]
fn gguf_vocab_special_tokens() {
    let dir = models_dir();
    let load = |f: &str| GgufVocab::from_gguf(&std::fs::read(dir.join(f)).unwrap()).unwrap();
    // Llama 3: BOS added, `<|begin_of_text|>` parsed only when asked.
    let v = load("ggml-vocab-llama-bpe.gguf");
    assert_eq!(v.encode("Hello", true, false).unwrap(), vec![128000, 9906]);
    assert_eq!(
        v.encode("<|begin_of_text|>Hello", false, true).unwrap(),
        vec![128000, 9906]
    );
    let plain = v.encode("<|begin_of_text|>Hello", false, false).unwrap();
    assert!(plain.len() > 2 && !plain.contains(&128000), "{plain:?}");
    // SPM: BOS, and the space prefix again after a special token.
    let v = load("ggml-vocab-llama-spm.gguf");
    let hello = v.encode("Hello", false, false).unwrap();
    assert_eq!(v.encode("Hello", true, false).unwrap()[1..], hello[..]);
    assert_eq!(v.encode("Hello", true, false).unwrap()[0], 1);
    let two = v.encode("Hello</s>Hello", false, true).unwrap();
    assert_eq!(two, [&hello[..], &[2], &hello[..]].concat());
    // GPT-2 adds no BOS.
    let v = load("ggml-vocab-gpt-2.gguf");
    assert_eq!(
        v.encode("Hello", true, false).unwrap(),
        v.encode("Hello", false, false).unwrap()
    );
    assert!(v.pre() == "gpt-2" && v.chat_template().is_none());
    let v = load("ggml-vocab-command-r.gguf");
    assert!(v.chat_template().is_some_and(|t| t.contains("bos_token")));
}

#[test]
#[ignore = "needs the real peers (cargo xtask test installs them as root and runs it)"]
fn gguf_header_truncations_are_refused_without_panic() {
    let dir = models_dir();
    let bytes = std::fs::read(dir.join("ggml-vocab-llama-spm.gguf")).unwrap();
    let whole = Header::parse(&bytes).expect("the whole file parses");
    assert!(whole.get("tokenizer.ggml.tokens").is_some());
    // The metadata's end: the shortest prefix that parses.
    let end = {
        let (mut lo, mut hi) = (0, bytes.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if Header::parse(&bytes[..mid]).is_ok() {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    };
    assert!(end > 1000 && end <= bytes.len());
    // Every cut before it is refused: the first 4 kB byte by byte, then
    // strided (about 200 cuts).
    let stride = (end / 200).max(1);
    for cut in (0..end.min(4096)).chain((4096..end).step_by(stride)) {
        assert!(Header::parse(&bytes[..cut]).is_err(), "prefix {cut} parsed");
    }
    // Corrupted bytes: refused or parsed, never a panic — every byte of
    // the first 1 kB (the magic, counts, the first keys), then strided.
    let stride = (end / 50).max(1);
    for at in (0..1024.min(end)).chain((1024..end).step_by(stride)) {
        let mut b = bytes[..end].to_vec();
        b[at] ^= 0xFF;
        if Header::parse(&b).is_ok() && (at < 64 || at % 8 == 0) {
            let _ = GgufVocab::from_gguf(&b);
        }
    }
}

/// How the agent loads a llama-server's tokenizer from its model file
/// (`identity::tokenizer::Loader::load_gguf`, through the engine's root):
/// only as much of the file as its metadata needs — a small vocabulary
/// from the first 4 MiB, gemma-4's 15.8 MB one after reading further —
/// and one file read once for every engine serving it.
#[test]
#[ignore = "needs the real peers (cargo xtask test installs them as root and runs it)"]
fn the_agent_loads_a_gguf_tokenizer_through_the_engines_root() {
    use tokentap::host::rootfs::Root;
    use tokentap::identity::tokenizer::{Loader, State, Wanted};
    let dir = models_dir();
    let root = Root::at(&dir).unwrap();
    let mut loader = Loader::default();
    for name in ["llama-spm", "gemma-4"] {
        let file = std::path::PathBuf::from(format!("/ggml-vocab-{name}.gguf"));
        let f = loader.load_gguf(&root, &file, &Wanted::default(), None);
        assert_eq!(f.state, State::Loaded, "{name}: {}", f.detail);
        let t = f.tokenizer.unwrap();
        let direct = GgufVocab::from_gguf(
            &std::fs::read(dir.join(file.strip_prefix("/").unwrap())).unwrap(),
        )
        .unwrap()
        .encode("Hello world, héllo wörld!", true, true)
        .unwrap();
        assert_eq!(
            t.encode_ids("Hello world, héllo wörld!", true).unwrap(),
            direct,
            "{name}"
        );
        // A second engine on the same file shares it.
        let again = loader.load_gguf(&root, &file, &Wanted::default(), None);
        assert!(std::sync::Arc::ptr_eq(
            &t,
            again.tokenizer.as_ref().unwrap()
        ));
        assert!(again.detail.ends_with("(shared)"), "{}", again.detail);
    }
    // Not a GGUF file: said, never a panic.
    let f = loader.load_gguf(
        &root,
        std::path::Path::new("/ggml-vocab-llama-spm.gguf.inp"),
        &Wanted::default(),
        None,
    );
    assert_eq!(f.state, State::Invalid, "{}", f.detail);
    // A built-in template's name is not rendered here.
    let w = Wanted {
        chat_template: Some("inline:llama3".into()),
        ..Wanted::default()
    };
    let f = loader.load_gguf(
        &root,
        std::path::Path::new("/ggml-vocab-llama-spm.gguf"),
        &w,
        None,
    );
    assert_eq!(f.state, State::Unsupported, "{}", f.detail);
}
