//! Wire formats: which endpoint speaks which API (`Format`), and what one
//! stream event or body of it says (`interpret` → `EventInfo`). This
//! module owns the dispatch and what the formats share (request bodies,
//! the tolerant serde field readers); each API family's event shapes and
//! reading live in its own file (`openai`, `tgi`, `ollama`, `llamacpp`,
//! `triton`). A new API is a file, a `Format` and its arm in `interpret`;
//! a new engine that speaks a known API needs nothing here (its facts are
//! in `crate::engines`).
//!
//! Must not: allocate per event on the OpenAI path (strings borrow from the
//! event's bytes), fail a whole event on one odd field (fields read as
//! absent instead), or keep any payload text (only sizes and flags).

use std::borrow::Cow;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

use crate::engines::Engine;
use crate::vocab::{Operation, StagesSource};

/// The API an exchange speaks, decided from the request path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    OpenAiChat,
    OpenAiCompletions,
    OpenAiEmbeddings,
    OpenAiResponses,
    TgiGenerate,
    OllamaChat,
    OllamaGenerate,
    LlamaCppCompletion,
    TritonGenerate,
    /// Triton's gRPC `ModelInfer` / `ModelStreamInfer` (protobuf, read by
    /// `decode::grpc`, never by `interpret`).
    TritonGrpc,
    /// vLLM's gRPC `Generate` (`vllm.grpc.engine.VllmEngine`).
    VllmGrpc,
    /// SGLang's gRPC `Generate` (`sglang.grpc.scheduler.SglangScheduler`).
    SglangGrpc,
    Unknown,
}

impl Format {
    pub fn from_path(path: &str) -> Format {
        match path {
            "/inference.GRPCInferenceService/ModelInfer"
            | "/inference.GRPCInferenceService/ModelStreamInfer" => return Format::TritonGrpc,
            "/vllm.grpc.engine.VllmEngine/Generate" => return Format::VllmGrpc,
            "/sglang.grpc.scheduler.SglangScheduler/Generate" => return Format::SglangGrpc,
            _ => {}
        }
        let p = path
            .split(['?', '#'])
            .next()
            .unwrap_or("")
            .trim_end_matches('/');
        if p.starts_with("/v2/models/")
            && (p.ends_with("/generate") || p.ends_with("/generate_stream"))
        {
            Format::TritonGenerate
        } else if p.ends_with("/chat/completions") {
            Format::OpenAiChat
        } else if p.ends_with("/embeddings") {
            Format::OpenAiEmbeddings
        } else if p.ends_with("/responses") {
            Format::OpenAiResponses
        } else if p.ends_with("/completions") {
            Format::OpenAiCompletions
        } else if p == "/api/chat" {
            Format::OllamaChat
        } else if p == "/api/generate" {
            Format::OllamaGenerate
        } else if p == "/generate" || p == "/generate_stream" || p.is_empty() {
            // TGI's `POST /` is generate or generate_stream by its body.
            Format::TgiGenerate
        } else if p == "/completion" {
            Format::LlamaCppCompletion
        } else {
            Format::Unknown
        }
    }

    /// gen_ai.operation.name for this API.
    pub fn operation(self) -> Option<Operation> {
        Some(match self {
            Format::OpenAiChat | Format::OllamaChat => Operation::Chat,
            Format::OpenAiCompletions | Format::LlamaCppCompletion => Operation::TextCompletion,
            Format::OpenAiEmbeddings => Operation::Embeddings,
            Format::OpenAiResponses => Operation::Responses,
            Format::TgiGenerate
            | Format::OllamaGenerate
            | Format::TritonGenerate
            | Format::TritonGrpc
            | Format::VllmGrpc
            | Format::SglangGrpc => Operation::Generate,
            Format::Unknown => return None,
        })
    }

    /// The engine, when the API is one engine's own (the OpenAI API is
    /// everyone's).
    pub fn provider(self) -> Option<Engine> {
        match self {
            Format::TgiGenerate => Some(Engine::Tgi),
            Format::OllamaChat | Format::OllamaGenerate => Some(Engine::Ollama),
            Format::LlamaCppCompletion => Some(Engine::LlamaCpp),
            Format::TritonGenerate | Format::TritonGrpc => Some(Engine::Triton),
            Format::VllmGrpc => Some(Engine::Vllm),
            Format::SglangGrpc => Some(Engine::Sglang),
            _ => None,
        }
    }
}

/// What the request body says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestInfo {
    pub model: Option<String>,
    /// Whether the client asked for a stream (None: the body did not say).
    pub stream: Option<bool>,
    /// Characters of prompt text, for an input-token estimate.
    pub prompt_chars: Option<u64>,
    /// The OpenAI `user` field (a tenant when no tenant header says),
    /// bounded by `identity::caller::bounded_value`.
    pub user: Option<String>,
    /// Tools were offered (a non-empty `tools` or legacy `functions`).
    pub tools_offered: bool,
    /// Which of the top-level keys asked about (request-type rules'
    /// `json_field`) the body has. Names only, never values.
    pub json_fields: Vec<String>,
}

fn text_chars(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.chars().count() as u64,
        Value::Array(a) => a.iter().map(text_chars).sum(),
        Value::Object(o) => ["content", "text", "prompt", "input", "inputs", "text_input"]
            .iter()
            .filter_map(|k| o.get(*k))
            .map(text_chars)
            .sum(),
        _ => 0,
    }
}

/// Parses a request body (JSON) for model, stream flag and prompt size.
pub fn request_info(body: &[u8]) -> RequestInfo {
    request_info_with(body, &[])
}

/// [`request_info`], also noting which of the top-level keys `fields`
/// the body has.
pub fn request_info_with(body: &[u8], fields: &[String]) -> RequestInfo {
    let Ok(Value::Object(o)) = serde_json::from_slice::<Value>(body) else {
        return RequestInfo::default();
    };
    let non_empty = |k: &str| {
        o.get(k)
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
    };
    let model = o.get("model").and_then(Value::as_str).map(str::to_string);
    let stream = o.get("stream").and_then(Value::as_bool);
    let prompt = ["messages", "prompt", "input", "inputs", "text_input"]
        .iter()
        .filter_map(|k| o.get(*k))
        .map(text_chars)
        .sum::<u64>();
    RequestInfo {
        model,
        stream,
        prompt_chars: (prompt > 0).then_some(prompt),
        user: o
            .get("user")
            .and_then(Value::as_str)
            .and_then(|u| crate::identity::caller::bounded_value(u.as_bytes())),
        tools_offered: non_empty("tools") || non_empty("functions"),
        json_fields: fields
            .iter()
            .filter(|f| o.contains_key(f.as_str()))
            .cloned()
            .collect(),
    }
}

/// Rough token estimate for text when the engine reports none (≈ 4
/// characters per token for English BPE vocabularies).
pub fn estimate_tokens(chars: u64) -> u64 {
    chars.div_ceil(4).max(1)
}

/// Kind of generated content an event carries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Content {
    #[default]
    None,
    Answer,
    Reasoning,
    Tool,
}

/// Everything one stream event (or a whole non-streamed body) says.
/// Strings borrow from the event's bytes where they can (no allocation on
/// the per-event path).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventInfo<'a> {
    pub content: Content,
    /// Content events inside this one (several choices with n > 1).
    pub content_parts: u32,
    pub model: Option<Cow<'a, str>>,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// The counts above came from an OpenAI `usage` object (else from
    /// another report of the engine's own).
    pub input_from_usage: bool,
    pub output_from_usage: bool,
    pub finish_reason: Option<Cow<'a, str>>,
    /// The event reports an error (an `error` object, a failed response).
    pub error: bool,
    /// The engine's own end-of-stream event (Ollama `done: true`, llama.cpp
    /// `stop: true`); OpenAI's `data: [DONE]` is seen by the SSE layer.
    pub end_of_stream: bool,
    /// A tool call, even in an event whose content reads as an answer.
    pub tool_calls: bool,
    /// The response's own id (OpenAI `id`), borrowed from the event.
    pub response_id: Option<Cow<'a, str>>,
    /// What the engine says about where the request's time went.
    pub stages: Stages,
}

/// Where a request's time went, as the engine reports it on the wire (its
/// own clocks): microseconds, `None` when the engine does not say. Later
/// reports of a request fill in what earlier ones left out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stages {
    /// Waiting in the engine's scheduler before its first compute.
    pub engine_queue_us: Option<u64>,
    /// Processing the prompt (prefill), up to the first token.
    pub prefill_us: Option<u64>,
    /// Generating the output tokens after the first.
    pub decode_us: Option<u64>,
    /// Loading the model for this request (Ollama).
    pub model_load_us: Option<u64>,
    /// Input tokens served from a prefix cache.
    pub cached_input_tokens: Option<u64>,
    /// The engine fields they came from.
    pub source: Option<StagesSource>,
}

impl Stages {
    pub fn is_empty(&self) -> bool {
        self.source.is_none()
    }

    /// Fields `other` has replace this one's; its source is added (when it
    /// said anything).
    pub fn merge(&mut self, other: &Stages) {
        let Some(src) = other.source else { return };
        let said = [
            other.engine_queue_us,
            other.prefill_us,
            other.decode_us,
            other.model_load_us,
            other.cached_input_tokens,
        ]
        .iter()
        .any(Option::is_some);
        if !said {
            return;
        }
        macro_rules! take {
            ($($f:ident),*) => { $(if other.$f.is_some() { self.$f = other.$f; })* };
        }
        take!(
            engine_queue_us,
            prefill_us,
            decode_us,
            model_load_us,
            cached_input_tokens
        );
        self.source = Some(self.source.unwrap_or_default() | src);
    }
}

/// Milliseconds (a JSON number, possibly fractional) as microseconds.
pub(crate) fn ms_to_us(ms: f64) -> Option<u64> {
    (ms.is_finite() && ms >= 0.0).then(|| (ms * 1000.0).round() as u64)
}

impl Default for EventInfo<'_> {
    fn default() -> Self {
        Self {
            content: Content::None,
            content_parts: 0,
            model: None,
            input_tokens: None,
            output_tokens: None,
            input_from_usage: false,
            output_from_usage: false,
            finish_reason: None,
            error: false,
            end_of_stream: false,
            tool_calls: false,
            response_id: None,
            stages: Stages::default(),
        }
    }
}

/// Drains an array the visitor does not want.
macro_rules! ignore_seq {
    ($ty:ty, $none:expr) => {
        fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<$ty, A::Error> {
            while s.next_element::<IgnoredAny>()?.is_some() {}
            Ok($none)
        }
    };
}

/// Drains any other JSON value (objects, scalars) the visitor does not want.
macro_rules! ignore_others {
    ($ty:ty, $none:expr) => {
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<$ty, A::Error> {
            while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok($none)
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<$ty, E> {
            Ok($none)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<$ty, E> {
            Ok($none)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<$ty, E> {
            Ok($none)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<$ty, E> {
            Ok($none)
        }
        fn visit_unit<E: de::Error>(self) -> Result<$ty, E> {
            Ok($none)
        }
    };
}

/// An event of a non-OpenAI family: the fields [`common`] reads (`model`,
/// `model_name`, `usage`, `error`) and the family's own, with
/// `common_info()` handing the first four to [`common`].
macro_rules! family_event {
    ($name:ident { $($own:tt)* }) => {
        #[derive(serde::Deserialize, Default, Debug)]
        #[serde(default)]
        struct $name<'a> {
            #[serde(borrow)]
            model: super::Loose<'a>,
            #[serde(borrow)]
            model_name: super::Loose<'a>,
            usage: Option<super::Usage>,
            error: Option<serde::de::IgnoredAny>,
            $($own)*
        }

        impl<'a> $name<'a> {
            fn common_info(&mut self) -> super::EventInfo<'a> {
                super::common(
                    std::mem::take(&mut self.model),
                    std::mem::take(&mut self.model_name),
                    self.usage.as_ref(),
                    self.error.is_some(),
                )
            }
        }
    };
}

// The family modules come after the macros above, which they use.
mod llamacpp;
mod ollama;
mod openai;
pub use openai::set_fast_path;
mod tgi;
pub use tgi::tgi_header_stages;
mod triton;

/// A string field that tolerates other JSON types (they read as absent),
/// so one odd field never hides the rest of an event. Borrowed when the
/// JSON string has no escapes.
#[derive(Debug, Default)]
struct Loose<'a>(Option<Cow<'a, str>>);

impl<'de: 'a, 'a> Deserialize<'de> for Loose<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Loose<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("anything")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Loose<'a>, E> {
                Ok(Loose(Some(Cow::Borrowed(v))))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Loose<'a>, E> {
                Ok(Loose(Some(Cow::Owned(v.to_string()))))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Loose<'a>, E> {
                Ok(Loose(Some(Cow::Owned(v))))
            }
            ignore_others!(Loose<'a>, Loose(None));
            ignore_seq!(Loose<'a>, Loose(None));
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// A JSON object read as `T`; any other JSON value (null, a string, a
/// number, an array) reads as absent rather than failing the whole event:
/// for objects under generic keys (`metrics`, `timings`, `response`) that
/// another server may fill with something else.
#[derive(Debug)]
struct Obj<T>(Option<T>);

impl<T> Default for Obj<T> {
    fn default() -> Self {
        Obj(None)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Obj<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("anything")
            }
            fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<Obj<T>, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(m)).map(|t| Obj(Some(t)))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Obj<T>, E> {
                Ok(Obj(None))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Obj<T>, E> {
                Ok(Obj(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Obj<T>, E> {
                Ok(Obj(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Obj<T>, E> {
                Ok(Obj(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Obj<T>, E> {
                Ok(Obj(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Obj<T>, E> {
                Ok(Obj(None))
            }
            ignore_seq!(Obj<T>, Obj(None));
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// "Is this a non-empty string?" without keeping the string.
#[derive(Debug, Default, Clone, Copy)]
struct Text(bool);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("anything")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Text, E> {
                Ok(Text(!v.is_empty()))
            }
            ignore_others!(Text, Text(false));
            ignore_seq!(Text, Text(false));
        }
        d.deserialize_any(V)
    }
}

/// "Is this a non-empty array?" without building it.
#[derive(Debug, Default, Clone, Copy)]
struct NonEmptySeq(bool);

impl<'de> Deserialize<'de> for NonEmptySeq {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NonEmptySeq;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("anything")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<NonEmptySeq, A::Error> {
                let mut n = 0;
                while s.next_element::<IgnoredAny>()?.is_some() {
                    n += 1;
                }
                Ok(NonEmptySeq(n > 0))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<NonEmptySeq, A::Error> {
                while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(NonEmptySeq(false))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<NonEmptySeq, E> {
                Ok(NonEmptySeq(false))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<NonEmptySeq, E> {
                Ok(NonEmptySeq(false))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<NonEmptySeq, E> {
                Ok(NonEmptySeq(false))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<NonEmptySeq, E> {
                Ok(NonEmptySeq(false))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<NonEmptySeq, E> {
                Ok(NonEmptySeq(false))
            }
            fn visit_unit<E: de::Error>(self) -> Result<NonEmptySeq, E> {
                Ok(NonEmptySeq(false))
            }
        }
        d.deserialize_any(V)
    }
}

/// A number field that tolerates other types.
#[derive(Debug, Default, Clone, Copy)]
struct Num(Option<u64>);

impl<'de> Deserialize<'de> for Num {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Num;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a number")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Num, E> {
                Ok(Num(Some(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Num, E> {
                Ok(Num(u64::try_from(v).ok()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Num, E> {
                Ok(Num((v >= 0.0 && v.is_finite()).then_some(v as u64)))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Num, E> {
                Ok(Num(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Num, A::Error> {
                while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Num(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Num, A::Error> {
                while s.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Num(None))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Num, E> {
                Ok(Num(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Num, E> {
                Ok(Num(None))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct Usage {
    prompt_tokens: Num,
    completion_tokens: Num,
    input_tokens: Num,
    output_tokens: Num,
    prompt_tokens_details: Option<CachedDetails>,
    input_tokens_details: Option<CachedDetails>,
}

/// `usage.prompt_tokens_details` (Chat/Completions) or
/// `usage.input_tokens_details` (Responses).
#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct CachedDetails {
    cached_tokens: Num,
}

/// llama.cpp's `timings` (native `/completion` and its OpenAI streams).
#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct Timings {
    prompt_n: Num,
    predicted_n: Num,
    prompt_ms: Float,
    predicted_ms: Float,
    cache_n: Num,
}

impl Timings {
    /// The prompt's tokens: those evaluated now (`prompt_n`) and those
    /// taken from the slot's prompt cache (`cache_n`). llama-server
    /// answering a multi-turn chat from its cache says `prompt_n: 1,
    /// cache_n: 37` where its own `usage.prompt_tokens` says 38.
    fn input_tokens(&self) -> Option<u64> {
        self.prompt_n
            .0
            .map(|n| n.saturating_add(self.cache_n.0.unwrap_or(0)))
    }

    fn stages(&self) -> Stages {
        Stages {
            prefill_us: self.prompt_ms.0.and_then(ms_to_us),
            decode_us: self.predicted_ms.0.and_then(ms_to_us),
            cached_input_tokens: self.cache_n.0,
            source: Some(StagesSource::LLAMACPP_TIMINGS),
            ..Stages::default()
        }
    }
}

/// vLLM's per-request `metrics` object (`--enable-per-request-metrics`,
/// vllm-project/vllm#46768; on a stream's final usage chunk, at the top of
/// a whole response, in the Responses API's final `response`): `queue_time_ms` waiting in the scheduler,
/// `time_to_first_token_ms` from being scheduled to the first token (the
/// prefill), `generation_time_ms` from the first token to the last.
#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct VllmMetrics {
    queue_time_ms: Float,
    time_to_first_token_ms: Float,
    generation_time_ms: Float,
}

impl VllmMetrics {
    fn stages(&self) -> Stages {
        Stages {
            engine_queue_us: self.queue_time_ms.0.and_then(ms_to_us),
            prefill_us: self.time_to_first_token_ms.0.and_then(ms_to_us),
            decode_us: self.generation_time_ms.0.and_then(ms_to_us),
            source: Some(StagesSource::VLLM_METRICS),
            ..Stages::default()
        }
    }
}

/// Copies a `usage` object's token counts (either naming) into `info`.
fn usage_into(u: &Usage, info: &mut EventInfo<'_>) {
    if let Some(n) = u.prompt_tokens.0.or(u.input_tokens.0) {
        info.input_tokens = Some(n);
        info.input_from_usage = true;
    }
    if let Some(n) = u.completion_tokens.0.or(u.output_tokens.0) {
        info.output_tokens = Some(n);
        info.output_from_usage = true;
    }
    let cached = u
        .prompt_tokens_details
        .as_ref()
        .or(u.input_tokens_details.as_ref())
        .and_then(|d| d.cached_tokens.0);
    if cached.is_some() {
        info.stages.merge(&Stages {
            cached_input_tokens: cached,
            source: Some(StagesSource::OPENAI_USAGE),
            ..Stages::default()
        });
    }
}

/// A number field that tolerates other JSON types (they read as absent):
/// any finite non-negative number, fractions kept.
#[derive(Debug, Default, Clone, Copy)]
struct Float(Option<f64>);

impl<'de> Deserialize<'de> for Float {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Float;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a number")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Float, E> {
                Ok(Float(Some(v as f64)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Float, E> {
                Ok(Float((v >= 0).then_some(v as f64)))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Float, E> {
                Ok(Float((v.is_finite() && v >= 0.0).then_some(v)))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Float, E> {
                Ok(Float(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Float, A::Error> {
                while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Float(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Float, A::Error> {
                while s.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Float(None))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Float, E> {
                Ok(Float(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Float, E> {
                Ok(Float(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// The kind that wins for an event carrying both: answer or tool content
/// outranks reasoning.
fn stronger(a: Content, b: Content) -> Content {
    match (a, b) {
        (Content::None, x) | (x, Content::None) => x,
        (Content::Reasoning, x) => x,
        (x, _) => x,
    }
}

/// Counts one content part of kind `c` (nothing for `Content::None`).
fn add(info: &mut EventInfo<'_>, c: Content) {
    if c != Content::None {
        info.content = stronger(info.content, c);
        info.content_parts += 1;
    }
}

/// The fields every non-OpenAI family reads the same way: model (`model`
/// or `model_name`), a `usage` object and an `error` flag.
fn common<'a>(
    model: Loose<'a>,
    model_name: Loose<'a>,
    usage: Option<&Usage>,
    error: bool,
) -> EventInfo<'a> {
    let mut info = EventInfo {
        model: model.0.or(model_name.0),
        error,
        ..EventInfo::default()
    };
    if let Some(u) = usage {
        usage_into(u, &mut info);
    }
    info
}

/// Interprets one stream event (or a whole non-streamed body) of `format`.
/// `None` when the bytes are not a JSON object of that family's shape.
/// The generated text a response event or whole body (`json`) of
/// `format` carries, appended to `kept` per choice: OpenAI chat's
/// `content` and `reasoning_content`/`reasoning`, and the first choice's
/// tool calls' `name` and `arguments` by call index (in `delta` or
/// `message`), completions' `text`, TGI's
/// `token.text` (not special tokens) or `generated_text`. Other formats
/// carry engine counts, or are not tokenized here.
pub fn generated_text(format: Format, json: &[u8], kept: &mut crate::record::KeptText) {
    use serde_json::Value;
    let Ok(v) = serde_json::from_slice::<Value>(json) else {
        return;
    };
    let push = |kept: &mut crate::record::KeptText, i: usize, s: Option<&Value>| {
        if let Some(s) = s.and_then(Value::as_str) {
            kept.push_output(i, s);
        }
    };
    match format {
        Format::OpenAiChat | Format::OpenAiCompletions => {
            let Some(choices) = v.get("choices").and_then(Value::as_array) else {
                return;
            };
            for (n, c) in choices.iter().enumerate() {
                let i = c
                    .get("index")
                    .and_then(Value::as_u64)
                    .map_or(n, |i| i.min(usize::MAX as u64) as usize);
                push(kept, i, c.get("text"));
                for m in [c.get("delta"), c.get("message")].into_iter().flatten() {
                    for k in ["reasoning_content", "reasoning", "content"] {
                        push(kept, i, m.get(k));
                    }
                    for call in m
                        .get("tool_calls")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        let f = call.get("function");
                        let field = |k: &str| f.and_then(|f| f.get(k)).and_then(Value::as_str);
                        let index = call
                            .get("index")
                            .and_then(Value::as_u64)
                            .map_or(0, |x| x.min(usize::MAX as u64) as usize);
                        kept.push_call(i, index, field("name"), field("arguments"));
                    }
                }
            }
        }
        Format::TgiGenerate => {
            let one = |kept: &mut crate::record::KeptText, v: &Value| match v.get("token") {
                Some(t) => {
                    if t.get("special").and_then(Value::as_bool) != Some(true) {
                        push(kept, 0, t.get("text"));
                    }
                }
                None => push(kept, 0, v.get("generated_text")),
            };
            match &v {
                Value::Array(a) => a.iter().for_each(|x| one(kept, x)),
                _ => one(kept, &v),
            }
        }
        _ => {}
    }
}

pub fn interpret(format: Format, json: &[u8]) -> Option<EventInfo<'_>> {
    match format {
        Format::OpenAiChat
        | Format::OpenAiCompletions
        | Format::OpenAiEmbeddings
        | Format::Unknown => openai::interpret(format, json),
        Format::OpenAiResponses => openai::interpret_responses(json),
        Format::TgiGenerate => tgi::interpret(json),
        Format::OllamaChat | Format::OllamaGenerate => ollama::interpret(json),
        Format::LlamaCppCompletion => llamacpp::interpret(json),
        Format::TritonGenerate => triton::interpret(json),
        // Protobuf: `decode::grpc` reads these.
        Format::TritonGrpc | Format::VllmGrpc | Format::SglangGrpc => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_pick_formats() {
        assert_eq!(
            Format::from_path("/v1/chat/completions"),
            Format::OpenAiChat
        );
        assert_eq!(
            Format::from_path("/v1/completions?x=1"),
            Format::OpenAiCompletions
        );
        assert_eq!(
            Format::from_path("/v2/models/ensemble/generate_stream"),
            Format::TritonGenerate
        );
        assert_eq!(Format::from_path("/generate_stream"), Format::TgiGenerate);
        assert_eq!(Format::from_path("/completion"), Format::LlamaCppCompletion);
        assert_eq!(Format::from_path("/api/chat"), Format::OllamaChat);
        assert_eq!(Format::from_path("/v1/responses"), Format::OpenAiResponses);
        assert_eq!(Format::from_path("/metrics"), Format::Unknown);
        assert_eq!(Format::from_path("/"), Format::TgiGenerate);
    }

    #[test]
    fn request_info_reads_model_stream_and_prompt_size() {
        let r = request_info(br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"abcd"},{"role":"user","content":[{"type":"text","text":"efgh"}]}]}"#);
        assert_eq!(r.model.as_deref(), Some("m"));
        assert_eq!(r.stream, Some(true));
        assert_eq!(r.prompt_chars, Some(8));
        assert_eq!(request_info(b"not json"), RequestInfo::default());
        assert_eq!(r.user, None);
        assert!(!r.tools_offered);
    }

    #[test]
    fn request_info_reads_user_tools_and_asked_for_keys_only() {
        let body = br#"{"model":"m","user":"  team-a ","tools":[{"type":"function"}],"documents":["secret text"],"messages":[]}"#;
        let fields = ["documents".to_string(), "files".to_string()];
        let r = request_info_with(body, &fields);
        assert_eq!(r.user.as_deref(), Some("team-a"));
        assert!(r.tools_offered);
        assert_eq!(r.json_fields, vec!["documents".to_string()]);
        let r = request_info_with(br#"{"tools":[],"user":7}"#, &fields);
        assert!(!r.tools_offered, "an empty tools list offers nothing");
        assert_eq!(r.user, None, "a user that is not a string is absent");
        assert!(request_info_with(br#"{"functions":[{}]}"#, &[]).tools_offered);
        let long = format!(r#"{{"user":"{}"}}"#, "u".repeat(10_000));
        let r = request_info(long.as_bytes());
        assert!(r.user.unwrap().len() <= crate::identity::caller::MAX_TENANT_BYTES);
    }

    #[test]
    fn stage_sources_join_in_one_order_whatever_order_they_came_in() {
        let s = |src: StagesSource| Stages {
            prefill_us: Some(1),
            source: Some(src),
            ..Stages::default()
        };
        let mut a = s(StagesSource::TGI_HEADERS);
        a.merge(&s(StagesSource::OPENAI_USAGE));
        a.merge(&s(StagesSource::OLLAMA));
        a.merge(&s(StagesSource::OPENAI_USAGE));
        assert_eq!(
            a.source.map(|x| x.to_string()).as_deref(),
            Some("ollama+openai_usage+tgi_headers")
        );
        // A part that said nothing adds no source.
        a.merge(&Stages {
            source: Some(StagesSource::VLLM_METRICS),
            ..Stages::default()
        });
        assert_eq!(
            a.source,
            Some(StagesSource::OLLAMA | StagesSource::OPENAI_USAGE | StagesSource::TGI_HEADERS)
        );
    }

    #[test]
    fn tolerant_fields_read_odd_types_as_absent() {
        let n: Num = serde_json::from_str(r#"{"a":1}"#).unwrap();
        assert_eq!(n.0, None);
        let n: Num = serde_json::from_str("-3").unwrap();
        assert_eq!(n.0, None);
        let t: Text = serde_json::from_str("[1,2]").unwrap();
        assert!(!t.0);
        let l: Loose<'_> = serde_json::from_str("true").unwrap();
        assert!(l.0.is_none());
        let s: NonEmptySeq = serde_json::from_str("[{}]").unwrap();
        assert!(s.0);
    }
}
