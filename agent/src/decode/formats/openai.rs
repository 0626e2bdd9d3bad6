//! OpenAI-compatible APIs: chat completions, completions and embeddings
//! (the hot path: most engines speak it, and unknown endpoints are read
//! the same way), and the Responses API's typed events.
//!
//! Must not: build a vector or a string per event on the chat path
//! (`choices` is folded while parsing; strings borrow from the event).

use std::borrow::Cow;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::{
    add, stronger, usage_into, Content, EventInfo, Format, Loose, NonEmptySeq, Obj, Text, Timings,
    Usage, VllmMetrics,
};

/// A chat `delta` or `message` (Ollama's `message` has the same shape).
#[derive(Deserialize, Default, Debug)]
#[serde(default)]
pub(super) struct Delta {
    content: Text,
    reasoning_content: Text,
    reasoning: Text,
    thinking: Text,
    tool_calls: NonEmptySeq,
}

impl Delta {
    pub(super) fn kind(&self) -> Content {
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
    /// A choice called a tool (also when it carries answer text too).
    tool_calls: bool,
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
                    out.tool_calls |= [&ch.delta, &ch.message]
                        .iter()
                        .any(|d| d.as_ref().is_some_and(|d| d.tool_calls.0));
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

/// The fields OpenAI-compatible events use: the hot path (most engines
/// speak this), kept small so each event builds and drops little.
#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct OpenAiObj<'a> {
    #[serde(borrow)]
    id: Loose<'a>,
    #[serde(borrow)]
    model: Loose<'a>,
    #[serde(borrow)]
    choices: Option<Choices<'a>>,
    usage: Option<Usage>,
    timings: Obj<Timings>,
    metrics: Obj<VllmMetrics>,
    error: Option<IgnoredAny>,
}

/// Whether [`fast_chat_chunk`] is tried first (always, but for the decode
/// benchmark's side-by-side comparison with the serde-only path).
static FAST_PATH: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Turns the chat-chunk pre-scan on or off (for `decodebench`, which
/// measures both in one run).
pub fn set_fast_path(on: bool) {
    FAST_PATH.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Keys whose presence with any value but `null` needs the full parse.
const SLOW_KEYS: [&[u8]; 11] = [
    b"\"usage\"",
    b"\"metrics\"",
    b"\"tool_calls\"",
    b"\"reasoning_content\"",
    b"\"reasoning\"",
    b"\"thinking\"",
    b"\"error\"",
    b"\"timings\"",
    b"\"message\"",
    b"\"text\"",
    b"\"finish_reason\"",
];

/// The chat stream's common event, read without a JSON parser: one choice
/// whose `delta` has a non-empty string `content` (after at most a `role`),
/// every key in [`SLOW_KEYS`] absent or `null`, a plain `model` string.
/// Anything else — a role-only or final chunk, usage, tool calls,
/// reasoning, several choices, escapes in `model`, spaces after colons —
/// returns None and goes through serde. Gives what the serde path gives for
/// the events it accepts (a property test checks it).
///
/// One pass over the event's quotes: a key is only ever matched with its
/// quotes, and inside a JSON string a quote is escaped (`\"`), so
/// `"usage"` cannot come from a string's bytes.
fn fast_chat_chunk(json: &[u8]) -> Option<EventInfo<'_>> {
    if json.first() != Some(&b'{') || json.last() != Some(&b'}') {
        return None;
    }
    const DELTA: &[u8] = b"\"delta\":{";
    const MODEL: &[u8] = b"\"model\":";
    const ID: &[u8] = b"\"id\":";
    let (mut delta, mut model_at, mut id_at) = (None, None, None);
    for q in Quotes::new(json) {
        let rest = &json[q..];
        let Some(&c) = rest.get(1) else { break };
        if !matches!(c, b'd' | b'm' | b'u' | b't' | b'r' | b'e' | b'f' | b'i') {
            continue;
        }
        if rest.starts_with(DELTA) {
            if delta.replace(q + DELTA.len()).is_some() {
                return None; // several choices
            }
        } else if rest.starts_with(MODEL) {
            if model_at.replace(q + MODEL.len()).is_some() {
                return None;
            }
        } else if rest.starts_with(ID) {
            if id_at.replace(q + ID.len()).is_some() {
                return None;
            }
        } else if let Some(k) = SLOW_KEYS.iter().find(|k| rest.starts_with(k)) {
            if !rest[k.len()..].starts_with(b":null") {
                return None;
            }
        }
    }
    // `content` must be the delta's first key or follow a `role`, and be a
    // non-empty string: `"content":"` then anything but `"`.
    let inner = &json[delta?..];
    let inner = match inner.strip_prefix(b"\"role\":") {
        Some(r) => {
            let comma = memchr::memchr(b',', r)?;
            let role = &r[..comma];
            if role != b"null"
                && !(role.starts_with(b"\"") && role.ends_with(b"\"") && !role.contains(&b'\\'))
            {
                return None;
            }
            &r[comma + 1..]
        }
        None => inner,
    };
    let text = inner.strip_prefix(b"\"content\":\"")?;
    if text.first().is_none_or(|&b| b == b'"') {
        return None;
    }
    // A plain string value (an escape, or another type: serde reads it).
    let string_at = |at: Option<usize>| -> Option<Option<Cow<'_, str>>> {
        let Some(at) = at else { return Some(None) };
        let rest = json[at..].strip_prefix(b"\"")?;
        let end = memchr::memchr2(b'"', b'\\', rest)?;
        if rest[end] != b'"' {
            return None;
        }
        Some(Some(Cow::Borrowed(std::str::from_utf8(&rest[..end]).ok()?)))
    };
    Some(EventInfo {
        content: Content::Answer,
        content_parts: 1,
        model: string_at(model_at)?,
        response_id: string_at(id_at)?,
        ..EventInfo::default()
    })
}

/// The positions of `"` in a short slice, eight bytes at a time. A chat
/// chunk is ~150 bytes with ~25 quotes: a search call per quote
/// (`memchr_iter`) spent more time starting each search than searching.
struct Quotes<'a> {
    bytes: &'a [u8],
    /// Offset of the word in `mask`.
    at: usize,
    /// The high bit of each byte of the current word that is a quote and
    /// not yet returned.
    mask: u64,
}

impl<'a> Quotes<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        let mut q = Quotes {
            bytes,
            at: 0,
            mask: 0,
        };
        q.mask = q.word_mask(0);
        q
    }

    /// Quote bytes of the (zero-padded) word at `at`, as high bits. Exact
    /// per byte: `(x & 0x7f..) + 0x7f..` cannot carry into the next byte.
    #[inline]
    fn word_mask(&self, at: usize) -> u64 {
        const LO7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
        let w = match self.bytes.get(at..at + 8) {
            Some(w) => u64::from_le_bytes(w.try_into().unwrap()),
            None => {
                let mut pad = [0u8; 8];
                let tail = self.bytes.get(at..).unwrap_or_default();
                pad[..tail.len()].copy_from_slice(tail);
                u64::from_le_bytes(pad)
            }
        };
        let x = w ^ 0x2222_2222_2222_2222;
        !(((x & LO7) + LO7) | x | LO7)
    }
}

impl Iterator for Quotes<'_> {
    type Item = usize;
    #[inline]
    fn next(&mut self) -> Option<usize> {
        while self.mask == 0 {
            self.at += 8;
            if self.at >= self.bytes.len() {
                return None;
            }
            self.mask = self.word_mask(self.at);
        }
        let i = self.at + (self.mask.trailing_zeros() / 8) as usize;
        self.mask &= self.mask - 1;
        Some(i)
    }
}

/// OpenAI-compatible events (and unknown shapes, read the same way).
pub(super) fn interpret(format: Format, json: &[u8]) -> Option<EventInfo<'_>> {
    if format == Format::OpenAiChat && FAST_PATH.load(std::sync::atomic::Ordering::Relaxed) {
        if let Some(info) = fast_chat_chunk(json) {
            return Some(info);
        }
    }
    serde_interpret(format, json)
}

/// [`interpret`] by a full parse.
fn serde_interpret(format: Format, json: &[u8]) -> Option<EventInfo<'_>> {
    let o: OpenAiObj<'_> = serde_json::from_slice(json).ok()?;
    let mut info = EventInfo {
        model: o.model.0,
        response_id: o.id.0,
        error: o.error.is_some(),
        ..EventInfo::default()
    };
    if let Some(u) = &o.usage {
        usage_into(u, &mut info);
    }

    if let Some(ch) = o.choices {
        info.tool_calls = ch.tool_calls;
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
    if let Some(t) = &o.timings.0 {
        if info.input_tokens.is_none() {
            info.input_tokens = t.input_tokens();
        }
        if info.output_tokens.is_none() {
            info.output_tokens = t.predicted_n.0;
        }
        info.stages.merge(&t.stages());
    }
    if let Some(m) = &o.metrics.0 {
        info.stages.merge(&m.stages());
    }
    if format == Format::Unknown && info.content == Content::None {
        // Unknown shapes: every event is a chunk; tokens unknown.
        add(&mut info, Content::Answer);
        info.input_tokens = None;
        info.output_tokens = None;
    }

    Some(info)
}

// --- Responses API (`/v1/responses`) ---

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
    metrics: Obj<VllmMetrics>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct IncompleteDetails<'a> {
    #[serde(borrow)]
    reason: Loose<'a>,
}

/// One Responses API stream event (`type` says which), or a whole
/// non-streamed response object.
#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct ResponsesEvent<'a> {
    #[serde(borrow)]
    model: Loose<'a>,
    #[serde(borrow)]
    model_name: Loose<'a>,
    usage: Option<Usage>,
    #[serde(rename = "type", borrow)]
    kind: Loose<'a>,
    delta: Text,
    #[serde(borrow)]
    response: Obj<ResponsesObj<'a>>,
    metrics: Obj<VllmMetrics>,
    error: Option<IgnoredAny>,
}

/// Responses API events: `*.delta` events carry content; the
/// `response.completed` / `.incomplete` / `.failed` events (and a whole
/// non-streamed body, which has no `type`) carry usage and the outcome.
pub(super) fn interpret_responses(json: &[u8]) -> Option<EventInfo<'_>> {
    let o: ResponsesEvent<'_> = serde_json::from_slice(json).ok()?;
    let mut info = super::common(o.model, o.model_name, o.usage.as_ref(), o.error.is_some());
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
    if let Some(r) = o.response.0 {
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
        if let Some(m) = &r.metrics.0 {
            info.stages.merge(&m.stages());
        }
    }
    if let Some(m) = &o.metrics.0 {
        info.stages.merge(&m.stages());
    }
    if kind == "error" {
        info.error = true;
    }
    Some(info)
}

#[cfg(test)]
mod tests {
    use super::super::interpret as interpret_any;
    use super::*;
    use crate::vocab::StagesSource;

    #[test]
    fn role_only_and_empty_chunks_are_not_content() {
        let e = interpret_any(
            Format::OpenAiChat,
            br#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
        )
        .unwrap();
        assert_eq!(e.content, Content::None);
        let e = interpret_any(
            Format::OpenAiChat,
            br#"{"choices":[{"delta":{"content":"Hi"}}],"model":"m"}"#,
        )
        .unwrap();
        assert_eq!(e.content, Content::Answer);
        assert_eq!(e.model.as_deref(), Some("m"));
    }

    #[test]
    fn vllms_per_request_metrics_give_the_engines_stages() {
        // vLLM's final usage chunk with `--enable-per-request-metrics`
        // (the shape in its docs/features/per_request_metrics.md).
        let e = interpret_any(
            Format::OpenAiChat,
            br#"{"id":"chatcmpl-abc123","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":42,"completion_tokens":128,"total_tokens":170,"prompt_tokens_details":{"cached_tokens":32}},"metrics":{"time_to_first_token_ms":85.2,"generation_time_ms":1240.5,"queue_time_ms":12.3,"mean_itl_ms":9.1,"tokens_per_second":103.2}}"#,
        )
        .unwrap();
        assert_eq!(e.stages.engine_queue_us, Some(12_300));
        assert_eq!(e.stages.prefill_us, Some(85_200));
        assert_eq!(e.stages.decode_us, Some(1_240_500));
        assert_eq!(e.stages.cached_input_tokens, Some(32));
        assert_eq!(
            e.stages.source,
            Some(StagesSource::OPENAI_USAGE | StagesSource::VLLM_METRICS)
        );
        assert_eq!(e.output_tokens, Some(128));
        // A whole completion, and a Responses API final event.
        let e = interpret_any(
            Format::OpenAiCompletions,
            br#"{"choices":[{"text":"hi","finish_reason":"stop"}],"metrics":{"time_to_first_token_ms":5,"generation_time_ms":null,"queue_time_ms":0.5}}"#,
        )
        .unwrap();
        assert_eq!(
            (
                e.stages.engine_queue_us,
                e.stages.prefill_us,
                e.stages.decode_us
            ),
            (Some(500), Some(5_000), None)
        );
        let e = interpret_any(
            Format::OpenAiResponses,
            br#"{"type":"response.completed","response":{"status":"completed","usage":{"input_tokens":3,"output_tokens":4},"metrics":{"time_to_first_token_ms":7.5,"generation_time_ms":30,"queue_time_ms":1}}}"#,
        )
        .unwrap();
        assert_eq!(e.stages.prefill_us, Some(7_500));
        assert_eq!(e.stages.source, Some(StagesSource::VLLM_METRICS));
        // All null (the timing data was not available), or suppressed (n > 1).
        for json in [
            &br#"{"choices":[],"usage":{"completion_tokens":2},"metrics":{"time_to_first_token_ms":null,"generation_time_ms":null,"queue_time_ms":null}}"#[..],
            br#"{"choices":[],"usage":{"completion_tokens":2},"metrics":null}"#,
        ] {
            let e = interpret_any(Format::OpenAiChat, json).unwrap();
            assert!(e.stages.is_empty(), "{}", String::from_utf8_lossy(json));
            assert_eq!(e.output_tokens, Some(2));
        }
    }

    #[test]
    fn a_metrics_or_timings_key_holding_something_else_hides_nothing() {
        // Another server's `metrics` / `timings` that are not vLLM's or
        // llama.cpp's objects: the event still reads, with no stages.
        for json in [
            &br#"{"choices":[{"delta":{"content":"Hi"}}],"metrics":"on"}"#[..],
            br#"{"choices":[{"delta":{"content":"Hi"}}],"metrics":[1,2]}"#,
            br#"{"choices":[{"delta":{"content":"Hi"}}],"timings":42}"#,
            br#"{"choices":[{"delta":{"content":"Hi"}}],"metrics":{"queue_time_ms":"slow"}}"#,
        ] {
            let e = interpret_any(Format::OpenAiChat, json).unwrap();
            assert_eq!(
                e.content,
                Content::Answer,
                "{}",
                String::from_utf8_lossy(json)
            );
            assert!(e.stages.is_empty(), "{}", String::from_utf8_lossy(json));
        }
    }

    #[test]
    fn odd_field_types_do_not_hide_the_rest() {
        let e = interpret_any(Format::OpenAiChat, br#"{"choices":[{"delta":{"content":["x"],"reasoning_content":"r"}}],"usage":{"prompt_tokens":"7","completion_tokens":3}}"#).unwrap();
        assert_eq!(e.content, Content::Reasoning);
        assert_eq!(e.output_tokens, Some(3));
        assert_eq!(e.input_tokens, None);
    }

    #[test]
    fn n_choices_count_as_parts_and_tool_calls_outrank_reasoning() {
        let e = interpret_any(
            Format::OpenAiCompletions,
            br#"{"choices":[{"index":0,"text":"a"},{"index":1,"text":"b","finish_reason":"length"}]}"#,
        )
        .unwrap();
        assert_eq!((e.content, e.content_parts), (Content::Answer, 2));
        assert_eq!(e.finish_reason.as_deref(), Some("length"));
        let e = interpret_any(
            Format::OpenAiChat,
            br#"{"choices":[{"delta":{"reasoning":"r","tool_calls":[{"index":0}]}}]}"#,
        )
        .unwrap();
        assert_eq!(e.content, Content::Tool);
    }

    #[test]
    fn llamacpp_timings_stand_in_for_missing_usage() {
        let e = interpret_any(
            Format::OpenAiChat,
            br#"{"choices":[],"timings":{"prompt_n":4,"predicted_n":9}}"#,
        )
        .unwrap();
        assert_eq!((e.input_tokens, e.output_tokens), (Some(4), Some(9)));
        // Answered from the prompt cache (a multi-turn chat): the same
        // chunk's usage, when asked for, says 13 = 8 evaluated + 5 cached
        // (the next test's real chunk).
        let e = interpret_any(
            Format::OpenAiChat,
            br#"{"choices":[],"timings":{"cache_n":5,"prompt_n":8,"predicted_n":8}}"#,
        )
        .unwrap();
        assert_eq!(e.input_tokens, Some(13));
        assert_eq!(e.stages.cached_input_tokens, Some(5));
    }

    #[test]
    fn llamacpp_timings_and_cached_tokens_give_the_engines_stages() {
        // llama-server's last chat chunk: usage (asked for) and timings.
        let e = interpret_any(
            Format::OpenAiChat,
            br#"{"choices":[],"created":1,"id":"chatcmpl-x","model":"m","object":"chat.completion.chunk","usage":{"completion_tokens":8,"prompt_tokens":13,"total_tokens":21,"prompt_tokens_details":{"cached_tokens":5}},"timings":{"cache_n":5,"prompt_n":8,"prompt_ms":3.21,"prompt_per_token_ms":0.4,"prompt_per_second":2492.2,"predicted_n":8,"predicted_ms":41.02,"predicted_per_token_ms":5.1,"predicted_per_second":195.0}}"#,
        )
        .unwrap();
        assert_eq!(e.stages.prefill_us, Some(3_210));
        assert_eq!(e.stages.decode_us, Some(41_020));
        assert_eq!(e.stages.cached_input_tokens, Some(5));
        assert_eq!(
            e.stages.source,
            Some(StagesSource::LLAMACPP_TIMINGS | StagesSource::OPENAI_USAGE)
        );
        // vLLM/OpenAI: cached tokens only.
        let e = interpret_any(
            Format::OpenAiCompletions,
            br#"{"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":16}}}"#,
        )
        .unwrap();
        assert_eq!(e.stages.cached_input_tokens, Some(16));
        assert_eq!(
            (e.stages.prefill_us, e.stages.source),
            (None, Some(StagesSource::OPENAI_USAGE))
        );
        // Responses API.
        let e = interpret_responses(br#"{"type":"response.completed","response":{"model":"m","status":"completed","usage":{"input_tokens":5,"output_tokens":7,"input_tokens_details":{"cached_tokens":4}}}}"#).unwrap();
        assert_eq!(e.stages.cached_input_tokens, Some(4));
        // Nothing said, nothing reported.
        let e = interpret_any(
            Format::OpenAiChat,
            br#"{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#,
        )
        .unwrap();
        assert!(e.stages.is_empty());
    }

    #[test]
    fn unknown_endpoints_count_every_event_as_a_chunk_without_tokens() {
        let e = interpret_any(Format::Unknown, br#"{"usage":{"completion_tokens":3}}"#).unwrap();
        assert_eq!((e.content, e.content_parts), (Content::Answer, 1));
        assert_eq!(e.output_tokens, None);
        assert!(interpret_any(Format::Unknown, b"not json").is_none());
    }

    #[test]
    fn responses_deltas_are_typed_and_the_completed_event_carries_usage() {
        let r = |j: &'static [u8]| interpret_any(Format::OpenAiResponses, j).unwrap();
        assert_eq!(
            r(br#"{"type":"response.output_text.delta","delta":"Hi"}"#).content,
            Content::Answer
        );
        assert_eq!(
            r(br#"{"type":"response.reasoning_summary_text.delta","delta":"h"}"#).content,
            Content::Reasoning
        );
        assert_eq!(
            r(br#"{"type":"response.function_call_arguments.delta","delta":"{"}"#).content,
            Content::Tool
        );
        let done = r(br#"{"type":"response.completed","response":{"model":"m","status":"completed","usage":{"input_tokens":5,"output_tokens":7}}}"#);
        assert_eq!(done.model.as_deref(), Some("m"));
        assert_eq!(done.finish_reason.as_deref(), Some("completed"));
        assert_eq!((done.input_tokens, done.output_tokens), (Some(5), Some(7)));
        assert!(!done.error);
        let cut = r(br#"{"type":"response.incomplete","response":{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"}}}"#);
        assert_eq!(cut.finish_reason.as_deref(), Some("max_output_tokens"));
        assert!(r(br#"{"type":"response.failed","response":{"status":"failed"}}"#).error);
        assert!(r(br#"{"type":"error","message":"x"}"#).error);
        // A `response` of another type reads as absent.
        assert_eq!(
            r(br#"{"type":"response.completed","response":7}"#).finish_reason,
            None
        );
    }

    use proptest::prelude::*;

    proptest! {
        /// The word-at-a-time scan finds exactly the quotes a byte loop
        /// finds, whatever the length and whatever high bytes surround them.
        #[test]
        fn quotes_are_found_exactly(bytes in proptest::collection::vec(
            prop_oneof![Just(b'"'), Just(b'"' | 0x80), Just(0u8), Just(0x21u8), Just(0x23u8), any::<u8>()],
            0..80,
        )) {
            let want: Vec<usize> = bytes.iter().enumerate().filter(|(_, &b)| b == b'"').map(|(i, _)| i).collect();
            prop_assert_eq!(Quotes::new(&bytes).collect::<Vec<_>>(), want);
        }
    }

    /// A chat chunk built from parts engines use; all valid JSON.
    fn chunk() -> impl Strategy<Value = String> {
        let s = || {
            prop_oneof![
                Just(String::new()),
                "[a-zA-Z0-9 ,.!-]{1,12}",
                Just("line\\nbreak".to_string()),
                Just("quote \\\"usage\\\":1 inside".to_string()),
                Just("}{\\\"delta\\\":{".to_string()),
                Just("ночь \\u00e9".to_string()),
            ]
        };
        let opt_null = |v: BoxedStrategy<String>| {
            prop_oneof![Just(None), Just(Some("null".to_string())), v.prop_map(Some)]
        };
        (
            prop_oneof![
                Just(None),
                s().prop_map(Some),
                Just(Some("a\\/b".to_string()))
            ],
            prop_oneof![Just(None), Just(Some("\"assistant\"")), Just(Some("null"))],
            opt_null(s().prop_map(|c| format!("\"{c}\"")).boxed()),
            opt_null(
                Just("[{\"index\":0,\"function\":{\"arguments\":\"{}\"}}]".to_string()).boxed(),
            ),
            opt_null(s().prop_map(|c| format!("\"{c}\"")).boxed()),
            opt_null(Just("\"stop\"".to_string()).boxed()),
            opt_null(Just("{\"prompt_tokens\":3,\"completion_tokens\":2}".to_string()).boxed()),
            opt_null(Just("{\"content\":[{\"token\":\"x\",\"logprob\":-1}]}".to_string()).boxed()),
            1..3usize,
            any::<bool>(),
        )
            .prop_map(
                |(model, role, content, tools, reasoning, finish, usage, logprobs, n, spaced)| {
                    let colon = if spaced { ": " } else { ":" };
                    let mut delta = vec![];
                    if let Some(r) = role {
                        delta.push(format!("\"role\"{colon}{r}"));
                    }
                    if let Some(c) = &content {
                        delta.push(format!("\"content\"{colon}{c}"));
                    }
                    if let Some(t) = &tools {
                        delta.push(format!("\"tool_calls\"{colon}{t}"));
                    }
                    if let Some(r) = &reasoning {
                        delta.push(format!("\"reasoning_content\"{colon}{r}"));
                    }
                    let mut choice = vec![
                        format!("\"index\"{colon}0"),
                        format!("\"delta\"{colon}{{{}}}", delta.join(",")),
                    ];
                    if let Some(l) = &logprobs {
                        choice.push(format!("\"logprobs\"{colon}{l}"));
                    }
                    if let Some(f) = &finish {
                        choice.push(format!("\"finish_reason\"{colon}{f}"));
                    }
                    let choices = vec![format!("{{{}}}", choice.join(",")); n];
                    let mut top = vec![format!("\"id\"{colon}\"c1\"")];
                    if let Some(m) = &model {
                        top.push(format!("\"model\"{colon}\"{m}\""));
                    }
                    top.push(format!("\"choices\"{colon}[{}]", choices.join(",")));
                    if let Some(u) = &usage {
                        top.push(format!("\"usage\"{colon}{u}"));
                    }
                    format!("{{{}}}", top.join(","))
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]
        /// Whatever the pre-scan accepts, it reads as the full parse does.
        #[test]
        fn the_pre_scan_agrees_with_the_full_parse(json in chunk()) {
            let full = serde_interpret(Format::OpenAiChat, json.as_bytes());
            prop_assert!(full.is_some(), "the generator makes valid JSON: {json}");
            if let Some(fast) = fast_chat_chunk(json.as_bytes()) {
                prop_assert_eq!(Some(fast), full, "{}", json);
            }
        }
    }

    #[test]
    fn the_pre_scan_takes_the_engines_common_chunks() {
        for json in [
            // vLLM
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" keeper"},"logprobs":null,"finish_reason":null}]}"#,
            // SGLang
            r#"{"id":"1","object":"chat.completion.chunk","created":1,"model":"qwen","choices":[{"index":0,"delta":{"role":null,"content":" world","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}"#,
            // llama-server
            r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Hi"}}],"created":1,"id":"chatcmpl-x","model":"gpt-3.5-turbo","system_fingerprint":"b1","object":"chat.completion.chunk"}"#,
        ] {
            let fast =
                fast_chat_chunk(json.as_bytes()).unwrap_or_else(|| panic!("not taken: {json}"));
            assert_eq!(
                Some(fast),
                serde_interpret(Format::OpenAiChat, json.as_bytes())
            );
        }
        // Role-only, final and usage chunks go through the full parse.
        for json in [
            r#"{"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
            r#"{"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
            r#"{"model":"m","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#,
        ] {
            assert!(fast_chat_chunk(json.as_bytes()).is_none(), "{json}");
        }
    }
}
