//! Chat templates rendered as Hugging Face `transformers` renders them
//! (`apply_chat_template`): Jinja with `trim_blocks` and `lstrip_blocks`,
//! the loop controls, `raise_exception`, `strftime_now`, and a `tojson`
//! that writes what Python's `json.dumps(x, ensure_ascii=False)` writes
//! (`", "` and `": "` separators, `indent`, `sort_keys`, `separators`) —
//! not the HTML-safe JSON of Jinja's own filter. Python's string and dict
//! methods (`.strip()`, `.items()`, `.get()`, …) through
//! `minijinja_contrib::pycompat`. A request's JSON keeps its key order
//! (`Json`), as Python's dicts do.
//!
//! Owns: rendering. Must not: read a file, or run unbounded (each render
//! has [`FUEL`]).

use std::collections::BTreeMap;

use minijinja::{value::Kwargs, Environment, Error, ErrorKind, Value};
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// Template instructions one render may run (a conversation of a few
/// hundred turns takes well under a million).
pub const FUEL: u64 = 20_000_000;

/// A compiled chat template and the special-token strings it is given.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// `bos_token`, `eos_token`, … as `tokenizer_config.json` names them.
    specials: BTreeMap<String, String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("specials", &self.specials)
            .finish()
    }
}

/// Jinja2 tags transformers adds (`{% generation %}`, its
/// `AssistantTracker`) that mark text without changing it.
const MARK_TAGS: [&str; 2] = ["generation", "endgeneration"];

/// `source` without transformers' marking tags (`{% generation %}`,
/// `{%- endgeneration -%}`, …), which render nothing.
fn without_marks(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(i) = rest.find("{%") {
        let Some(end) = rest[i..].find("%}") else {
            break;
        };
        let inner = rest[i + 2..i + end].trim_matches(|c: char| c == '-' || c == '+');
        if MARK_TAGS.contains(&inner.trim()) {
            out.push_str(&rest[..i]);
        } else {
            out.push_str(&rest[..i + end + 2]);
        }
        rest = &rest[i + end + 2..];
    }
    out.push_str(rest);
    out
}

impl ChatTemplate {
    /// Compiles `source`; `specials`: the tokenizer's special-token strings
    /// by their config names (`bos_token`, …).
    pub fn new(source: &str, specials: BTreeMap<String, String>) -> Result<Self, Error> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()?,
        );
        env.set_fuel(Some(FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        minijinja_contrib::add_to_environment(&mut env);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", strftime_now);
        // What Python's str() prints: `True`, `None`, `1e-05`, `3.0`, a
        // dict's repr — not minijinja's `true`, `none`, `1e-5`.
        env.set_formatter(|out, _state, v| {
            if !v.is_undefined() {
                out.write_str(&py_str(v))
                    .map_err(|_| Error::new(ErrorKind::WriteFailure, "write"))?;
            }
            Ok(())
        });
        env.add_filter("string", |v: Value| py_str(&v));
        // Python's `is iterable`: None is not; Jinja's Undefined is.
        env.add_test("iterable", |v: Value| {
            use minijinja::value::ValueKind as K;
            matches!(
                v.kind(),
                K::Seq | K::Map | K::Iterable | K::String | K::Bytes | K::Undefined
            )
        });
        env.add_template_owned("chat", without_marks(source))?;
        Ok(Self { env, specials })
    }

    /// Renders the conversation: `vars` are the request's (`messages`,
    /// `tools`, `add_generation_prompt`, the `chat_template_kwargs`), over
    /// the special tokens.
    pub fn render(&self, vars: Vec<(String, Value)>) -> Result<String, Error> {
        let mut ctx: Vec<(String, Value)> = self
            .specials
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        ctx.extend(vars);
        let ctx = Value::from_pairs(ctx);
        self.env.get_template("chat")?.render(ctx)
    }
}

/// `strftime_now(format)`: the local time, as Python's
/// `datetime.now().strftime(format)`.
fn strftime_now(format: String) -> Result<String, Error> {
    let fmt = std::ffi::CString::new(format)
        .map_err(|_| Error::new(ErrorKind::InvalidOperation, "NUL in format"))?;
    let mut buf = vec![0u8; 256];
    // SAFETY: `time(NULL)` only reads the clock; `localtime_r` writes into
    // the `tm` we own; `strftime` writes at most `buf.len()` bytes into
    // `buf` and reads the NUL-terminated `fmt` and the initialised `tm`.
    let n = unsafe {
        let t = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return Err(Error::new(ErrorKind::InvalidOperation, "no local time"));
        }
        libc::strftime(buf.as_mut_ptr().cast(), buf.len(), fmt.as_ptr(), &tm)
    };
    buf.truncate(n);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// transformers' `tojson`: `json.dumps(value, ensure_ascii=False,
/// indent=indent, separators=separators, sort_keys=sort_keys)`.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(n.max(0) as usize)),
            (None, Some(s)) => Some(s.to_string()),
            _ => return Err(Error::new(ErrorKind::InvalidOperation, "bad indent")),
        },
    };
    let (item, key) = match separators {
        Some(s) if !s.is_none() => {
            let a = s.get_item_by_index(0)?;
            let b = s.get_item_by_index(1)?;
            match (a.as_str(), b.as_str()) {
                (Some(a), Some(b)) => (a.to_string(), b.to_string()),
                _ => return Err(Error::new(ErrorKind::InvalidOperation, "bad separators")),
            }
        }
        // Python's default: no space before a newline when indenting.
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let opts = Dumps {
        indent,
        item,
        key,
        sort_keys: sort_keys.unwrap_or(false),
        ascii: ensure_ascii.unwrap_or(false),
    };
    let mut out = String::new();
    opts.write(value, 0, &mut out)?;
    Ok(Value::from(out))
}

struct Dumps {
    indent: Option<String>,
    item: String,
    key: String,
    sort_keys: bool,
    /// `ensure_ascii=True`: non-ASCII as `\uXXXX` (surrogate pairs).
    ascii: bool,
}

impl Dumps {
    fn newline(&self, depth: usize, out: &mut String) {
        if let Some(i) = &self.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(i);
            }
        }
    }

    fn write(&self, v: &Value, depth: usize, out: &mut String) -> Result<(), Error> {
        use minijinja::value::ValueKind as K;
        match v.kind() {
            // Python's json.dumps refuses Jinja's Undefined.
            K::Undefined => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "Undefined is not JSON serializable",
                ))
            }
            K::None => out.push_str("null"),
            K::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            K::Number => {
                if v.is_integer() {
                    out.push_str(&v.to_string());
                } else {
                    let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
                    out.push_str(&py_float(f));
                }
            }
            K::String => py_string(v.as_str().unwrap_or_default(), self.ascii, out),
            K::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if keys.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                if self.sort_keys {
                    keys.sort_by_key(|k| k.to_string());
                }
                out.push('{');
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item);
                    }
                    self.newline(depth + 1, out);
                    match k.as_str() {
                        Some(s) => py_string(s, self.ascii, out),
                        None => py_string(&k.to_string(), self.ascii, out),
                    }
                    out.push_str(&self.key);
                    self.write(&v.get_item(k)?, depth + 1, out)?;
                }
                self.newline(depth, out);
                out.push('}');
            }
            K::Seq | K::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, x) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item);
                    }
                    self.newline(depth + 1, out);
                    self.write(x, depth + 1, out)?;
                }
                self.newline(depth, out);
                out.push(']');
            }
            _ => py_string(&v.to_string(), self.ascii, out),
        }
        Ok(())
    }
}

/// `str(v)` in Python: a string as it is, else [`py_repr`].
fn py_str(v: &Value) -> String {
    match v.as_str() {
        Some(s) => s.to_string(),
        None if v.is_undefined() => String::new(),
        None => {
            let mut out = String::new();
            py_repr(v, &mut out);
            out
        }
    }
}

/// `repr(v)` in Python: `'str'`, `True`, `None`, `1e-05`, `[1, 'a']`,
/// `{'k': 2.0}`.
fn py_repr(v: &Value, out: &mut String) {
    use minijinja::value::ValueKind as K;
    match v.kind() {
        K::Undefined | K::None => out.push_str("None"),
        K::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        K::Number if !v.is_integer() => {
            out.push_str(&py_float(f64::try_from(v.clone()).unwrap_or(f64::NAN)))
        }
        K::String => py_quote(v.as_str().unwrap_or_default(), out),
        K::Seq => {
            out.push('[');
            for (i, x) in v.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr(&x, out);
            }
            out.push(']');
        }
        K::Map => {
            out.push('{');
            for (i, k) in v.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr(&k, out);
                out.push_str(": ");
                py_repr(&v.get_item(&k).unwrap_or_default(), out);
            }
            out.push('}');
        }
        _ => out.push_str(&v.to_string()),
    }
}

/// A string literal as Python's `repr` quotes it.
fn py_quote(s: &str, out: &mut String) {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(q);
}

/// A float as Python's `repr` writes it (`1.0`, `0.5`, `1e-05`, `1e+16`).
fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let a = f.abs();
    if a != 0.0 && !(1e-4..1e16).contains(&a) {
        // Rust writes `1e-5`; Python `1e-05` (two exponent digits at least).
        let s = format!("{f:e}");
        let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
        let (sign, digits) = match e.strip_prefix('-') {
            Some(d) => ('-', d),
            None => ('+', e),
        };
        return format!("{m}e{sign}{digits:0>2}");
    }
    let s = format!("{f:?}");
    if s.contains('.') || s.contains('e') {
        s
    } else {
        format!("{s}.0")
    }
}

/// A string as Python's `json.dumps` writes it (`ascii`: `ensure_ascii`).
fn py_string(s: &str, ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{:04x}", u));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A JSON value with its objects' keys in the order they were written
/// (Python's `json.loads` keeps it; `tojson` of a request's tools shows it).
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            // The last duplicate wins, as in Python.
            Json::Object(kv) => kv.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Json::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// As a template value (maps keep their order; a duplicate key keeps
    /// its last value at its first place, as a Python dict does).
    pub fn to_value(&self) -> Value {
        match self {
            Json::Null => Value::from(()),
            Json::Bool(b) => Value::from(*b),
            Json::Int(i) => Value::from(*i),
            Json::UInt(u) => Value::from(*u),
            Json::Float(f) => Value::from(*f),
            Json::Str(s) => Value::from(s.as_str()),
            Json::Array(a) => a.iter().map(Json::to_value).collect(),
            Json::Object(kv) => Value::from_pairs(
                kv.iter()
                    .map(|(k, v)| (Value::from(k.as_str()), v.to_value())),
            ),
        }
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Json;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("JSON")
            }
            fn visit_unit<E>(self) -> Result<Json, E> {
                Ok(Json::Null)
            }
            fn visit_bool<E>(self, b: bool) -> Result<Json, E> {
                Ok(Json::Bool(b))
            }
            fn visit_i64<E>(self, i: i64) -> Result<Json, E> {
                Ok(Json::Int(i))
            }
            fn visit_u64<E>(self, u: u64) -> Result<Json, E> {
                Ok(match i64::try_from(u) {
                    Ok(i) => Json::Int(i),
                    Err(_) => Json::UInt(u),
                })
            }
            fn visit_f64<E>(self, f: f64) -> Result<Json, E> {
                Ok(Json::Float(f))
            }
            fn visit_str<E>(self, s: &str) -> Result<Json, E> {
                Ok(Json::Str(s.to_string()))
            }
            fn visit_string<E>(self, s: String) -> Result<Json, E> {
                Ok(Json::Str(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Json, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = s.next_element()? {
                    v.push(x);
                }
                Ok(Json::Array(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Json, A::Error> {
                let mut v = Vec::new();
                while let Some((k, x)) = m.next_entry::<String, Json>()? {
                    v.push((k, x));
                }
                Ok(Json::Object(v))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, json: &str) -> String {
        let t =
            ChatTemplate::new(src, BTreeMap::from([("bos_token".into(), "<s>".into())])).unwrap();
        let Json::Object(kv) = serde_json::from_str::<Json>(json).unwrap() else {
            panic!()
        };
        t.render(kv.into_iter().map(|(k, v)| (k, v.to_value())).collect())
            .unwrap()
    }

    #[test]
    fn tojson_writes_what_python_json_dumps_writes() {
        assert_eq!(
            render(
                "{{ x|tojson }}",
                r#"{"x":{"b":1,"a":[1.0,0.5,1e-5,"é\n\"",null,true,{}],"c":[]}}"#
            ),
            r#"{"b": 1, "a": [1.0, 0.5, 1e-05, "é\n\"", null, true, {}], "c": []}"#
        );
        assert_eq!(
            render("{{ x|tojson(indent=2) }}", r#"{"x":{"b":[1,2]}}"#),
            "{\n  \"b\": [\n    1,\n    2\n  ]\n}"
        );
        assert_eq!(
            render("{{ x|tojson(sort_keys=true) }}", r#"{"x":{"b":1,"a":2}}"#),
            r#"{"a": 2, "b": 1}"#
        );
    }

    #[test]
    fn blocks_are_trimmed_and_python_methods_work() {
        let src = "{{ bos_token }}{% for m in messages %}\n  {% if m.role == 'user' %}\n[{{ m['content'].strip() }}]\n  {% endif %}\n{% endfor %}{% generation %}x{% endgeneration %}";
        assert_eq!(
            render(
                src,
                r#"{"messages":[{"role":"user","content":" hi "},{"role":"x"}]}"#
            ),
            "<s>[hi]\nx"
        );
    }

    #[test]
    fn raise_exception_fails_the_render() {
        let t = ChatTemplate::new("{{ raise_exception('no') }}", BTreeMap::new()).unwrap();
        assert!(t.render(vec![]).is_err());
    }

    #[test]
    fn a_runaway_template_runs_out_of_fuel() {
        let t = ChatTemplate::new(
            "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}",
            BTreeMap::new(),
        )
        .unwrap();
        assert!(t.render(vec![]).is_err());
    }

    #[test]
    fn python_floats() {
        for (f, s) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e-5, "1e-05"),
            (1e16, "1e+16"),
            (123.456, "123.456"),
            (-2.0, "-2.0"),
        ] {
            assert_eq!(py_float(f), s);
        }
    }
}
