//! Ollama's native API: `/api/chat` (`message` objects) and `/api/generate`
//! (`response` strings), streamed as NDJSON; the `done: true` line ends the
//! stream and carries the counts.

use super::{add, openai::Delta, Content, EventInfo, Loose, Num, Stages, Text};
use crate::vocab::StagesSource;

family_event!(OllamaEvent {
    message: Option<Delta>,
    response: Text,
    thinking: Text,
    done: Option<bool>,
    #[serde(borrow)]
    done_reason: Loose<'a>,
    prompt_eval_count: Num,
    eval_count: Num,
    load_duration: Num,
    prompt_eval_duration: Num,
    eval_duration: Num,
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
        // Durations in nanoseconds.
        let us = |n: &Num| n.0.map(|ns| ns / 1000);
        info.stages.merge(&Stages {
            model_load_us: us(&o.load_duration),
            prefill_us: us(&o.prompt_eval_duration),
            decode_us: us(&o.eval_duration),
            source: Some(StagesSource::OLLAMA),
            ..Stages::default()
        });
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

    #[test]
    fn the_done_line_gives_load_prefill_and_decode_times() {
        let e = interpret(br#"{"model":"llama3","created_at":"2026-12-02T05:00:00Z","response":"","done":true,"done_reason":"stop","total_duration":5043500667,"load_duration":5025959,"prompt_eval_count":26,"prompt_eval_duration":325953000,"eval_count":290,"eval_duration":4709213000}"#).unwrap();
        assert_eq!(e.stages.model_load_us, Some(5_025));
        assert_eq!(e.stages.prefill_us, Some(325_953));
        assert_eq!(e.stages.decode_us, Some(4_709_213));
        assert_eq!(e.stages.source, Some(StagesSource::OLLAMA));
    }
}
