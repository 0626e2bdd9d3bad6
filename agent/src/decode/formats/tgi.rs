//! Hugging Face text-generation-inference: `/generate` (one JSON body with
//! `generated_text`) and `/generate_stream` (SSE events with one `token`
//! each; the last carries `details`).

use serde::Deserialize;

use super::{add, Content, EventInfo, Loose, Num, Text};

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
