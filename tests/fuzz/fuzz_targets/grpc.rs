//! gRPC messages alone: the length-prefixed framer fed the input in
//! pieces (cut where the first bytes say), and every whole message
//! decoded as each service's request and response (vLLM's and SGLang's
//! Generate, Triton's ModelInfer), as the decoder does.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use tokentap::decode::grpc::{
    proto::{self, ModelInferRequest, ModelInferResponse, ModelStreamInferResponse},
    whole_fields, Framer,
};

fuzz_target!(|input: &[u8]| {
    let Some((&cut, mut rest)) = input.split_first() else {
        return;
    };
    let step = 1 + cut as usize;
    let mut framer = Framer::default();
    let mut ts = 0;
    while !rest.is_empty() {
        let n = step.min(rest.len());
        let (piece, tail) = rest.split_at(n);
        rest = tail;
        ts += 1;
        let res = framer.feed(piece, ts, &|_| None, &mut |m| {
            let data = if (m.data.len() as u32) < m.len {
                &m.data[..whole_fields(m.data)]
            } else {
                m.data
            };
            for sglang in [false, true] {
                let _ = proto::generate_request(data, sglang);
                let _ = proto::generate_response(data, sglang);
            }
            if let Ok(r) = ModelInferRequest::decode(data) {
                for t in &r.inputs {
                    let _ = proto::elements(&t.shape);
                }
            }
            let _ = ModelInferResponse::decode(data);
            let _ = ModelStreamInferResponse::decode(data);
        });
        if res.is_err() {
            break;
        }
        assert!(
            framer.buffered() <= 1 << 20,
            "framer held {}",
            framer.buffered()
        );
    }
});
