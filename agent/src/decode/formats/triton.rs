//! NVIDIA Triton's generate extension: `/v2/models/<m>/generate` and
//! `…/generate_stream`, one `text_output` piece per event.

use super::{add, Content, EventInfo, Text};

family_event!(GenerateEvent { text_output: Text });

pub(super) fn interpret(json: &[u8]) -> Option<EventInfo<'_>> {
    let mut o: GenerateEvent<'_> = serde_json::from_slice(json).ok()?;
    let mut info = o.common_info();
    if o.text_output.0 {
        add(&mut info, Content::Answer);
    }
    Some(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_output_is_content_and_model_name_names_the_model() {
        let e = interpret(br#"{"model_name":"ensemble","model_version":"1","text_output":"Hi"}"#)
            .unwrap();
        assert_eq!((e.content, e.content_parts), (Content::Answer, 1));
        assert_eq!(e.model.as_deref(), Some("ensemble"));
        let e = interpret(br#"{"model_name":"ensemble","text_output":""}"#).unwrap();
        assert_eq!(e.content, Content::None);
    }
}
