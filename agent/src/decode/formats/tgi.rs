//! Hugging Face text-generation-inference: `/generate` (one JSON body with
//! `generated_text`) and `/generate_stream` (SSE events with one `token`
//! each; the last carries `details`).

use serde::Deserialize;

use super::{add, Content, EventInfo, Loose, Num, Stages, Text};
use crate::vocab::StagesSource;

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct Token {
    text: Text,
    special: Option<bool>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct Details<'a> {
    #[serde(borrow)]
    finish_reason: Loose<'a>,
    generated_tokens: Num,
}

family_event!(TgiEvent {
    token: Option<Token>,
    generated_text: Text,
    #[serde(borrow)]
    details: Option<Details<'a>>,
});

/// A stream event's token is content unless it is a special token; a
/// non-streamed body's `generated_text` is one content part.
pub(super) fn interpret(json: &[u8]) -> Option<EventInfo<'_>> {
    let mut o: TgiEvent<'_> = serde_json::from_slice(json).ok()?;
    let mut info = o.common_info();
    if let Some(t) = &o.token {
        if t.text.0 && t.special != Some(true) {
            add(&mut info, Content::Answer);
        }
    } else if o.generated_text.0 {
        add(&mut info, Content::Answer);
    }
    if let Some(d) = o.details {
        info.finish_reason = d.finish_reason.0;
        info.output_tokens = d.generated_tokens.0;
    }
    Some(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_tokens_are_not_content_and_details_end_the_stream() {
        let e = interpret(br#"{"token":{"id":1,"text":"Hi","special":false}}"#).unwrap();
        assert_eq!((e.content, e.content_parts), (Content::Answer, 1));
        let e = interpret(br#"{"token":{"id":2,"text":"</s>","special":true},"generated_text":"Hi","details":{"finish_reason":"eos_token","generated_tokens":2}}"#).unwrap();
        assert_eq!(e.content, Content::None);
        assert_eq!(e.finish_reason.as_deref(), Some("eos_token"));
        assert_eq!(e.output_tokens, Some(2));
    }

    #[test]
    fn a_whole_generate_body_is_one_content_part() {
        let e = interpret(br#"{"generated_text":"Hello"}"#).unwrap();
        assert_eq!((e.content, e.content_parts), (Content::Answer, 1));
        assert!(interpret(b"not json").is_none());
    }
}

/// TGI's timing response headers (`/generate`, `/generate_stream`): its
/// router's `x-queue-time` (milliseconds waiting for a batch slot) is the
/// engine queue. `x-inference-time` is prefill and decode together (and
/// `x-time-per-token` that divided by the tokens): TGI does not split
/// them, so neither is reported.
pub fn tgi_header_stages(header: &dyn Fn(&str) -> Option<String>) -> Stages {
    match header("x-queue-time").and_then(|v| v.trim().parse::<u64>().ok()) {
        Some(ms) => Stages {
            engine_queue_us: Some(ms.saturating_mul(1000)),
            source: Some(StagesSource::TGI_HEADERS),
            ..Stages::default()
        },
        None => Stages::default(),
    }
}

#[cfg(test)]
mod header_tests {
    use super::*;

    #[test]
    fn tgi_headers_give_the_queue_time() {
        let h = |n: &str| match n {
            "x-queue-time" => Some("12".to_string()),
            "x-inference-time" => Some("250".to_string()),
            _ => None,
        };
        let s = tgi_header_stages(&h);
        assert_eq!(s.engine_queue_us, Some(12_000));
        assert_eq!((s.prefill_us, s.decode_us), (None, None));
        assert_eq!(s.source, Some(StagesSource::TGI_HEADERS));
        assert!(tgi_header_stages(&|_| None).is_empty());
        assert!(tgi_header_stages(&|_| Some("soon".into())).is_empty());
    }
}
