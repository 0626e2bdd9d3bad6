//! Ollama's native API: `/api/chat` (`message` objects) and `/api/generate`
//! (`response` strings), streamed as NDJSON; the `done: true` line ends the
//! stream and carries the counts.

use super::{add, openai::Delta, Content, EventInfo, Loose, Num, Text};

family_event!(OllamaEvent {
    message: Option<Delta>,
    response: Text,
    thinking: Text,
    done: Option<bool>,
    #[serde(borrow)]
    done_reason: Loose<'a>,
    prompt_eval_count: Num,
    eval_count: Num,
});

pub(super) fn interpret(json: &[u8]) -> Option<EventInfo<'_>> {
    let mut o: OllamaEvent<'_> = serde_json::from_slice(json).ok()?;
    let mut info = o.common_info();
    if let Some(m) = &o.message {
        add(&mut info, m.kind());
    }
    if o.response.0 {
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
    Some(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_and_generate_lines_are_content_and_done_carries_the_counts() {
        let e = interpret(
            br#"{"model":"m","message":{"role":"assistant","content":"Hi"},"done":false}"#,
        )
        .unwrap();
        assert_eq!(
            (e.content, e.model.as_deref()),
            (Content::Answer, Some("m"))
        );
        assert!(!e.end_of_stream);
        let e = interpret(br#"{"response":"","thinking":"hmm","done":false}"#).unwrap();
        assert_eq!(e.content, Content::Reasoning);
        let e = interpret(br#"{"response":"","done":true,"done_reason":"stop","prompt_eval_count":3,"eval_count":8}"#).unwrap();
        assert!(e.end_of_stream);
        assert_eq!(e.content, Content::None);
        assert_eq!(e.finish_reason.as_deref(), Some("stop"));
        assert_eq!((e.input_tokens, e.output_tokens), (Some(3), Some(8)));
    }
}
