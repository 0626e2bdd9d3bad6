//! Exact token counts from the engine's own tokenizer, for requests whose
//! response carries no counts (docs/metrics.md, "Tokens").
//!
//! A [`Tokenizer`] is what one engine loaded — today a Hugging Face
//! `tokenizer.json` (through the `tokenizers` crate, pure-Rust regex) with
//! its `tokenizer_config.json` (special tokens, chat templates) — and
//! counts as that engine does: a chat request is rendered through the
//! model's chat template ([`template`]) and encoded with the engine's
//! special-token rule; a completion's prompt and an embedding's input are
//! encoded as they are; the output is the generated text encoded again,
//! plus the end-of-sequence token an engine counts when it stopped on one.
//! [`worker`] runs it off the pipeline's thread, within a CPU budget.
//!
//! Owns: loading a tokenizer from bytes, and the per-engine counting
//! rules. Must not: read files (`identity::tokenizer` finds and reads
//! them), run on the pipeline's thread, or keep any text it was given.

pub mod gguf;
pub mod template;
pub mod worker;

use std::collections::BTreeMap;

use self::template::{ChatTemplate, Json};
use crate::engines::Engine;
use crate::vocab::Operation;

/// What a Hugging Face model directory (or snapshot) holds for its
/// tokenizer, as read from the engine's files.
#[derive(Clone, Debug, Default)]
pub struct HfFiles {
    /// `tokenizer.json`.
    pub tokenizer_json: Vec<u8>,
    /// `tokenizer_config.json`, when present.
    pub config: Option<Vec<u8>>,
    /// `chat_template.jinja`, or the engine's `--chat-template` file,
    /// which wins over the config's.
    pub template: Option<String>,
}

/// Why a request was not counted with the tokenizer (it falls back to
/// the estimate); `tokentap.tokens.tokenize_failed`'s `reason`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Failure {
    /// The request body is not what the operation reads (no `messages`,
    /// no `prompt`), or was not kept whole.
    Body,
    /// A chat request for a model without a chat template.
    NoTemplate,
    /// The chat template failed (`raise_exception`, an error, out of fuel).
    Template,
    /// The tokenizer refused the text.
    Encode,
    /// An operation this counts nothing for (Responses API).
    Operation,
    /// An answer that called tools whose markup the chat template does
    /// not write back (the conversation without it is not a prefix).
    ToolCall,
}

impl Failure {
    pub fn as_str(self) -> &'static str {
        match self {
            Failure::Body => "body",
            Failure::NoTemplate => "no_template",
            Failure::Template => "template",
            Failure::Encode => "encode",
            Failure::Operation => "operation",
            Failure::ToolCall => "tool_call",
        }
    }
}

/// A loaded tokenizer as process facts hold it: equal when it is the
/// same one.
#[derive(Clone)]
pub struct Shared(pub std::sync::Arc<Tokenizer>);

impl PartialEq for Shared {
    fn eq(&self, o: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &o.0)
    }
}
impl Eq for Shared {}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// What encodes text: a Hugging Face `tokenizer.json`, or a GGUF
/// vocabulary encoding as llama.cpp does.
enum Backend {
    Hf(Box<tokenizers::Tokenizer>),
    Gguf(Box<gguf::GgufVocab>),
}

/// llama.cpp's template when a model has none (`CHATML_TEMPLATE_SRC`).
const CHATML: &str = "{%- for message in messages -%}\n  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n  {{- '<|im_start|>assistant\\n' -}}\n{%- endif -%}";

/// An engine's tokenizer, loaded once and shared by every process that
/// serves the same files.
pub struct Tokenizer {
    backend: Backend,
    /// The default chat template, and the `tool_use` one when the config
    /// names one.
    chat: Option<ChatTemplate>,
    tool_chat: Option<ChatTemplate>,
    /// The template iterates over a message's content parts (else parts
    /// are joined into one string first, as vLLM does for such templates).
    parts_content: bool,
    /// A chat's repeated prefix (system prompt, history) counted once.
    prefix: Option<PrefixCache>,
    /// The end-of-sequence token's text (`eos_token`).
    eos: Option<String>,
}

/// Counts of the pieces of rendered chats between special tokens, by
/// hash: turn N+1 of a conversation repeats turn N's pieces, which are not
/// encoded again. Exact where the tokenizer encodes a text as the
/// concatenation of its pieces between special tokens (Hugging Face
/// tokenizers split on special tokens before anything else) — which
/// [`PrefixCache::VERIFY_FIRST`] requests, then one in
/// [`PrefixCache::VERIFY_EVERY`], check against a whole encoding; one
/// difference turns the cache off for that tokenizer.
struct PrefixCache {
    specials: aho_corasick::AhoCorasick,
    state: std::sync::Mutex<PrefixState>,
}

#[derive(Default)]
struct PrefixState {
    counts: std::collections::HashMap<(u64, usize), u64>,
    requests: u64,
    verified: u64,
    off: bool,
    /// Pieces found in the cache, and encoded.
    hits: u64,
    misses: u64,
}

impl PrefixCache {
    /// Pieces kept at most (then the cache starts over).
    const MAX_ENTRIES: usize = 8192;
    /// Pieces shorter than this are encoded each time.
    const MIN_BYTES: usize = 64;
    const VERIFY_FIRST: u64 = 8;
    const VERIFY_EVERY: u64 = 64;

    /// A cache over `hf`'s special tokens, when splitting at them is how
    /// it encodes (none strips whitespace around itself or must stand as
    /// a word).
    fn new(hf: &tokenizers::Tokenizer) -> Option<Self> {
        let added = hf.get_added_tokens_decoder();
        let specials: Vec<&tokenizers::AddedToken> = added.values().filter(|t| t.special).collect();
        if specials.is_empty()
            || specials
                .iter()
                .any(|t| t.lstrip || t.rstrip || t.single_word || t.content.is_empty())
        {
            return None;
        }
        let specials = aho_corasick::AhoCorasick::builder()
            .match_kind(aho_corasick::MatchKind::LeftmostLongest)
            .build(specials.iter().map(|t| t.content.as_str()))
            .ok()?;
        Some(Self {
            specials,
            state: Default::default(),
        })
    }
}

/// What the prefix cache did since the start (the benchmark's view).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixStats {
    pub hits: u64,
    pub misses: u64,
    pub verified: u64,
    pub off: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field(
                "vocab",
                &match &self.backend {
                    Backend::Hf(hf) => hf.get_vocab_size(true),
                    Backend::Gguf(v) => v.n_tokens(),
                },
            )
            .field("chat", &self.chat.is_some())
            .finish()
    }
}

/// A special token in `tokenizer_config.json`: a string, or an
/// `AddedToken` object with its `content`.
fn token_string(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// The special-token names transformers gives a chat template.
const SPECIAL_NAMES: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
    "sep_token",
    "cls_token",
    "mask_token",
];

impl Tokenizer {
    /// Builds the tokenizer from its files. The error says what failed.
    pub fn from_hf(files: &HfFiles) -> Result<Self, String> {
        let hf = tokenizers::Tokenizer::from_bytes(&files.tokenizer_json)
            .map_err(|e| format!("tokenizer.json: {e}"))?;
        let config: serde_json::Value = match &files.config {
            Some(b) => {
                serde_json::from_slice(b).map_err(|e| format!("tokenizer_config.json: {e}"))?
            }
            None => serde_json::Value::Null,
        };
        let specials: BTreeMap<String, String> = SPECIAL_NAMES
            .iter()
            .filter_map(|n| Some((n.to_string(), token_string(config.get(*n)?)?)))
            .collect();
        // `chat_template`: a string, or a list of named templates.
        let mut default = None;
        let mut tool_use = None;
        match config.get("chat_template") {
            Some(serde_json::Value::String(s)) => default = Some(s.clone()),
            Some(serde_json::Value::Array(list)) => {
                for t in list {
                    let (Some(name), Some(src)) = (
                        t.get("name").and_then(|v| v.as_str()),
                        t.get("template").and_then(|v| v.as_str()),
                    ) else {
                        continue;
                    };
                    match name {
                        "default" => default = Some(src.to_string()),
                        "tool_use" => tool_use = Some(src.to_string()),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
        if let Some(t) = &files.template {
            default = Some(t.clone());
        }
        let parts_content = default.as_deref().is_some_and(iterates_content_parts);
        let compile = |src: Option<String>| -> Result<Option<ChatTemplate>, String> {
            src.map(|s| ChatTemplate::new(&s, specials.clone()))
                .transpose()
                .map_err(|e| format!("chat template: {e}"))
        };
        Ok(Self {
            prefix: PrefixCache::new(&hf),
            eos: specials.get("eos_token").cloned(),
            backend: Backend::Hf(Box::new(hf)),
            chat: compile(default)?,
            tool_chat: compile(tool_use)?,
            parts_content,
        })
    }

    /// Builds the tokenizer of a GGUF model from its vocabulary, with
    /// llama-server's chat template: `template` (its `--chat-template`
    /// or `--chat-template-file`) over the GGUF's
    /// `tokenizer.chat_template`, ChatML when there is none (as
    /// llama.cpp falls back); `bos_token`/`eos_token` are the tokens'
    /// texts.
    pub fn from_gguf(vocab: gguf::GgufVocab, template: Option<&str>) -> Result<Self, String> {
        let mut specials = BTreeMap::new();
        for (name, id) in [("bos_token", vocab.bos()), ("eos_token", vocab.eos())] {
            if let Some(t) = id.and_then(|i| vocab.token_text(i)) {
                specials.insert(name.to_string(), t.to_string());
            }
        }
        let src = match template.or(vocab.chat_template()) {
            None | Some("") | Some("chatml") => CHATML.to_string(),
            Some(t) => t.to_string(),
        };
        let chat =
            ChatTemplate::new(&src, specials.clone()).map_err(|e| format!("chat template: {e}"))?;
        Ok(Self {
            prefix: None,
            eos: specials.get("eos_token").cloned(),
            parts_content: iterates_content_parts(&src),
            backend: Backend::Gguf(Box::new(vocab)),
            chat: Some(chat),
            tool_chat: None,
        })
    }

    /// Tokens of `text`, with or without the tokenizer's own specials
    /// (its post-processor: BOS, …). A GGUF vocabulary reads special
    /// tokens in the text as llama-server does (`parse_special`).
    pub fn encode_len(&self, text: &str, add_special: bool) -> Result<u64, Failure> {
        match &self.backend {
            Backend::Hf(hf) => hf
                .encode_fast(text, add_special)
                .map(|e| e.len() as u64)
                .map_err(|_| Failure::Encode),
            Backend::Gguf(v) => v
                .encode(text, add_special, true)
                .map(|ids| ids.len() as u64)
                .map_err(|_| Failure::Encode),
        }
    }

    /// The ids of `text` (the tests' and the benchmark's view).
    pub fn encode_ids(&self, text: &str, add_special: bool) -> Result<Vec<u32>, Failure> {
        match &self.backend {
            Backend::Hf(hf) => hf
                .encode_fast(text, add_special)
                .map(|e| e.get_ids().to_vec())
                .map_err(|_| Failure::Encode),
            Backend::Gguf(v) => v
                .encode(text, add_special, true)
                .map_err(|_| Failure::Encode),
        }
    }

    /// Turns the prefix cache off (`false`) or back on (the benchmark
    /// compares the two).
    pub fn set_prefix_cache(&mut self, on: bool) {
        if let (true, Backend::Hf(hf)) = (on, &self.backend) {
            self.prefix = PrefixCache::new(hf);
        } else {
            self.prefix = None;
        }
    }

    /// What the prefix cache did.
    pub fn prefix_stats(&self) -> PrefixStats {
        match &self.prefix {
            Some(p) => {
                let s = p.state.lock().unwrap_or_else(|e| e.into_inner());
                PrefixStats {
                    hits: s.hits,
                    misses: s.misses,
                    verified: s.verified,
                    off: s.off,
                }
            }
            None => PrefixStats {
                off: true,
                ..Default::default()
            },
        }
    }

    /// Tokens of a rendered chat prompt (no added specials): through the
    /// prefix cache where it is on.
    pub fn prompt_len(&self, prompt: &str) -> Result<u64, Failure> {
        let Some(p) = &self.prefix else {
            return self.encode_len(prompt, false);
        };
        let verify = {
            let mut st = p.state.lock().unwrap_or_else(|e| e.into_inner());
            if st.off {
                drop(st);
                return self.encode_len(prompt, false);
            }
            st.requests += 1;
            st.requests <= PrefixCache::VERIFY_FIRST || st.requests % PrefixCache::VERIFY_EVERY == 0
        };
        let mut n = 0u64;
        let mut at = 0;
        let piece = |text: &str, n: &mut u64| -> Result<(), Failure> {
            if text.is_empty() {
                return Ok(());
            }
            if text.len() < PrefixCache::MIN_BYTES {
                *n += self.encode_len(text, false)?;
                return Ok(());
            }
            use std::hash::Hasher;
            // Fixed keys: the same text hashes alike in every call.
            let mut h = std::collections::hash_map::DefaultHasher::new();
            h.write(text.as_bytes());
            let key = (h.finish(), text.len());
            let cached = {
                let mut st = p.state.lock().unwrap_or_else(|e| e.into_inner());
                let c = st.counts.get(&key).copied();
                if c.is_some() {
                    st.hits += 1;
                }
                c
            };
            let c = match cached {
                Some(c) => c,
                None => {
                    let c = self.encode_len(text, false)?;
                    let mut st = p.state.lock().unwrap_or_else(|e| e.into_inner());
                    st.misses += 1;
                    if st.counts.len() >= PrefixCache::MAX_ENTRIES {
                        st.counts.clear();
                    }
                    st.counts.insert(key, c);
                    c
                }
            };
            *n += c;
            Ok(())
        };
        for m in p.specials.find_iter(prompt) {
            piece(&prompt[at..m.start()], &mut n)?;
            n += 1;
            at = m.end();
        }
        piece(&prompt[at..], &mut n)?;
        if verify {
            let whole = self.encode_len(prompt, false)?;
            let mut st = p.state.lock().unwrap_or_else(|e| e.into_inner());
            if whole == n {
                st.verified += 1;
            } else {
                st.off = true;
                st.counts.clear();
                return Ok(whole);
            }
        }
        Ok(n)
    }

    /// Whether a chat template is known.
    pub fn has_chat_template(&self) -> bool {
        self.chat.is_some()
    }

    /// The prompt a chat request renders to (the engine's
    /// `apply_chat_template(tokenize=False)`).
    pub fn render_chat(&self, body: &Json) -> Result<String, Failure> {
        self.render_turn(body, None)
    }

    /// The conversation rendered, with `answer` (an assistant message)
    /// appended and no generation prompt when given.
    fn render_turn(&self, body: &Json, answer: Option<Json>) -> Result<String, Failure> {
        let messages = match body.get("messages") {
            Some(Json::Array(m)) => m,
            _ => return Err(Failure::Body),
        };
        let tools = body
            .get("tools")
            .filter(|t| matches!(t, Json::Array(a) if !a.is_empty()));
        let template = match (tools, &self.tool_chat) {
            (Some(_), Some(t)) => t,
            _ => self.chat.as_ref().ok_or(Failure::NoTemplate)?,
        };
        let mut messages: Vec<Json> = messages
            .iter()
            .map(|m| chat_message(m, self.parts_content))
            .collect();
        let flag = |k: &str, default: bool| body.get(k).and_then(Json::as_bool).unwrap_or(default);
        let mut continue_final = flag("continue_final_message", false);
        let mut generation = flag("add_generation_prompt", !continue_final);
        if let Some(a) = answer {
            messages.push(chat_message(&a, self.parts_content));
            (continue_final, generation) = (false, false);
        }
        let mut vars: Vec<(String, minijinja::Value)> = vec![
            ("messages".into(), Json::Array(messages).to_value()),
            (
                "tools".into(),
                tools.map_or(minijinja::Value::from(()), Json::to_value),
            ),
            ("documents".into(), minijinja::Value::from(())),
            (
                "add_generation_prompt".into(),
                minijinja::Value::from(generation),
            ),
            (
                "continue_final_message".into(),
                minijinja::Value::from(continue_final),
            ),
        ];
        if let Some(Json::Object(kw)) = body.get("chat_template_kwargs") {
            for (k, v) in kw {
                vars.retain(|(n, _)| n != k);
                vars.push((k.clone(), v.to_value()));
            }
        }
        template.render(vars).map_err(|_| Failure::Template)
    }

    /// Input tokens of a request as `engine` counts them.
    pub fn input_tokens(
        &self,
        engine: Option<Engine>,
        op: Operation,
        body: &[u8],
    ) -> Result<u64, Failure> {
        let body: Json = serde_json::from_slice(body).map_err(|_| Failure::Body)?;
        let add_special = |default: bool| {
            body.get("add_special_tokens")
                .and_then(Json::as_bool)
                .unwrap_or(default)
        };
        match op {
            Operation::Chat => {
                let prompt = self.render_chat(&body)?;
                if let Backend::Gguf(v) = &self.backend {
                    return self.llama_chat_len(v, &prompt);
                }
                // vLLM, SGLang and TGI encode the rendered prompt without
                // the tokenizer's specials: the template wrote them.
                let _ = engine;
                if add_special(false) {
                    self.encode_len(&prompt, true)
                } else {
                    self.prompt_len(&prompt)
                }
            }
            Operation::TextCompletion => self.prompts(body.get("prompt"), add_special(true)),
            Operation::Embeddings => self.prompts(body.get("input"), add_special(true)),
            Operation::Generate => self.prompts(
                body.get("inputs").or_else(|| body.get("prompt")),
                add_special(true),
            ),
            Operation::Responses => Err(Failure::Operation),
        }
    }

    /// Tokens of a rendered chat as llama-server counts them: a BOS
    /// (EOS) the template wrote is dropped when the vocabulary adds one
    /// (`common_chat_templates_apply`), then the prompt is tokenized with
    /// the specials added and parsed.
    fn llama_chat_len(&self, v: &gguf::GgufVocab, prompt: &str) -> Result<u64, Failure> {
        let text = |id: Option<u32>| id.and_then(|i| v.token_text(i)).filter(|t| !t.is_empty());
        let mut p = prompt;
        if let (true, Some(bos)) = (v.add_bos(), text(v.bos())) {
            p = p.strip_prefix(bos).unwrap_or(p);
        }
        if let (true, Some(eos)) = (v.add_eos(), text(v.eos())) {
            p = p.strip_suffix(eos).unwrap_or(p);
        }
        self.encode_len(p, true)
    }

    /// A prompt as completions and embeddings take it: a string, a list
    /// of strings (each its own request, counts summed), token ids, or a
    /// list of token-id lists.
    fn prompts(&self, v: Option<&Json>, add_special: bool) -> Result<u64, Failure> {
        match v {
            Some(Json::Str(s)) => self.encode_len(s, add_special),
            Some(Json::Array(a)) if a.iter().all(|x| matches!(x, Json::Int(_) | Json::UInt(_))) => {
                Ok(a.len() as u64)
            }
            Some(Json::Array(a)) => {
                let mut n = 0u64;
                for x in a {
                    n = n.saturating_add(match x {
                        Json::Str(s) => self.encode_len(s, add_special)?,
                        Json::Array(ids) => ids.len() as u64,
                        _ => return Err(Failure::Body),
                    });
                }
                Ok(n)
            }
            _ => Err(Failure::Body),
        }
    }

    /// Output tokens of an answer that called tools, as `engine` counts
    /// them: the model wrote its calls in its own markup, which the wire
    /// does not carry but its chat template does — the conversation
    /// rendered with the answer (`content`, the `calls` as (name,
    /// arguments)) appended, less the conversation rendered with the
    /// generation prompt, up to the end-of-sequence token the template
    /// closes the turn with (counted, as the engine counts it).
    pub fn tool_call_output_tokens(
        &self,
        body: &[u8],
        content: &str,
        calls: &[(String, String)],
    ) -> Result<u64, Failure> {
        let body: Json = serde_json::from_slice(body).map_err(|_| Failure::Body)?;
        let calls: Vec<Json> = calls
            .iter()
            .enumerate()
            .map(|(i, (name, args))| {
                Json::Object(vec![
                    ("id".into(), Json::Str(format!("call_{i}"))),
                    ("type".into(), Json::Str("function".into())),
                    (
                        "function".into(),
                        Json::Object(vec![
                            ("name".into(), Json::Str(name.clone())),
                            ("arguments".into(), Json::Str(args.clone())),
                        ]),
                    ),
                ])
            })
            .collect();
        let answer = Json::Object(vec![
            ("role".into(), Json::Str("assistant".into())),
            (
                "content".into(),
                if content.is_empty() {
                    Json::Null
                } else {
                    Json::Str(content.to_string())
                },
            ),
            ("tool_calls".into(), Json::Array(calls)),
        ]);
        let before = self.render_turn(&body, None)?;
        let after = self.render_turn(&body, Some(answer))?;
        let Some(turn) = after.strip_prefix(before.as_str()) else {
            return Err(Failure::ToolCall);
        };
        let eos = self.eos.as_deref().filter(|e| !e.is_empty());
        let (text, eos) = match eos.and_then(|e| turn.rfind(e)) {
            Some(at) => (&turn[..at], 1),
            None => (turn, 0),
        };
        Ok(self.encode_len(text, false)? + eos)
    }

    /// Output tokens of generated `text` as `engine` counts them: the
    /// text's tokens, plus the end-of-sequence token the engine generated
    /// and counts when it stopped on one (`finish_reason` `stop` or
    /// `tool_calls`; the text leaves it out).
    pub fn output_tokens(
        &self,
        engine: Option<Engine>,
        text: &str,
        finish_reason: Option<&str>,
    ) -> Result<u64, Failure> {
        let n = self.encode_len(text, false)?;
        let eos = matches!(
            engine,
            None | Some(
                Engine::Vllm | Engine::Sglang | Engine::Tgi | Engine::Lmdeploy | Engine::LlamaCpp
            )
        ) && matches!(finish_reason, Some("stop" | "tool_calls" | "eos_token"));
        Ok(n + u64::from(eos))
    }
}

/// Whether a chat template walks a message's content parts (vLLM's
/// "openai" content format); else parts are joined into one string.
fn iterates_content_parts(src: &str) -> bool {
    let s: String = src.chars().filter(|c| !c.is_whitespace()).collect();
    [
        "in message['content']",
        "in message.content",
        "in m['content']",
        "in m.content",
    ]
    .iter()
    .any(|p| s.contains(&p.replace(' ', "")))
}

/// A request message as vLLM hands it to the template: text parts joined
/// with newlines (for string-content templates), a tool call's
/// `arguments` string parsed into its object.
fn chat_message(m: &Json, parts: bool) -> Json {
    let Json::Object(kv) = m else {
        return m.clone();
    };
    let kv = kv
        .iter()
        .map(|(k, v)| {
            let v = match (k.as_str(), v) {
                ("content", Json::Array(items)) if !parts => Json::Str(
                    items
                        .iter()
                        .filter_map(|p| p.get("text").and_then(Json::as_str))
                        .collect::<Vec<_>>()
                        .join("\n"),
                ),
                ("tool_calls", Json::Array(calls)) => {
                    Json::Array(calls.iter().map(parsed_arguments).collect())
                }
                _ => v.clone(),
            };
            (k.clone(), v)
        })
        .collect();
    Json::Object(kv)
}

fn parsed_arguments(call: &Json) -> Json {
    let Json::Object(kv) = call else {
        return call.clone();
    };
    Json::Object(
        kv.iter()
            .map(|(k, v)| match (k.as_str(), v) {
                ("function", Json::Object(f)) => (
                    k.clone(),
                    Json::Object(
                        f.iter()
                            .map(|(fk, fv)| match (fk.as_str(), fv) {
                                ("arguments", Json::Str(s)) => (
                                    fk.clone(),
                                    serde_json::from_str::<Json>(s).unwrap_or_else(|_| fv.clone()),
                                ),
                                _ => (fk.clone(), fv.clone()),
                            })
                            .collect(),
                    ),
                ),
                _ => (k.clone(), v.clone()),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A word-level tokenizer (one token per whitespace-separated word or
    /// punctuation run) with two special chat tokens.
    fn tok(template: &str) -> Tokenizer {
        let words = [
            "[UNK]",
            "user",
            "assistant",
            "system",
            "hi",
            "there",
            "red",
            "green",
            "call",
            "f",
            "{",
            "}",
            "\"",
            ":",
            "a",
            "1",
            "<",
            ">",
            "/",
        ];
        let vocab: serde_json::Map<String, serde_json::Value> = words
            .iter()
            .enumerate()
            .map(|(i, w)| (w.to_string(), serde_json::json!(i)))
            .collect();
        let n = words.len();
        let tj = serde_json::json!({
            "version": "1.0",
            "added_tokens": [
                {"id": n, "content": "<|im_start|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
                {"id": n + 1, "content": "<|im_end|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
            ],
            "normalizer": null,
            "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": null,
            "decoder": null,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
        });
        let config = serde_json::json!({"eos_token": "<|im_end|>", "chat_template": template});
        Tokenizer::from_hf(&HfFiles {
            tokenizer_json: tj.to_string().into_bytes(),
            config: Some(config.to_string().into_bytes()),
            template: None,
        })
        .unwrap()
    }

    const CHAT: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content %}{{ m.content }}{% endif %}{% for c in m.tool_calls or [] %}<call>{{ c.function.name }} {{ c.function.arguments|tojson }}</call>{% endfor %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

    #[test]
    fn a_chat_is_rendered_then_counted_without_added_specials() {
        let t = tok(CHAT);
        let body = br#"{"messages":[{"role":"system","content":"hi"},{"role":"user","content":"hi there"}]}"#;
        // 5 specials + system hi user hi there assistant.
        assert_eq!(t.input_tokens(None, Operation::Chat, body), Ok(11));
        let no_gen =
            br#"{"messages":[{"role":"user","content":"hi"}],"add_generation_prompt":false}"#;
        assert_eq!(t.input_tokens(None, Operation::Chat, no_gen), Ok(4));
        // Content parts are joined with a newline; token ids are counted
        // as they are.
        let parts = br#"{"messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"text","text":"there"}]}]}"#;
        assert_eq!(t.input_tokens(None, Operation::Chat, parts), Ok(7));
        assert_eq!(
            t.input_tokens(None, Operation::TextCompletion, br#"{"prompt":[1,2,3]}"#),
            Ok(3)
        );
        assert_eq!(
            t.input_tokens(
                None,
                Operation::TextCompletion,
                br#"{"prompt":["hi","red green"]}"#
            ),
            Ok(3)
        );
        assert_eq!(
            t.input_tokens(None, Operation::Chat, b"{\"messages\": 3}"),
            Err(Failure::Body)
        );
        assert_eq!(
            t.input_tokens(None, Operation::Responses, b"{}"),
            Err(Failure::Operation)
        );
    }

    #[test]
    fn the_output_counts_the_eos_an_engine_stopped_on() {
        let t = tok(CHAT);
        assert_eq!(
            t.output_tokens(Some(Engine::Vllm), "red green", Some("stop")),
            Ok(3)
        );
        assert_eq!(
            t.output_tokens(Some(Engine::Vllm), "red green", Some("length")),
            Ok(2)
        );
    }

    /// The streamed call (name, arguments) written back by the template:
    /// `<call>f {"a": 1}</call>` then the turn's end (the EOS, counted).
    #[test]
    fn a_tool_call_is_counted_in_the_templates_markup() {
        let t = tok(CHAT);
        let body = br#"{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}]}"#;
        let calls = vec![("f".to_string(), r#"{"a": 1}"#.to_string())];
        let markup = t.encode_len("<call>f {\"a\": 1}</call>", false).unwrap();
        assert_eq!(t.tool_call_output_tokens(body, "", &calls), Ok(markup + 1));
        assert_eq!(
            t.tool_call_output_tokens(body, "red", &calls),
            Ok(markup + 2),
            "content before the call"
        );
        // A template that does not end the conversation as it began.
        let odd = tok("{% if add_generation_prompt %}G{% endif %}{% for m in messages %}{{ m.role }}{% endfor %}");
        assert_eq!(
            odd.tool_call_output_tokens(body, "", &calls),
            Err(Failure::ToolCall)
        );
    }
}
