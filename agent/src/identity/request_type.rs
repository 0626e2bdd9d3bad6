//! What kind of request it is (`request_type`): rules from the config file
//! (`[[request_type]]` tables) tried in order, then the built-in types
//! (`batch`, `tool_call`, `embedding`, `completion`, `chat`).
//!
//! A rule names a type and matches on any of `path` (a prefix, or a glob
//! when it has `*`, `?` or `[`), `header` (`name=value`; value exact or a
//! glob), `model` (exact or a glob; the requested model, else the one that
//! answered), `input_tokens` (`{ min = N, max = M }`, inclusive, either
//! bound optional) and `json_field` (a top-level key present in the
//! request body). Every given condition must hold; the first matching
//! rule wins.
//!
//! Owns: rule parsing and validation (an invalid rule is an error naming
//! the rule and the problem: the agent does not start half-configured),
//! matching, the built-in names. Must not: read payload text beyond what
//! the decoder hands over in [`Facts`] (header values only of headers the
//! rules name, presence of the keys they name).

use anyhow::{bail, Context, Result};

/// The built-in types, in the order they are tried after the rules.
pub const BUILT_INS: [&str; 5] = ["batch", "tool_call", "embedding", "completion", "chat"];
/// Longest rule name (it is a metric attribute value).
pub const MAX_NAME_BYTES: usize = 64;
/// The config file's key for the rules.
pub const CONFIG_KEY: &str = "request_type";

/// What the endpoint alone says a request is (from its API format).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
    Embedding,
    /// An API the decoder does not know.
    Other,
}

/// What a rule may look at, as the decoder saw it. Nothing here is payload
/// text: header values are only those of headers the rules name.
#[derive(Clone, Copy, Debug)]
pub struct Facts<'a> {
    pub path: &'a str,
    pub endpoint: Endpoint,
    /// The requested model, else the one that answered.
    pub model: Option<&'a str>,
    pub input_tokens: Option<u64>,
    /// (lowercase name, value) of the headers named by rules.
    pub headers: &'a [(String, String)],
    /// Top-level body keys named by rules that were present.
    pub json_fields: &'a [String],
    /// The request offered tools (a non-empty `tools` array).
    pub tools_offered: bool,
    /// The response called a tool.
    pub tool_calls: bool,
}

/// One `[[request_type]]` table.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    pub name: String,
    path: Option<Pattern>,
    header: Option<(String, Pattern)>,
    model: Option<Pattern>,
    input_tokens: Option<(u64, u64)>,
    json_field: Option<String>,
}

/// The rules of a config file, in order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rules {
    rules: Vec<Rule>,
}

impl Rules {
    /// The rules of a config file's text (the agent reads its file once,
    /// `pipeline::config::ConfigFile`, and hands [`Rules::from_value`] the
    /// table).
    pub fn parse(text: &str) -> Result<Self> {
        let table: toml::Table = toml::from_str(text).context("not valid TOML")?;
        Self::from_value(table.get(CONFIG_KEY))
    }

    /// The rules of the config file's `[[request_type]]` value (none
    /// without one).
    pub fn from_value(v: Option<&toml::Value>) -> Result<Self> {
        let Some(v) = v else {
            return Ok(Self::default());
        };
        let toml::Value::Array(items) = v else {
            bail!("`{CONFIG_KEY}` must be an array of tables: write each rule as a [[{CONFIG_KEY}]] table");
        };
        let mut rules = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            rules.push(Rule::parse(i + 1, item)?);
        }
        Ok(Self { rules })
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Header names (lowercase) the rules match on: the only headers,
    /// besides the tenant headers, whose values the decoder keeps.
    pub fn header_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .rules
            .iter()
            .filter_map(|r| r.header.as_ref().map(|(n, _)| n.clone()))
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// Top-level body keys the rules ask about.
    pub fn json_fields(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .rules
            .iter()
            .filter_map(|r| r.json_field.clone())
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// The request's type: the first matching rule's name, else a
    /// built-in; None for an API the decoder does not know (and no rule
    /// matched).
    pub fn classify(&self, f: &Facts<'_>) -> Option<String> {
        if let Some(r) = self.rules.iter().find(|r| r.matches(f)) {
            return Some(r.name.clone());
        }
        builtin(f).map(str::to_string)
    }
}

impl Rules {
    /// The request's type as a function of its input tokens, for a count
    /// learnt later (the tokenizer's exact one in place of the estimate
    /// the decoder classified with): the rules whose other conditions
    /// hold, in order, with their token ranges, up to the first without
    /// one; then the built-in. None when no rule looks at input tokens
    /// (the type cannot change).
    pub fn by_input_tokens(&self, f: &Facts<'_>) -> Option<crate::record::TypesByInput> {
        if self.rules.iter().all(|r| r.input_tokens.is_none()) {
            return None;
        }
        let mut v = Vec::new();
        for r in self.rules.iter().filter(|r| r.matches_but_tokens(f)) {
            let (lo, hi) = r.input_tokens.unwrap_or((0, u64::MAX));
            v.push((lo, hi, Some(r.name.clone())));
            if r.input_tokens.is_none() {
                return Some(crate::record::TypesByInput(v));
            }
        }
        v.push((0, u64::MAX, builtin(f).map(str::to_string)));
        Some(crate::record::TypesByInput(v))
    }
}

/// The built-in type of a request no rule matched.
pub fn builtin(f: &Facts<'_>) -> Option<&'static str> {
    let p = f.path.split(['?', '#']).next().unwrap_or("");
    if p == "/v1/batches" || p.starts_with("/v1/batches/") {
        return Some("batch");
    }
    match f.endpoint {
        Endpoint::Chat | Endpoint::Completion if f.tools_offered || f.tool_calls => {
            Some("tool_call")
        }
        Endpoint::Chat => Some("chat"),
        Endpoint::Completion => Some("completion"),
        Endpoint::Embedding => Some("embedding"),
        Endpoint::Other => None,
    }
}

const KEYS: &str = "name, path, header, model, input_tokens, json_field";

impl Rule {
    fn parse(index: usize, v: &toml::Value) -> Result<Self> {
        let toml::Value::Table(t) = v else {
            bail!("{CONFIG_KEY} rule #{index}: must be a table ([[{CONFIG_KEY}]])");
        };
        let name = match t.get("name") {
            Some(toml::Value::String(s)) => s.clone(),
            Some(other) => bail!(
                "{CONFIG_KEY} rule #{index}: `name` must be a string, got {}",
                other.type_str()
            ),
            None => bail!("{CONFIG_KEY} rule #{index}: has no `name` (the type it gives)"),
        };
        let at = format!("{CONFIG_KEY} rule #{index} ({name:?})");
        check_name(&name).with_context(|| at.clone())?;
        let text = |key: &str| -> Result<Option<String>> {
            match t.get(key) {
                None => Ok(None),
                Some(toml::Value::String(s)) if s.trim().is_empty() => {
                    bail!("{at}: `{key}` is empty")
                }
                Some(toml::Value::String(s)) => Ok(Some(s.trim().to_string())),
                Some(other) => bail!("{at}: `{key}` must be a string, got {}", other.type_str()),
            }
        };
        for key in t.keys() {
            if !KEYS.split(", ").any(|k| k == key) {
                bail!("{at}: unknown key `{key}` (the keys are {KEYS})");
            }
        }
        let path = text("path")?
            .map(|p| {
                if !p.starts_with('/') && !p.starts_with('*') {
                    bail!("{at}: `path` {p:?} must start with `/`");
                }
                Pattern::prefix_or_glob(&p).map_err(|e| anyhow::anyhow!("{at}: `path` {p:?}: {e}"))
            })
            .transpose()?;
        let header = text("header")?
            .map(|h| -> Result<(String, Pattern)> {
                let Some((n, v)) = h.split_once('=') else {
                    bail!("{at}: `header` {h:?} must be `name=value`");
                };
                let (n, v) = (n.trim(), v.trim());
                if n.is_empty() || !n.bytes().all(is_token_byte) {
                    bail!("{at}: `header` {h:?}: {n:?} is not a header name");
                }
                if v.is_empty() {
                    bail!("{at}: `header` {h:?} has an empty value");
                }
                let p = Pattern::exact_or_glob(v)
                    .map_err(|e| anyhow::anyhow!("{at}: `header` {h:?}: {e}"))?;
                Ok((n.to_ascii_lowercase(), p))
            })
            .transpose()?;
        let model = text("model")?
            .map(|m| {
                Pattern::exact_or_glob(&m).map_err(|e| anyhow::anyhow!("{at}: `model` {m:?}: {e}"))
            })
            .transpose()?;
        let input_tokens = t
            .get("input_tokens")
            .map(|v| token_range(&at, v))
            .transpose()?;
        let json_field = text("json_field")?;
        if path.is_none()
            && header.is_none()
            && model.is_none()
            && input_tokens.is_none()
            && json_field.is_none()
        {
            bail!("{at}: matches nothing: give at least one of path, header, model, input_tokens, json_field");
        }
        Ok(Rule {
            name,
            path,
            header,
            model,
            input_tokens,
            json_field,
        })
    }

    fn matches(&self, f: &Facts<'_>) -> bool {
        self.matches_but_tokens(f)
            && self
                .input_tokens
                .is_none_or(|(lo, hi)| f.input_tokens.is_some_and(|n| (lo..=hi).contains(&n)))
    }

    /// Every condition but `input_tokens` holds.
    fn matches_but_tokens(&self, f: &Facts<'_>) -> bool {
        let path = f.path.split(['?', '#']).next().unwrap_or("");
        self.path.as_ref().is_none_or(|p| p.matches(path))
            && self.header.as_ref().is_none_or(|(n, p)| {
                f.headers
                    .iter()
                    .any(|(hn, hv)| hn == n && p.matches(hv.as_str()))
            })
            && self
                .model
                .as_ref()
                .is_none_or(|p| f.model.is_some_and(|m| p.matches(m)))
            && self
                .json_field
                .as_ref()
                .is_none_or(|k| f.json_fields.iter().any(|p| p == k))
    }
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty() {
        bail!("`name` is empty");
    }
    if name.len() > MAX_NAME_BYTES {
        bail!("`name` is longer than {MAX_NAME_BYTES} bytes");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        bail!("`name` may only use letters, digits, `_`, `-` and `.`");
    }
    if BUILT_INS.contains(&name) {
        bail!(
            "`{name}` is a built-in type ({}); a rule adds a type of its own: pick another name",
            BUILT_INS.join(", ")
        );
    }
    if name == crate::vocab::UNKNOWN || name == crate::vocab::OTHER {
        bail!("`{name}` is reserved (metric attributes use it for missing values)");
    }
    Ok(())
}

fn token_range(at: &str, v: &toml::Value) -> Result<(u64, u64)> {
    let toml::Value::Table(t) = v else {
        bail!(
            "{at}: `input_tokens` must be a table such as {{ min = 1000, max = 8000 }}, got {}",
            v.type_str()
        );
    };
    for k in t.keys() {
        if k != "min" && k != "max" {
            bail!("{at}: `input_tokens` has an unknown key `{k}` (min, max)");
        }
    }
    let bound = |k: &str| -> Result<Option<u64>> {
        match t.get(k) {
            None => Ok(None),
            Some(toml::Value::Integer(i)) => u64::try_from(*i)
                .map(Some)
                .map_err(|_| anyhow::anyhow!("{at}: `input_tokens.{k}` is negative ({i})")),
            Some(other) => bail!(
                "{at}: `input_tokens.{k}` must be an integer, got {}",
                other.type_str()
            ),
        }
    };
    let (min, max) = (bound("min")?, bound("max")?);
    if min.is_none() && max.is_none() {
        bail!("{at}: `input_tokens` needs `min`, `max` or both");
    }
    let (lo, hi) = (min.unwrap_or(0), max.unwrap_or(u64::MAX));
    if lo > hi {
        bail!("{at}: `input_tokens` min {lo} is greater than max {hi}");
    }
    Ok((lo, hi))
}

/// RFC 9110 token characters (header names).
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A string pattern: a prefix, an exact value, or a glob.
#[derive(Clone, Debug, PartialEq)]
enum Pattern {
    Prefix(String),
    Exact(String),
    Glob(Glob),
}

impl Pattern {
    fn has_meta(s: &str) -> bool {
        s.contains(['*', '?', '[', '\\'])
    }

    fn prefix_or_glob(s: &str) -> Result<Self, String> {
        if Self::has_meta(s) {
            Glob::new(s).map(Pattern::Glob)
        } else {
            Ok(Pattern::Prefix(s.to_string()))
        }
    }

    fn exact_or_glob(s: &str) -> Result<Self, String> {
        if Self::has_meta(s) {
            Glob::new(s).map(Pattern::Glob)
        } else {
            Ok(Pattern::Exact(s.to_string()))
        }
    }

    fn matches(&self, s: &str) -> bool {
        match self {
            Pattern::Prefix(p) => s.starts_with(p.as_str()),
            Pattern::Exact(p) => s == p,
            Pattern::Glob(g) => g.matches(s),
        }
    }
}

/// A shell-style glob over the whole string: `*` (any run, `/` included),
/// `?` (one character), `[abc]`, `[a-z]`, `[!a-z]`, and `\` escaping the
/// next character.
#[derive(Clone, Debug, PartialEq)]
struct Glob(Vec<Tok>);

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Char(char),
    Any,
    Star,
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

impl Glob {
    fn new(pat: &str) -> Result<Self, String> {
        let mut toks = vec![];
        let mut it = pat.chars().peekable();
        while let Some(c) = it.next() {
            toks.push(match c {
                '*' => {
                    if toks.last() == Some(&Tok::Star) {
                        continue;
                    }
                    Tok::Star
                }
                '?' => Tok::Any,
                '\\' => Tok::Char(
                    it.next()
                        .ok_or_else(|| "bad glob: it ends with a lone `\\`".to_string())?,
                ),
                '[' => {
                    let negated = it.next_if(|c| *c == '!' || *c == '^').is_some();
                    let mut ranges = vec![];
                    let mut first = true;
                    loop {
                        let Some(c) = it.next() else {
                            return Err("bad glob: a `[` is never closed".to_string());
                        };
                        if c == ']' && !first {
                            break;
                        }
                        first = false;
                        let lo = if c == '\\' {
                            it.next()
                                .ok_or_else(|| "bad glob: a `[` is never closed".to_string())?
                        } else {
                            c
                        };
                        if it.peek() == Some(&'-') {
                            it.next();
                            match it.next() {
                                Some(']') => {
                                    ranges.push((lo, lo));
                                    ranges.push(('-', '-'));
                                    break;
                                }
                                Some(hi) => {
                                    if hi < lo {
                                        return Err(format!(
                                            "bad glob: the range `{lo}-{hi}` is backwards"
                                        ));
                                    }
                                    ranges.push((lo, hi));
                                }
                                None => return Err("bad glob: a `[` is never closed".to_string()),
                            }
                        } else {
                            ranges.push((lo, lo));
                        }
                    }
                    Tok::Class { negated, ranges }
                }
                c => Tok::Char(c),
            });
        }
        Ok(Glob(toks))
    }

    /// Iterative match with one backtrack point per `*` (linear in
    /// practice, O(pattern × text) at worst; never recursive).
    fn matches(&self, s: &str) -> bool {
        let text: Vec<char> = s.chars().collect();
        let p = &self.0;
        let (mut i, mut j) = (0usize, 0usize);
        let mut star: Option<(usize, usize)> = None;
        while i < text.len() {
            let one = |t: &Tok, c: char| match t {
                Tok::Char(x) => *x == c,
                Tok::Any => true,
                Tok::Class { negated, ranges } => {
                    ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&c)) != *negated
                }
                Tok::Star => false,
            };
            match p.get(j) {
                Some(Tok::Star) => {
                    star = Some((j, i));
                    j += 1;
                }
                Some(t) if one(t, text[i]) => {
                    i += 1;
                    j += 1;
                }
                _ => match star {
                    Some((sj, si)) => {
                        star = Some((sj, si + 1));
                        j = sj + 1;
                        i = si + 1;
                    }
                    None => return false,
                },
            }
        }
        p[j..].iter().all(|t| *t == Tok::Star)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts<'a>(path: &'a str, endpoint: Endpoint) -> Facts<'a> {
        Facts {
            path,
            endpoint,
            model: None,
            input_tokens: None,
            headers: &[],
            json_fields: &[],
            tools_offered: false,
            tool_calls: false,
        }
    }

    #[test]
    fn a_type_by_input_tokens_is_decided_again_with_the_exact_count() {
        let rules = Rules::parse(
            "[[request_type]]\nname = \"long\"\ninput_tokens = { min = 1000 }\n\
             [[request_type]]\nname = \"rag\"\njson_field = \"documents\"\n\
             [[request_type]]\nname = \"tiny\"\ninput_tokens = { max = 10 }\n",
        )
        .unwrap();
        let f = facts("/v1/chat/completions", Endpoint::Chat);
        let t = rules.by_input_tokens(&f).unwrap();
        // `rag` does not hold (no documents): long, tiny, else chat.
        assert_eq!(t.pick(4000).as_deref(), Some("long"));
        assert_eq!(t.pick(7).as_deref(), Some("tiny"));
        assert_eq!(t.pick(500).as_deref(), Some("chat"));
        // With documents, `rag` ends the list: no rule after it counts.
        let docs = ["documents".to_string()];
        let f = Facts {
            json_fields: &docs,
            ..f
        };
        let t = rules.by_input_tokens(&f).unwrap();
        assert_eq!(t.pick(7).as_deref(), Some("rag"));
        assert_eq!(t.pick(1000).as_deref(), Some("long"));
        // The same answers as classifying with the count.
        for n in [0, 7, 10, 11, 999, 1000, 5000] {
            let g = Facts {
                input_tokens: Some(n),
                ..f
            };
            assert_eq!(t.pick(n), rules.classify(&g), "{n}");
        }
        // No rule on tokens: nothing to decide again.
        let plain =
            Rules::parse("[[request_type]]\nname = \"rag\"\njson_field = \"documents\"\n").unwrap();
        assert_eq!(plain.by_input_tokens(&f), None);
    }

    #[test]
    fn built_ins_come_from_the_endpoint_tools_and_batch_paths() {
        let r = Rules::default();
        let chat = facts("/v1/chat/completions", Endpoint::Chat);
        assert_eq!(r.classify(&chat).as_deref(), Some("chat"));
        let c = facts("/v1/completions", Endpoint::Completion);
        assert_eq!(r.classify(&c).as_deref(), Some("completion"));
        let e = facts("/v1/embeddings", Endpoint::Embedding);
        assert_eq!(r.classify(&e).as_deref(), Some("embedding"));
        let offered = Facts {
            tools_offered: true,
            ..chat
        };
        assert_eq!(r.classify(&offered).as_deref(), Some("tool_call"));
        let called = Facts {
            tool_calls: true,
            ..chat
        };
        assert_eq!(r.classify(&called).as_deref(), Some("tool_call"));
        for p in [
            "/v1/batches",
            "/v1/batches/batch_abc/cancel",
            "/v1/batches?limit=2",
        ] {
            assert_eq!(
                r.classify(&facts(p, Endpoint::Other)).as_deref(),
                Some("batch"),
                "{p}"
            );
        }
        assert_eq!(r.classify(&facts("/v1/batchesx", Endpoint::Other)), None);
        assert_eq!(r.classify(&facts("/health", Endpoint::Other)), None);
    }

    const CONFIG: &str = r#"
pid = [1]
no-console = true

[[request_type]]
name = "rag"
json_field = "documents"

[[request_type]]
name = "summarization"
path = "/v1/chat/*"
header = "X-Task=summarize"
input_tokens = { min = 1000 }

[[request_type]]
name = "long-context"
model = "llama-3-*"
input_tokens = { min = 32000, max = 128000 }

[[request_type]]
name = "internal"
path = "/internal/"
"#;

    #[test]
    fn rules_from_a_config_file_classify_in_order_before_the_built_ins() {
        let r = Rules::parse(CONFIG).unwrap();
        assert_eq!(r.rules().len(), 4);
        assert_eq!(r.header_names(), vec!["x-task".to_string()]);
        assert_eq!(r.json_fields(), vec!["documents".to_string()]);
        let chat = facts("/v1/chat/completions", Endpoint::Chat);
        let docs = ["documents".to_string()];
        let rag = Facts {
            json_fields: &docs,
            tools_offered: true,
            ..chat
        };
        assert_eq!(r.classify(&rag).as_deref(), Some("rag"), "rules first");
        let hs = [("x-task".to_string(), "summarize".to_string())];
        let summ = Facts {
            headers: &hs,
            input_tokens: Some(5000),
            ..chat
        };
        assert_eq!(r.classify(&summ).as_deref(), Some("summarization"));
        let short = Facts {
            input_tokens: Some(10),
            ..summ
        };
        assert_eq!(
            r.classify(&short).as_deref(),
            Some("chat"),
            "every condition must hold"
        );
        let other_value = [("x-task".to_string(), "translate".to_string())];
        let tr = Facts {
            headers: &other_value,
            ..summ
        };
        assert_eq!(r.classify(&tr).as_deref(), Some("chat"));
        let long = Facts {
            model: Some("llama-3-70b"),
            input_tokens: Some(64000),
            ..chat
        };
        assert_eq!(r.classify(&long).as_deref(), Some("long-context"));
        let at_max = Facts {
            input_tokens: Some(128000),
            ..long
        };
        assert_eq!(
            r.classify(&at_max).as_deref(),
            Some("long-context"),
            "bounds are inclusive"
        );
        let over = Facts {
            input_tokens: Some(128001),
            ..long
        };
        assert_eq!(r.classify(&over).as_deref(), Some("chat"));
        let no_count = Facts {
            input_tokens: None,
            ..long
        };
        assert_eq!(r.classify(&no_count).as_deref(), Some("chat"));
        let internal = facts("/internal/score?x=1", Endpoint::Other);
        assert_eq!(
            r.classify(&internal).as_deref(),
            Some("internal"),
            "a prefix"
        );
        // No rules in the file: built-ins only.
        assert!(Rules::parse("pid = [1]\n").unwrap().is_empty());
    }

    /// Each invalid rule: the error names the rule (number and name) and
    /// the problem, and nothing is returned (no half-valid rule set).
    #[test]
    fn every_invalid_rule_is_refused_with_its_number_name_and_problem() {
        let ok = "[[request_type]]\nname = \"rag\"\njson_field = \"documents\"\n\n";
        let cases: &[(&str, &str)] = &[
            ("name = \"x\"\npaht = \"/v1\"", "unknown key `paht`"),
            ("name = \"x\"", "matches nothing"),
            ("path = \"/v1\"", "has no `name`"),
            ("name = \"\"\npath = \"/v1\"", "`name` is empty"),
            ("name = 3\npath = \"/v1\"", "`name` must be a string"),
            ("name = \"a b\"\npath = \"/v1\"", "may only use"),
            (
                "name = \"chat\"\npath = \"/v1\"",
                "`chat` is a built-in type",
            ),
            (
                "name = \"tool_call\"\npath = \"/v1\"",
                "`tool_call` is a built-in type",
            ),
            ("name = \"other\"\npath = \"/v1\"", "reserved"),
            ("name = \"x\"\npath = \"\"", "`path` is empty"),
            ("name = \"x\"\npath = \"v1/chat\"", "must start with `/`"),
            ("name = \"x\"\npath = \"/v1/[chat\"", "bad glob"),
            ("name = \"x\"\nmodel = \"llama-[z-a]\"", "backwards"),
            ("name = \"x\"\nmodel = \"a\\\\\"", "lone `\\`"),
            ("name = \"x\"\nmodel = 7", "`model` must be a string"),
            ("name = \"x\"\nheader = \"x-task\"", "must be `name=value`"),
            ("name = \"x\"\nheader = \"=v\"", "is not a header name"),
            ("name = \"x\"\nheader = \"x-task=\"", "empty value"),
            ("name = \"x\"\njson_field = \"  \"", "`json_field` is empty"),
            (
                "name = \"x\"\ninput_tokens = { min = 10, max = 5 }",
                "min 10 is greater than max 5",
            ),
            (
                "name = \"x\"\ninput_tokens = { }",
                "needs `min`, `max` or both",
            ),
            ("name = \"x\"\ninput_tokens = { min = -1 }", "negative"),
            (
                "name = \"x\"\ninput_tokens = { min = 1.5 }",
                "must be an integer",
            ),
            (
                "name = \"x\"\ninput_tokens = { least = 1 }",
                "unknown key `least`",
            ),
            ("name = \"x\"\ninput_tokens = 100", "must be a table"),
        ];
        for (rule, want) in cases {
            let text = format!("{ok}[[request_type]]\n{rule}\n");
            let err = format!("{:#}", Rules::parse(&text).unwrap_err());
            assert!(err.contains(want), "{rule:?}: {err}");
            assert!(err.contains("rule #2"), "names the rule's number: {err}");
            if rule.contains("name = \"x\"") {
                assert!(err.contains("(\"x\")"), "names the rule: {err}");
            }
        }
        let err = format!("{:#}", Rules::parse("request_type = \"rag\"").unwrap_err());
        assert!(err.contains("array of tables"), "{err}");
        let err = format!(
            "{:#}",
            Rules::parse("[request_type]\nname = \"x\"").unwrap_err()
        );
        assert!(err.contains("array of tables"), "{err}");
    }

    #[test]
    fn a_bad_rule_is_named_by_its_number_and_name() {
        let err = format!(
            "{:#}",
            Rules::parse("[[request_type]]\nname = \"chat\"\npath = \"/\"\n").unwrap_err()
        );
        assert!(err.contains("rule #1 (\"chat\")"), "{err}");
    }

    #[test]
    fn globs_match_whole_strings() {
        let g = |p: &str| Glob::new(p).unwrap();
        assert!(g("llama-3-*").matches("llama-3-8b-instruct"));
        assert!(!g("llama-3-*").matches("xllama-3-8b"));
        assert!(g("*-instruct").matches("qwen-7b-instruct"));
        assert!(g("m?del").matches("model") && !g("m?del").matches("mdel"));
        assert!(g("v[0-9]").matches("v7") && !g("v[0-9]").matches("vx"));
        assert!(g("v[!0-9]").matches("vx") && !g("v[!0-9]").matches("v1"));
        assert!(g("a[-b]").matches("a-") && g("a[b-]").matches("a-"));
        assert!(g("[]]").matches("]"));
        assert!(g("\\*").matches("*") && !g("\\*").matches("x"));
        assert!(g("/v1/*/completions").matches("/v1/chat/completions"));
        assert!(g("**").matches("") && g("a*b*c").matches("aXbYbc"));
        assert!(!g("a*b*c").matches("aXbYb"));
        // Many stars on a long text stay cheap (no exponential backtracking).
        let long = "a".repeat(10_000);
        assert!(!g("*a*a*a*a*a*a*b").matches(&long));
    }
}
