//! Engine wire formats: which endpoint speaks which format, what counts as
//! generated content in each stream event, and where each engine reports
//! usage, model and finish reason. One table-driven place, so adding an
//! engine is adding a `Format` and its arm here.

use std::borrow::Cow;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

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
    Unknown,
}

impl Format {
    pub fn from_path(path: &str) -> Format {
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
        } else if p == "/generate" || p == "/generate_stream" {
            Format::TgiGenerate
        } else if p == "/completion" {
            Format::LlamaCppCompletion
        } else {
            Format::Unknown
        }
    }

    /// gen_ai.operation.name for this API.
    pub fn operation(self) -> Option<&'static str> {
        Some(match self {
            Format::OpenAiChat | Format::OllamaChat => "chat",
            Format::OpenAiCompletions | Format::LlamaCppCompletion => "text_completion",
            Format::OpenAiEmbeddings => "embeddings",
            Format::OpenAiResponses => "responses",
            Format::TgiGenerate | Format::OllamaGenerate | Format::TritonGenerate => "generate",
            Format::Unknown => return None,
        })
    }

    /// The engine, when the API alone says which it is.
    pub fn provider(self) -> Option<&'static str> {
        match self {
            Format::TgiGenerate => Some("tgi"),
            Format::OllamaChat | Format::OllamaGenerate => Some("ollama"),
            Format::LlamaCppCompletion => Some("llama.cpp"),
            Format::TritonGenerate => Some("triton"),
            _ => None,
        }
    }
}

/// The engine named by a `Server` response header, if any.
pub fn provider_from_server_header(server: &str) -> Option<&'static str> {
    let s = server.to_ascii_lowercase();
    if s.contains("llama.cpp") {
        Some("llama.cpp")
    } else if s.contains("ollama") {
        Some("ollama")
    } else if s.contains("text-generation-inference") {
        Some("tgi")
    } else {
        None
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
    let Ok(Value::Object(o)) = serde_json::from_slice::<Value>(body) else {
        return RequestInfo::default();
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
    pub finish_reason: Option<Cow<'a, str>>,
    /// The event reports an error (an `error` object, a failed response).
    pub error: bool,
    /// The engine's own end-of-stream event (Ollama `done: true`, llama.cpp
    /// `stop: true`); OpenAI's `data: [DONE]` is seen by the SSE layer.
    pub end_of_stream: bool,
}

impl Default for EventInfo<'_> {
    fn default() -> Self {
        Self {
            content: Content::None,
            content_parts: 0,
            model: None,
            input_tokens: None,
            output_tokens: None,
            finish_reason: None,
            error: false,
            end_of_stream: false,
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
struct Delta {
    content: Text,
    reasoning_content: Text,
    reasoning: Text,
    thinking: Text,
    tool_calls: NonEmptySeq,
}

impl Delta {
    fn kind(&self) -> Content {
        if self.content.0 {
            Content::Answer
        } else if self.tool_calls.0 {
            Content::Tool
        } else if self.reasoning_content.0 || self.reasoning.0 || self.thinking.0 {
            Content::Reasoning
        } else {
            Content::None
        }
    }
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct Choice<'a> {
    delta: Option<Delta>,
    message: Option<Delta>,
    text: Text,
    #[serde(borrow)]
    finish_reason: Loose<'a>,
}

/// `choices`, folded while parsing (no vector is built).
#[derive(Debug, Default)]
struct Choices<'a> {
    content: Content,
    parts: u32,
    finish_reason: Option<Cow<'a, str>>,
}

impl<'de: 'a, 'a> Deserialize<'de> for Choices<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Choices<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an array of choices")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Choices<'a>, A::Error> {
                let mut out = Choices::default();
                while let Some(ch) = s.next_element::<Choice<'a>>()? {
                    let mut c = ch
                        .delta
                        .as_ref()
                        .or(ch.message.as_ref())
                        .map(Delta::kind)
                        .unwrap_or(Content::None);
                    if ch.text.0 {
                        c = stronger(c, Content::Answer);
                    }
                    if c != Content::None {
                        out.content = stronger(out.content, c);
                        out.parts += 1;
                    }
                    if ch.finish_reason.0.is_some() {
                        out.finish_reason = ch.finish_reason.0;
                    }
                }
                Ok(out)
            }
            ignore_others!(Choices<'a>, Choices::default());
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Choices<'a>, E> {
                Ok(Choices::default())
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct Usage {
    prompt_tokens: Num,
    completion_tokens: Num,
    input_tokens: Num,
    output_tokens: Num,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct Timings {
    prompt_n: Num,
    predicted_n: Num,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct TgiToken {
    text: Text,
    special: Option<bool>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct TgiDetails<'a> {
    #[serde(borrow)]
    finish_reason: Loose<'a>,
    generated_tokens: Num,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct ResponsesObj<'a> {
    #[serde(borrow)]
    model: Loose<'a>,
    #[serde(borrow)]
    status: Loose<'a>,
    usage: Option<Usage>,
    #[serde(borrow)]
    incomplete_details: Option<IncompleteDetails<'a>>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct IncompleteDetails<'a> {
    #[serde(borrow)]
    reason: Loose<'a>,
}

/// `response` is a string in Ollama's /api/generate and an object in the
/// Responses API.
#[derive(Debug, Default)]
enum StrOrResponse<'a> {
    #[default]
    Absent,
    Str(bool),
    Obj(Box<ResponsesObj<'a>>),
}

impl<'de: 'a, 'a> Deserialize<'de> for StrOrResponse<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = StrOrResponse<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or an object")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<StrOrResponse<'a>, E> {
                Ok(StrOrResponse::Str(!v.is_empty()))
            }
            fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<StrOrResponse<'a>, A::Error> {
                let o = ResponsesObj::deserialize(de::value::MapAccessDeserializer::new(m))?;
                Ok(StrOrResponse::Obj(Box::new(o)))
            }
            fn visit_unit<E: de::Error>(self) -> Result<StrOrResponse<'a>, E> {
                Ok(StrOrResponse::Absent)
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// The union of the fields every supported engine uses in a stream event
/// or body; unknown fields are skipped without being built.
#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct Obj<'a> {
    #[serde(borrow)]
    model: Loose<'a>,
    #[serde(borrow)]
    model_name: Loose<'a>,
    usage: Option<Usage>,
    timings: Option<Timings>,
    // Responses API
    #[serde(rename = "type", borrow)]
    kind: Loose<'a>,
    delta: Text,
    #[serde(borrow)]
    response: StrOrResponse<'a>,
    // Ollama
    message: Option<Delta>,
    thinking: Text,
    done: Option<bool>,
    #[serde(borrow)]
    done_reason: Loose<'a>,
    prompt_eval_count: Num,
    eval_count: Num,
    // TGI
    token: Option<TgiToken>,
    generated_text: Text,
    #[serde(borrow)]
    details: Option<TgiDetails<'a>>,
    // llama.cpp /completion
    content: Text,
    stop: Option<bool>,
    tokens_predicted: Num,
    tokens_evaluated: Num,
    #[serde(borrow)]
    stop_type: Loose<'a>,
    // Triton
    text_output: Text,
    // errors
    error: Option<IgnoredAny>,
}

/// The fields OpenAI-compatible events use: the hot path (most engines
/// speak this), kept small so each event builds and drops little.
#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct OpenAiObj<'a> {
    #[serde(borrow)]
    model: Loose<'a>,
    #[serde(borrow)]
    choices: Option<Choices<'a>>,
    usage: Option<Usage>,
    timings: Option<Timings>,
    error: Option<IgnoredAny>,
}

/// OpenAI-compatible events (and unknown shapes, read the same way).
fn interpret_openai(format: Format, json: &[u8]) -> Option<EventInfo<'_>> {
    let o: OpenAiObj<'_> = serde_json::from_slice(json).ok()?;
    let mut info = EventInfo {
        model: o.model.0,
        error: o.error.is_some(),
        ..EventInfo::default()
    };
    if let Some(u) = &o.usage {
        usage_into(u, &mut info);
    }

    if let Some(ch) = o.choices {
        if ch.content != Content::None {
            info.content = ch.content;
            info.content_parts = ch.parts;
        }
        if ch.finish_reason.is_some() {
            info.finish_reason = ch.finish_reason;
        }
    }
    // llama.cpp's server puts its counts in `timings` when the
    // client did not ask for usage.
    if let Some(t) = &o.timings {
        if info.input_tokens.is_none() {
            info.input_tokens = t.prompt_n.0;
        }
        if info.output_tokens.is_none() {
            info.output_tokens = t.predicted_n.0;
        }
    }
    if format == Format::Unknown && info.content == Content::None {
        // Unknown shapes: every event is a chunk; tokens unknown.
        add(&mut info, Content::Answer);
        info.input_tokens = None;
        info.output_tokens = None;
    }

    Some(info)
}

fn usage_into(u: &Usage, info: &mut EventInfo<'_>) {
    if let Some(n) = u.prompt_tokens.0.or(u.input_tokens.0) {
        info.input_tokens = Some(n);
    }
    if let Some(n) = u.completion_tokens.0.or(u.output_tokens.0) {
        info.output_tokens = Some(n);
    }
}

fn stronger(a: Content, b: Content) -> Content {
    // Answer/tool content outranks reasoning for an event carrying both.
    match (a, b) {
        (Content::None, x) | (x, Content::None) => x,
        (Content::Reasoning, x) => x,
        (x, _) => x,
    }
}

fn add(info: &mut EventInfo<'_>, c: Content) {
    if c != Content::None {
        info.content = stronger(info.content, c);
        info.content_parts += 1;
    }
}

/// Interprets one stream event (or a whole non-streamed body) of `format`.
/// `None` when the bytes are not a JSON object at all.
pub fn interpret(format: Format, json: &[u8]) -> Option<EventInfo<'_>> {
    if matches!(
        format,
        Format::OpenAiChat | Format::OpenAiCompletions | Format::OpenAiEmbeddings | Format::Unknown
    ) {
        return interpret_openai(format, json);
    }
    let o: Obj<'_> = serde_json::from_slice(json).ok()?;
    let mut info = EventInfo {
        model: o.model.0.or(o.model_name.0),
        error: o.error.is_some(),
        ..EventInfo::default()
    };
    if let Some(u) = &o.usage {
        usage_into(u, &mut info);
    }
    match format {
        Format::OpenAiChat
        | Format::OpenAiCompletions
        | Format::OpenAiEmbeddings
        | Format::Unknown => unreachable!("read by interpret_openai"),
        Format::OpenAiResponses => {
            let kind = o.kind.0.as_deref().unwrap_or("");
            if o.delta.0 {
                let c = match kind {
                    "response.output_text.delta" | "response.refusal.delta" => Content::Answer,
                    "response.function_call_arguments.delta" => Content::Tool,
                    k if k.starts_with("response.reasoning") => Content::Reasoning,
                    _ => Content::None,
                };
                add(&mut info, c);
            }
            if let StrOrResponse::Obj(r) = o.response {
                let r = *r;
                if let Some(u) = &r.usage {
                    usage_into(u, &mut info);
                }
                if matches!(
                    kind,
                    "response.completed" | "response.incomplete" | "response.failed"
                ) || kind.is_empty()
                {
                    info.finish_reason = r
                        .incomplete_details
                        .and_then(|d| d.reason.0)
                        .or_else(|| r.status.0.clone());
                }
                if kind == "response.failed" || r.status.0.as_deref() == Some("failed") {
                    info.error = true;
                }
                if info.model.is_none() {
                    info.model = r.model.0;
                }
            }
            if kind == "error" {
                info.error = true;
            }
        }
        Format::TgiGenerate => {
            if let Some(t) = &o.token {
                if t.text.0 && t.special != Some(true) {
                    add(&mut info, Content::Answer);
                }
            } else if o.generated_text.0 {
                add(&mut info, Content::Answer); // non-streamed /generate
            }
            if let Some(d) = o.details {
                info.finish_reason = d.finish_reason.0;
                info.output_tokens = d.generated_tokens.0;
            }
        }
        Format::OllamaChat | Format::OllamaGenerate => {
            if let Some(m) = &o.message {
                add(&mut info, m.kind());
            }
            if let StrOrResponse::Str(true) = o.response {
                add(&mut info, Content::Answer);
            }
            if o.thinking.0 {
                add(&mut info, Content::Reasoning);
            }
            if o.done == Some(true) {
                info.end_of_stream = true;
                info.finish_reason = o.done_reason.0;
                info.input_tokens = o.prompt_eval_count.0;
                info.output_tokens = o.eval_count.0;
            }
        }
        Format::LlamaCppCompletion => {
            if o.content.0 {
                add(&mut info, Content::Answer);
            }
            if o.stop == Some(true) {
                info.end_of_stream = true;
                info.finish_reason = o.stop_type.0;
                info.output_tokens = o
                    .tokens_predicted
                    .0
                    .or(o.timings.as_ref().and_then(|t| t.predicted_n.0));
                info.input_tokens = o
                    .tokens_evaluated
                    .0
                    .or(o.timings.as_ref().and_then(|t| t.prompt_n.0));
            }
        }
        Format::TritonGenerate => {
            if o.text_output.0 {
                add(&mut info, Content::Answer);
            }
        }
    }
    Some(info)
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
        assert_eq!(Format::from_path("/metrics"), Format::Unknown);
    }

    #[test]
    fn role_only_and_empty_chunks_are_not_content() {
        let e = interpret(
            Format::OpenAiChat,
            br#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
        )
        .unwrap();
        assert_eq!(e.content, Content::None);
        let e = interpret(
            Format::OpenAiChat,
            br#"{"choices":[{"delta":{"content":"Hi"}}],"model":"m"}"#,
        )
        .unwrap();
        assert_eq!(e.content, Content::Answer);
        assert_eq!(e.model.as_deref(), Some("m"));
    }

    #[test]
    fn odd_field_types_do_not_hide_the_rest() {
        let e = interpret(Format::OpenAiChat, br#"{"choices":[{"delta":{"content":["x"],"reasoning_content":"r"}}],"usage":{"prompt_tokens":"7","completion_tokens":3}}"#).unwrap();
        assert_eq!(e.content, Content::Reasoning);
        assert_eq!(e.output_tokens, Some(3));
        assert_eq!(e.input_tokens, None);
    }

    #[test]
    fn request_info_reads_model_stream_and_prompt_size() {
        let r = request_info(br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"abcd"},{"role":"user","content":[{"type":"text","text":"efgh"}]}]}"#);
        assert_eq!(r.model.as_deref(), Some("m"));
        assert_eq!(r.stream, Some(true));
        assert_eq!(r.prompt_chars, Some(8));
        assert_eq!(request_info(b"not json"), RequestInfo::default());
    }
}
