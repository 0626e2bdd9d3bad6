//! The engines' gRPC messages, only the fields tokentap reads, as `prost`
//! messages. Field numbers and types follow the `.proto` files kept in
//! `agent/proto/` (their sources and commits are in `agent/proto/README.md`);
//! a unit test reads those files and holds every field here equal to its
//! declaration there. Fields not declared here (tensor contents, sampling
//! parameters, log-probabilities) are skipped by prost without being
//! copied.
//!
//! vLLM's and SGLang's messages come from smg-project/smg (`vllm_engine.proto`,
//! `sglang_scheduler.proto`), which `vllm serve --grpc` and SGLang's
//! `--grpc-mode` load; Triton's from triton-inference-server/common
//! (`grpc_service.proto`).

use std::collections::HashMap;

use prost::Message;

// ---- Triton: package inference, service GRPCInferenceService ----

#[derive(Clone, PartialEq, Message)]
pub struct InferParameter {
    #[prost(oneof = "ParameterChoice", tags = "1, 2, 3, 4, 5")]
    pub choice: Option<ParameterChoice>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum ParameterChoice {
    #[prost(bool, tag = "1")]
    BoolParam(bool),
    #[prost(int64, tag = "2")]
    Int64Param(i64),
    #[prost(string, tag = "3")]
    StringParam(String),
    #[prost(double, tag = "4")]
    DoubleParam(f64),
    #[prost(uint64, tag = "5")]
    Uint64Param(u64),
}

#[derive(Clone, PartialEq, Message)]
pub struct InferInputTensor {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub datatype: String,
    #[prost(int64, repeated, tag = "3")]
    pub shape: Vec<i64>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ModelInferRequest {
    #[prost(string, tag = "1")]
    pub model_name: String,
    #[prost(string, tag = "2")]
    pub model_version: String,
    #[prost(string, tag = "3")]
    pub id: String,
    #[prost(map = "string, message", tag = "4")]
    pub parameters: HashMap<String, InferParameter>,
    #[prost(message, repeated, tag = "5")]
    pub inputs: Vec<InferInputTensor>,
    #[prost(bytes = "vec", repeated, tag = "7")]
    pub raw_input_contents: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
pub struct InferOutputTensor {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub datatype: String,
    #[prost(int64, repeated, tag = "3")]
    pub shape: Vec<i64>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ModelInferResponse {
    #[prost(string, tag = "1")]
    pub model_name: String,
    #[prost(string, tag = "2")]
    pub model_version: String,
    #[prost(string, tag = "3")]
    pub id: String,
    #[prost(map = "string, message", tag = "4")]
    pub parameters: HashMap<String, InferParameter>,
    #[prost(message, repeated, tag = "5")]
    pub outputs: Vec<InferOutputTensor>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ModelStreamInferResponse {
    #[prost(string, tag = "1")]
    pub error_message: String,
    #[prost(message, optional, tag = "2")]
    pub infer_response: Option<ModelInferResponse>,
}

// ---- vLLM (smg): package vllm.grpc.engine, service VllmEngine ----
// ---- SGLang (smg): package sglang.grpc.scheduler, service SglangScheduler ----

#[derive(Clone, PartialEq, Message)]
pub struct TokenizedInput {
    #[prost(string, tag = "1")]
    pub original_text: String,
    #[prost(uint32, repeated, tag = "2")]
    pub input_ids: Vec<u32>,
}

/// vLLM's `GenerateRequest` (its field 3 is the prompt text; SGLang's is
/// not declared here: it is a multimodal message).
#[derive(Clone, PartialEq, Message)]
pub struct VllmGenerateRequest {
    #[prost(string, tag = "1")]
    pub request_id: String,
    #[prost(message, optional, tag = "2")]
    pub tokenized: Option<TokenizedInput>,
    #[prost(string, optional, tag = "3")]
    pub text: Option<String>,
    #[prost(bool, tag = "5")]
    pub stream: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct SglangGenerateRequest {
    #[prost(string, tag = "1")]
    pub request_id: String,
    #[prost(message, optional, tag = "2")]
    pub tokenized: Option<TokenizedInput>,
    #[prost(bool, tag = "17")]
    pub stream: bool,
}

/// A streamed piece: incremental token ids and the cumulative counts.
#[derive(Clone, PartialEq, Message)]
pub struct GenerateStreamChunk {
    #[prost(uint32, repeated, tag = "1")]
    pub token_ids: Vec<u32>,
    #[prost(uint32, tag = "2")]
    pub prompt_tokens: u32,
    #[prost(uint32, tag = "3")]
    pub completion_tokens: u32,
    #[prost(uint32, tag = "4")]
    pub cached_tokens: u32,
}

/// vLLM's `GenerateComplete`.
#[derive(Clone, PartialEq, Message)]
pub struct VllmGenerateComplete {
    #[prost(uint32, repeated, tag = "1")]
    pub output_ids: Vec<u32>,
    #[prost(string, tag = "2")]
    pub finish_reason: String,
    #[prost(uint32, tag = "3")]
    pub prompt_tokens: u32,
    #[prost(uint32, tag = "4")]
    pub completion_tokens: u32,
    #[prost(uint32, tag = "5")]
    pub cached_tokens: u32,
}

/// SGLang's `GenerateComplete` (same numbers as vLLM's for these fields).
pub type SglangGenerateComplete = VllmGenerateComplete;

#[derive(Clone, PartialEq, Message)]
pub struct VllmGenerateResponse {
    #[prost(oneof = "VllmResponse", tags = "1, 2")]
    pub response: Option<VllmResponse>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum VllmResponse {
    #[prost(message, tag = "1")]
    Chunk(GenerateStreamChunk),
    #[prost(message, tag = "2")]
    Complete(VllmGenerateComplete),
}

#[derive(Clone, PartialEq, Message)]
pub struct SglangGenerateResponse {
    #[prost(string, tag = "1")]
    pub request_id: String,
    #[prost(oneof = "SglangResponse", tags = "2, 3")]
    pub response: Option<SglangResponse>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum SglangResponse {
    #[prost(message, tag = "2")]
    Chunk(GenerateStreamChunk),
    #[prost(message, tag = "3")]
    Complete(SglangGenerateComplete),
}

/// A `Generate` request's id, token ids and text (vLLM's or SGLang's).
pub fn generate_request(
    msg: &[u8],
    sglang: bool,
) -> Result<(String, Option<TokenizedInput>, Option<String>), prost::DecodeError> {
    Ok(if sglang {
        let r = SglangGenerateRequest::decode(msg)?;
        (r.request_id, r.tokenized, None)
    } else {
        let r = VllmGenerateRequest::decode(msg)?;
        (r.request_id, r.tokenized, r.text)
    })
}

/// A `Generate` response: a streamed chunk or the completion (vLLM's and
/// SGLang's number them differently).
pub fn generate_response(
    msg: &[u8],
    sglang: bool,
) -> Result<(Option<GenerateStreamChunk>, Option<VllmGenerateComplete>), prost::DecodeError> {
    Ok(if sglang {
        match SglangGenerateResponse::decode(msg)?.response {
            Some(SglangResponse::Chunk(c)) => (Some(c), None),
            Some(SglangResponse::Complete(c)) => (None, Some(c)),
            None => (None, None),
        }
    } else {
        match VllmGenerateResponse::decode(msg)?.response {
            Some(VllmResponse::Chunk(c)) => (Some(c), None),
            Some(VllmResponse::Complete(c)) => (None, Some(c)),
            None => (None, None),
        }
    })
}

/// Element count of a tensor of this shape (0 for a negative or absurd
/// dimension).
pub fn elements(shape: &[i64]) -> u64 {
    shape
        .iter()
        .try_fold(1u64, |n, d| {
            u64::try_from(*d).ok().and_then(|d| n.checked_mul(d))
        })
        .unwrap_or(0)
}

/// Characters of text in a raw BYTES tensor (each element a 4-byte
/// little-endian length and its bytes), counted as bytes; None when the
/// buffer is not laid out so.
pub fn bytes_tensor_len(raw: &[u8]) -> Option<u64> {
    let (mut at, mut total) = (0usize, 0u64);
    while at < raw.len() {
        let l = u32::from_le_bytes(raw.get(at..at + 4)?.try_into().ok()?) as usize;
        at = at.checked_add(4 + l)?;
        if at > raw.len() {
            return None;
        }
        total += l as u64;
    }
    Some(total)
}

/// Which engine's request a message of unknown method is, by its shape
/// (a stream whose HEADERS were never seen, or whose `:path` the HPACK
/// table could not resolve).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    TritonInfer,
    /// vLLM's or SGLang's `Generate` (told apart by the first response).
    Generate,
}

pub fn request_shape(msg: &[u8]) -> Option<Shape> {
    if let Ok(r) = ModelInferRequest::decode(msg) {
        let named = !r.model_name.is_empty() && r.model_name.len() <= 256;
        let typed = r
            .inputs
            .iter()
            .all(|i| !i.name.is_empty() && is_triton_datatype(&i.datatype));
        if named && typed && !r.inputs.is_empty() {
            return Some(Shape::TritonInfer);
        }
    }
    if let Ok(r) = VllmGenerateRequest::decode(msg) {
        let input = r
            .tokenized
            .as_ref()
            .is_some_and(|t| !t.input_ids.is_empty())
            || r.text.is_some();
        if !r.request_id.is_empty() && input {
            return Some(Shape::Generate);
        }
    }
    None
}

fn is_triton_datatype(t: &str) -> bool {
    matches!(
        t,
        "BOOL"
            | "UINT8"
            | "UINT16"
            | "UINT32"
            | "UINT64"
            | "INT8"
            | "INT16"
            | "INT32"
            | "INT64"
            | "FP16"
            | "FP32"
            | "FP64"
            | "BYTES"
            | "BF16"
    )
}

/// Whether a Triton response of a call whose method was guessed is the
/// unary `ModelInferResponse` (outputs at the top level) rather than a
/// `ModelStreamInferResponse` (an error message and/or a nested response).
pub fn is_unary_triton_response(msg: &[u8]) -> bool {
    matches!(ModelInferResponse::decode(msg), Ok(r) if !r.outputs.is_empty()
        && r.outputs.iter().all(|o| !o.name.is_empty() && is_triton_datatype(&o.datatype)))
}

/// Whether a `Generate` response is SGLang's (a request id string first)
/// rather than vLLM's (a chunk or completion message first).
pub fn is_sglang_response(msg: &[u8]) -> bool {
    matches!(SglangGenerateResponse::decode(msg), Ok(r) if !r.request_id.is_empty() && r.response.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field declared here, as (message, field name, number, type)
    /// the `.proto` file must declare.
    const DECLARED: &[(&str, &str, &str, u32, &str)] = &[
        (
            "triton_grpc_service.proto",
            "InferParameter",
            "bool_param",
            1,
            "bool",
        ),
        (
            "triton_grpc_service.proto",
            "InferParameter",
            "int64_param",
            2,
            "int64",
        ),
        (
            "triton_grpc_service.proto",
            "InferParameter",
            "string_param",
            3,
            "string",
        ),
        (
            "triton_grpc_service.proto",
            "InferParameter",
            "double_param",
            4,
            "double",
        ),
        (
            "triton_grpc_service.proto",
            "InferParameter",
            "uint64_param",
            5,
            "uint64",
        ),
        (
            "triton_grpc_service.proto",
            "ModelInferRequest",
            "model_name",
            1,
            "string",
        ),
        (
            "triton_grpc_service.proto",
            "ModelInferRequest",
            "model_version",
            2,
            "string",
        ),
        (
            "triton_grpc_service.proto",
            "ModelInferRequest",
            "id",
            3,
            "string",
        ),
        (
            "triton_grpc_service.proto",
            "ModelInferRequest",
            "parameters",
            4,
            "map<string, InferParameter>",
        ),
        (
            "triton_grpc_service.proto",
            "ModelInferRequest",
            "inputs",
            5,
            "repeated InferInputTensor",
        ),
        (
            "triton_grpc_service.proto",
            "ModelInferRequest",
            "raw_input_contents",
            7,
            "repeated bytes",
        ),
        (
            "triton_grpc_service.proto",
            "InferInputTensor",
            "name",
            1,
            "string",
        ),
        (
            "triton_grpc_service.proto",
            "InferInputTensor",
            "datatype",
            2,
            "string",
        ),
        (
            "triton_grpc_service.proto",
            "InferInputTensor",
            "shape",
            3,
            "repeated int64",
        ),
        (
            "triton_grpc_service.proto",
            "ModelInferResponse",
            "model_name",
            1,
            "string",
        ),
        (
            "triton_grpc_service.proto",
            "ModelInferResponse",
            "model_version",
            2,
            "string",
        ),
        (
            "triton_grpc_service.proto",
            "ModelInferResponse",
            "id",
            3,
            "string",
        ),
        (
            "triton_grpc_service.proto",
            "ModelInferResponse",
            "parameters",
            4,
            "map<string, InferParameter>",
        ),
        (
            "triton_grpc_service.proto",
            "ModelInferResponse",
            "outputs",
            5,
            "repeated InferOutputTensor",
        ),
        (
            "triton_grpc_service.proto",
            "InferOutputTensor",
            "name",
            1,
            "string",
        ),
        (
            "triton_grpc_service.proto",
            "InferOutputTensor",
            "datatype",
            2,
            "string",
        ),
        (
            "triton_grpc_service.proto",
            "InferOutputTensor",
            "shape",
            3,
            "repeated int64",
        ),
        (
            "triton_grpc_service.proto",
            "ModelStreamInferResponse",
            "error_message",
            1,
            "string",
        ),
        (
            "triton_grpc_service.proto",
            "ModelStreamInferResponse",
            "infer_response",
            2,
            "ModelInferResponse",
        ),
        (
            "smg_vllm_engine.proto",
            "TokenizedInput",
            "original_text",
            1,
            "string",
        ),
        (
            "smg_vllm_engine.proto",
            "TokenizedInput",
            "input_ids",
            2,
            "repeated uint32",
        ),
        (
            "smg_vllm_engine.proto",
            "GenerateRequest",
            "request_id",
            1,
            "string",
        ),
        (
            "smg_vllm_engine.proto",
            "GenerateRequest",
            "tokenized",
            2,
            "TokenizedInput",
        ),
        (
            "smg_vllm_engine.proto",
            "GenerateRequest",
            "text",
            3,
            "string",
        ),
        (
            "smg_vllm_engine.proto",
            "GenerateRequest",
            "stream",
            5,
            "bool",
        ),
        (
            "smg_vllm_engine.proto",
            "GenerateResponse",
            "chunk",
            1,
            "GenerateStreamChunk",
        ),
        (
            "smg_vllm_engine.proto",
            "GenerateResponse",
            "complete",
            2,
            "GenerateComplete",
        ),
        (
            "smg_vllm_engine.proto",
            "GenerateStreamChunk",
            "token_ids",
            1,
            "repeated uint32",
        ),
        (
            "smg_vllm_engine.proto",
            "GenerateStreamChunk",
            "prompt_tokens",
            2,
            "uint32",
        ),
        (
            "smg_vllm_engine.proto",
            "GenerateStreamChunk",
            "completion_tokens",
            3,
            "uint32",
        ),
        (
            "smg_vllm_engine.proto",
            "GenerateStreamChunk",
            "cached_tokens",
            4,
            "uint32",
        ),
        (
            "smg_vllm_engine.proto",
            "GenerateComplete",
            "output_ids",
            1,
            "repeated uint32",
        ),
        (
            "smg_vllm_engine.proto",
            "GenerateComplete",
            "finish_reason",
            2,
            "string",
        ),
        (
            "smg_vllm_engine.proto",
            "GenerateComplete",
            "prompt_tokens",
            3,
            "uint32",
        ),
        (
            "smg_vllm_engine.proto",
            "GenerateComplete",
            "completion_tokens",
            4,
            "uint32",
        ),
        (
            "smg_vllm_engine.proto",
            "GenerateComplete",
            "cached_tokens",
            5,
            "uint32",
        ),
        (
            "smg_sglang_scheduler.proto",
            "TokenizedInput",
            "original_text",
            1,
            "string",
        ),
        (
            "smg_sglang_scheduler.proto",
            "TokenizedInput",
            "input_ids",
            2,
            "repeated uint32",
        ),
        (
            "smg_sglang_scheduler.proto",
            "GenerateRequest",
            "request_id",
            1,
            "string",
        ),
        (
            "smg_sglang_scheduler.proto",
            "GenerateRequest",
            "tokenized",
            2,
            "TokenizedInput",
        ),
        (
            "smg_sglang_scheduler.proto",
            "GenerateRequest",
            "stream",
            17,
            "bool",
        ),
        (
            "smg_sglang_scheduler.proto",
            "GenerateResponse",
            "request_id",
            1,
            "string",
        ),
        (
            "smg_sglang_scheduler.proto",
            "GenerateResponse",
            "chunk",
            2,
            "GenerateStreamChunk",
        ),
        (
            "smg_sglang_scheduler.proto",
            "GenerateResponse",
            "complete",
            3,
            "GenerateComplete",
        ),
        (
            "smg_sglang_scheduler.proto",
            "GenerateStreamChunk",
            "token_ids",
            1,
            "repeated uint32",
        ),
        (
            "smg_sglang_scheduler.proto",
            "GenerateStreamChunk",
            "prompt_tokens",
            2,
            "uint32",
        ),
        (
            "smg_sglang_scheduler.proto",
            "GenerateStreamChunk",
            "completion_tokens",
            3,
            "uint32",
        ),
        (
            "smg_sglang_scheduler.proto",
            "GenerateStreamChunk",
            "cached_tokens",
            4,
            "uint32",
        ),
        (
            "smg_sglang_scheduler.proto",
            "GenerateComplete",
            "output_ids",
            1,
            "repeated uint32",
        ),
        (
            "smg_sglang_scheduler.proto",
            "GenerateComplete",
            "finish_reason",
            2,
            "string",
        ),
        (
            "smg_sglang_scheduler.proto",
            "GenerateComplete",
            "prompt_tokens",
            3,
            "uint32",
        ),
        (
            "smg_sglang_scheduler.proto",
            "GenerateComplete",
            "completion_tokens",
            4,
            "uint32",
        ),
        (
            "smg_sglang_scheduler.proto",
            "GenerateComplete",
            "cached_tokens",
            5,
            "uint32",
        ),
    ];

    /// The body of `message NAME { … }` (its first, outermost-or-nested
    /// declaration), comments removed.
    fn message_body(src: &str, name: &str) -> String {
        let clean: String = src
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        let words: Vec<&str> = clean.split_whitespace().collect();
        let at = words
            .windows(2)
            .position(|w| w[0] == "message" && (w[1] == name || w[1] == format!("{name}{{")))
            .unwrap_or_else(|| panic!("message {name} not found"));
        let rest = words[at + 2..].join(" ");
        let mut depth = 0;
        let mut body = String::new();
        for c in rest.chars() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            if depth >= 1 {
                body.push(c);
            }
        }
        body
    }

    #[test]
    fn every_declared_field_matches_its_proto_file() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("proto");
        for (file, msg, field, num, ty) in DECLARED {
            let src = std::fs::read_to_string(dir.join(file)).unwrap();
            let body = message_body(&src, msg);
            let decl = body
                .split(';')
                .map(|d| d.rsplit(['{', '}']).next().unwrap_or(d).trim().to_string())
                .find(|d| d.split_whitespace().rev().nth(2) == Some(field))
                .unwrap_or_else(|| panic!("{file}: {msg}.{field} not declared in `{body}`"));
            let want = format!("{ty} {field} = {num}");
            let got = decl.trim_start_matches("optional ").to_string();
            assert_eq!(got, want, "{file}: {msg}.{field}");
        }
    }

    #[test]
    fn bytes_tensors_and_shapes_are_read_without_trusting_them() {
        assert_eq!(bytes_tensor_len(b"\x02\0\0\0hi\x01\0\0\0!"), Some(3));
        assert_eq!(bytes_tensor_len(b"\xff\xff\xff\xffhi"), None);
        assert_eq!(elements(&[1, 7]), 7);
        assert_eq!(elements(&[-1, 7]), 0);
        assert_eq!(elements(&[i64::MAX, i64::MAX]), 0);
        assert_eq!(elements(&[]), 1);
    }

    #[test]
    fn request_shapes_tell_triton_from_generate() {
        let t = ModelInferRequest {
            model_name: "llm".into(),
            id: "r1".into(),
            inputs: vec![InferInputTensor {
                name: "text_input".into(),
                datatype: "BYTES".into(),
                shape: vec![1],
            }],
            ..Default::default()
        };
        assert_eq!(request_shape(&t.encode_to_vec()), Some(Shape::TritonInfer));
        let g = VllmGenerateRequest {
            request_id: "abc".into(),
            tokenized: Some(TokenizedInput {
                original_text: String::new(),
                input_ids: vec![1, 2, 3],
            }),
            text: None,
            stream: true,
        };
        assert_eq!(request_shape(&g.encode_to_vec()), Some(Shape::Generate));
        assert_eq!(request_shape(b"\x0a\x03abc"), None);
        let s = SglangGenerateResponse {
            request_id: "abc".into(),
            response: Some(SglangResponse::Chunk(GenerateStreamChunk {
                token_ids: vec![5],
                ..Default::default()
            })),
        };
        assert!(is_sglang_response(&s.encode_to_vec()));
        let v = VllmGenerateResponse {
            response: Some(VllmResponse::Chunk(GenerateStreamChunk {
                token_ids: vec![5, 6],
                ..Default::default()
            })),
        };
        assert!(!is_sglang_response(&v.encode_to_vec()));
    }
}
