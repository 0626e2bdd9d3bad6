//! llama.cpp's native `/completion`: one `content` piece per event; the
//! `stop: true` event ends the stream with counts (top level or `timings`).

use super::{add, Content, EventInfo, Loose, Num, Text, Timings};

family_event!(CompletionEvent {
    content: Text,
    stop: Option<bool>,
    tokens_predicted: Num,
    tokens_evaluated: Num,
    #[serde(borrow)]
    stop_type: Loose<'a>,
    timings: Option<Timings>,
});

pub(super) fn interpret(json: &[u8]) -> Option<EventInfo<'_>> {
    let mut o: CompletionEvent<'_> = serde_json::from_slice(json).ok()?;
    let mut info = o.common_info();
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
            .or(o.timings.as_ref().and_then(|t| t.input_tokens()));
    }
    if let Some(t) = &o.timings {
        info.stages.merge(&t.stages());
    }
    Some(info)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::StagesSource;

    #[test]
    fn the_stop_event_ends_the_stream_with_counts_from_either_place() {
        let e = interpret(br#"{"content":"Hi","stop":false}"#).unwrap();
        assert_eq!(e.content, Content::Answer);
        assert!(!e.end_of_stream);
        let e = interpret(br#"{"content":"","stop":true,"stop_type":"eos","tokens_predicted":5,"tokens_evaluated":2}"#).unwrap();
        assert!(e.end_of_stream);
        assert_eq!(e.finish_reason.as_deref(), Some("eos"));
        assert_eq!((e.input_tokens, e.output_tokens), (Some(2), Some(5)));
        let e = interpret(br#"{"stop":true,"timings":{"prompt_n":4,"predicted_n":6}}"#).unwrap();
        assert_eq!((e.input_tokens, e.output_tokens), (Some(4), Some(6)));
    }

    #[test]
    fn timings_give_the_engines_own_prefill_and_decode() {
        let e = interpret(br#"{"content":"","stop":true,"timings":{"cache_n":3,"prompt_n":4,"prompt_ms":12.3456,"predicted_n":6,"predicted_ms":50.5,"predicted_per_token_ms":10.1}}"#).unwrap();
        assert_eq!(e.stages.prefill_us, Some(12_346));
        assert_eq!(e.stages.decode_us, Some(50_500));
        assert_eq!(e.stages.cached_input_tokens, Some(3));
        assert_eq!(
            e.input_tokens,
            Some(7),
            "the prompt is what was evaluated and what came from the cache"
        );
        assert_eq!(e.stages.engine_queue_us, None);
        assert_eq!(e.stages.source, Some(StagesSource::LLAMACPP_TIMINGS));
        let e = interpret(br#"{"content":"x","stop":false}"#).unwrap();
        assert!(e.stages.is_empty());
        // Counts past u64 from a hostile peer saturate, never wrap or panic.
        let e = interpret(
            br#"{"stop":true,"timings":{"cache_n":18446744073709551615,"prompt_n":18446744073709551615}}"#,
        )
        .unwrap();
        assert_eq!(e.input_tokens, Some(u64::MAX));
    }
}
