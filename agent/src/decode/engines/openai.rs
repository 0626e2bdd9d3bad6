//! OpenAI-compatible APIs: chat completions, completions and embeddings
//! (the hot path: most engines speak it, and unknown endpoints are read
//! the same way), and the Responses API's typed events.
//!
//! Must not: build a vector or a string per event on the chat path
//! (`choices` is folded while parsing; strings borrow from the event).

use std::{borrow::Cow, marker::PhantomData};

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::{
    add, stronger, usage_into, Content, EventInfo, Format, Loose, NonEmptySeq, Text, Timings, Usage,
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
    model: Loose<'a>,
    #[serde(borrow)]
    choices: Option<Choices<'a>>,
    usage: Option<Usage>,
    timings: Option<Timings>,
    error: Option<IgnoredAny>,
}

/// OpenAI-compatible events (and unknown shapes, read the same way).
pub(super) fn interpret(format: Format, json: &[u8]) -> Option<EventInfo<'_>> {
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
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct IncompleteDetails<'a> {
    #[serde(borrow)]
    reason: Loose<'a>,
}

/// The `response` object of a Responses event; any other JSON type reads
/// as absent.
#[derive(Debug, Default)]
struct ResponseField<'a>(Option<ResponsesObj<'a>>);

impl<'de: 'a, 'a> Deserialize<'de> for ResponseField<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = ResponseField<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a response object")
            }
            fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<ResponseField<'a>, A::Error> {
                let o = ResponsesObj::deserialize(de::value::MapAccessDeserializer::new(m))?;
                Ok(ResponseField(Some(o)))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<ResponseField<'a>, E> {
                Ok(ResponseField(None))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<ResponseField<'a>, E> {
                Ok(ResponseField(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<ResponseField<'a>, E> {
                Ok(ResponseField(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<ResponseField<'a>, E> {
                Ok(ResponseField(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<ResponseField<'a>, E> {
                Ok(ResponseField(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<ResponseField<'a>, E> {
                Ok(ResponseField(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<ResponseField<'a>, A::Error> {
                while s.next_element::<IgnoredAny>()?.is_some() {}
                Ok(ResponseField(None))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
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
    response: ResponseField<'a>,
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
}
