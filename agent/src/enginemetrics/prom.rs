//! Prometheus text exposition format (version 0.0.4, and the parts of
//! OpenMetrics 1.0 a classic scraper meets: `# EOF`, exemplars, float
//! timestamps, `unknown`/`gaugehistogram`/`info`/`stateset` types), parsed
//! from an untrusted HTTP body.
//!
//! Owns: turning bytes into samples (name, labels, value, timestamp) and the
//! `# HELP` / `# TYPE` metadata. Bounded: a body over
//! [`Limits::max_body_bytes`] is refused, parsing stops after
//! [`Limits::max_series`] samples (the result says it was truncated), a line
//! that does not parse is skipped and counted. Never panics, whatever the
//! bytes (a property test feeds it random and mutated input).
//!
//! Must not: know any engine's metric names (that is `super`), do I/O, or
//! allocate per sample on the hot path ([`parse_with`] hands out borrowed
//! samples; only label values with escapes are copied).
//!
//! Written here rather than taken from the `prometheus-parse` crate: that
//! crate (a fork of a fork, last released 2023) pulls in `regex`, `chrono`
//! and `itertools`, has no size or series bounds, and parses line by line
//! from an iterator of owned `String`s; what the agent needs is one bounded
//! pass over a byte buffer.

use std::{borrow::Cow, collections::HashMap, fmt};

/// Bounds on what one exposition may cost.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Larger bodies are refused ([`ParseError::TooLarge`]).
    pub max_body_bytes: usize,
    /// Samples after this many are not read ([`Summary::truncated`]).
    pub max_series: usize,
    /// Labels on one sample; a line with more is skipped as malformed.
    pub max_labels: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 4 << 20,
            max_series: 200_000,
            max_labels: 64,
        }
    }
}

/// The `# TYPE` of a metric family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
    Summary,
    /// `untyped`, OpenMetrics' `unknown`, and anything not recognised.
    Untyped,
    /// OpenMetrics `gaugehistogram`.
    GaugeHistogram,
    /// OpenMetrics `info` and `stateset`.
    Info,
}

impl MetricType {
    fn of(s: &str) -> MetricType {
        match s {
            "counter" => MetricType::Counter,
            "gauge" => MetricType::Gauge,
            "histogram" => MetricType::Histogram,
            "summary" => MetricType::Summary,
            "gaugehistogram" => MetricType::GaugeHistogram,
            "info" | "stateset" => MetricType::Info,
            _ => MetricType::Untyped,
        }
    }
}

/// One sample line, borrowing from the body.
#[derive(Clone, Debug, PartialEq)]
pub struct SampleRef<'a> {
    pub name: Cow<'a, str>,
    pub labels: Vec<(Cow<'a, str>, Cow<'a, str>)>,
    pub value: f64,
    /// Milliseconds since the UNIX epoch, when the line carries one.
    pub timestamp_ms: Option<i64>,
}

impl SampleRef<'_> {
    /// The value of label `name`, if present.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_ref())
    }
}

/// What a pass over a body met besides the samples.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    pub samples: usize,
    /// Lines that were neither a sample, a comment nor blank.
    pub bad_lines: usize,
    /// Parsing stopped at [`Limits::max_series`].
    pub truncated: bool,
}

/// Why a body could not be read at all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParseError {
    TooLarge {
        len_bytes: usize,
        max_bytes: usize,
    },
    /// Not one line parsed as a sample, and some did not parse: not an
    /// exposition (an HTML error page, a JSON body).
    NotAnExposition {
        bad_lines: usize,
    },
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::TooLarge {
                len_bytes,
                max_bytes,
            } => write!(
                f,
                "metrics body of {len_bytes} bytes is over the {max_bytes}-byte limit"
            ),
            ParseError::NotAnExposition { bad_lines } => write!(
                f,
                "not a Prometheus text exposition ({bad_lines} malformed lines, no sample)"
            ),
        }
    }
}

impl std::error::Error for ParseError {}

/// Calls `each` with every sample of `body` (in order) and `meta` with
/// every `# TYPE` line; returns what was met. Malformed lines are skipped.
pub fn parse_with<'a>(
    body: &'a [u8],
    limits: &Limits,
    mut each: impl FnMut(SampleRef<'a>),
    mut meta: impl FnMut(&'a str, MetricType),
) -> Result<Summary, ParseError> {
    if body.len() > limits.max_body_bytes {
        return Err(ParseError::TooLarge {
            len_bytes: body.len(),
            max_bytes: limits.max_body_bytes,
        });
    }
    let mut sum = Summary::default();
    for raw in body.split(|&b| b == b'\n') {
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        // A line that is not UTF-8 is malformed; the others still count.
        let Ok(line) = std::str::from_utf8(raw) else {
            sum.bad_lines += 1;
            continue;
        };
        let line = line.trim_start_matches([' ', '\t']);
        if line.trim_end().is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.trim_start().splitn(3, [' ', '\t']);
            match (words.next(), words.next(), words.next()) {
                (Some("TYPE"), Some(name), Some(kind)) => meta(name, MetricType::of(kind.trim())),
                (Some("EOF"), None, None) => break,
                _ => {}
            }
            continue;
        }
        if sum.samples >= limits.max_series {
            sum.truncated = true;
            break;
        }
        match sample_line(line, limits) {
            Some(s) => {
                sum.samples += 1;
                each(s);
            }
            None => sum.bad_lines += 1,
        }
    }
    if sum.samples == 0 && sum.bad_lines > 0 {
        return Err(ParseError::NotAnExposition {
            bad_lines: sum.bad_lines,
        });
    }
    Ok(sum)
}

/// An owned sample, for callers that keep them.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
    pub timestamp_ms: Option<i64>,
}

impl Sample {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A whole exposition, owned: samples in order, families' types and help.
#[derive(Clone, Debug, Default)]
pub struct Exposition {
    pub samples: Vec<Sample>,
    pub types: HashMap<String, MetricType>,
    pub help: HashMap<String, String>,
    pub summary: Summary,
}

/// One histogram family's series summed over every label set (other than
/// `le`): buckets as (upper bound, cumulative count), ascending.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Histogram {
    pub buckets: Vec<(f64, f64)>,
    pub sum: f64,
    pub count: f64,
}

impl Exposition {
    /// The samples named `name`.
    pub fn get<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'s Sample> + 's {
        self.samples.iter().filter(move |s| s.name == name)
    }

    /// The family a sample name belongs to: `x_bucket`, `x_sum`, `x_count`
    /// (and `x_created`) belong to `x` when `x` is typed histogram or
    /// summary; anything else is its own family.
    pub fn family_of<'s>(&self, name: &'s str) -> &'s str {
        for suffix in ["_bucket", "_sum", "_count", "_created", "_gsum", "_gcount"] {
            if let Some(base) = name.strip_suffix(suffix) {
                if matches!(
                    self.types.get(base),
                    Some(MetricType::Histogram | MetricType::Summary | MetricType::GaugeHistogram)
                ) {
                    return base;
                }
            }
        }
        name
    }

    /// Histogram `base` summed over its label sets; `None` when it has no
    /// `_bucket` series.
    pub fn histogram(&self, base: &str) -> Option<Histogram> {
        let bucket = format!("{base}_bucket");
        let mut buckets: Vec<(f64, f64)> = vec![];
        for s in self.get(&bucket) {
            let Some(le) = s.label("le").and_then(parse_float) else {
                continue;
            };
            match buckets.iter_mut().find(|(b, _)| *b == le) {
                Some((_, n)) => *n += s.value,
                None => buckets.push((le, s.value)),
            }
        }
        if buckets.is_empty() {
            return None;
        }
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total = |suffix: &str| {
            let name = format!("{base}{suffix}");
            self.get(&name).map(|s| s.value).sum::<f64>()
        };
        Some(Histogram {
            buckets,
            sum: total("_sum"),
            count: total("_count"),
        })
    }
}

/// Parses a whole body into owned samples and metadata.
pub fn parse(body: &[u8], limits: &Limits) -> Result<Exposition, ParseError> {
    let mut samples = vec![];
    let mut types = HashMap::new();
    let summary = parse_with(
        body,
        limits,
        |s| {
            samples.push(Sample {
                name: s.name.into_owned(),
                labels: s
                    .labels
                    .into_iter()
                    .map(|(k, v)| (k.into_owned(), v.into_owned()))
                    .collect(),
                value: s.value,
                timestamp_ms: s.timestamp_ms,
            })
        },
        |name, kind| {
            types.insert(name.to_string(), kind);
        },
    )?;
    // HELP lines: a second, cheap pass (only comment lines are looked at).
    let mut help = HashMap::new();
    for raw in body.split(|&b| b == b'\n') {
        let Ok(line) = std::str::from_utf8(raw.strip_suffix(b"\r").unwrap_or(raw)) else {
            continue;
        };
        let Some(rest) = line.trim_start().strip_prefix('#') else {
            continue;
        };
        let rest = rest.trim_start();
        if let Some(rest) = rest.strip_prefix("HELP") {
            if let Some((name, text)) = rest.trim_start().split_once([' ', '\t']) {
                help.insert(name.to_string(), unescape_help(text));
            }
        }
    }
    Ok(Exposition {
        samples,
        types,
        help,
        summary,
    })
}

fn unescape_help(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('\\') => out.push('\\'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

/// `+Inf`, `-Inf`, `NaN` (any case) and Go/Python float syntax.
pub fn parse_float(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "+inf" | "Inf" | "inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        _ => s.parse::<f64>().ok(),
    }
}

fn is_name_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b == b':'
}

fn is_name_byte(b: u8) -> bool {
    is_name_start(b) || b.is_ascii_digit()
}

/// A cursor over one line.
struct Cur<'a> {
    s: &'a str,
    i: usize,
}

impl<'a> Cur<'a> {
    fn peek(&self) -> Option<u8> {
        self.s.as_bytes().get(self.i).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.i += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        if self.peek() == Some(b) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    /// A bare metric or label name.
    fn name(&mut self) -> Option<&'a str> {
        let start = self.i;
        let bytes = self.s.as_bytes();
        if !bytes.get(self.i).copied().is_some_and(is_name_start) {
            return None;
        }
        while bytes.get(self.i).copied().is_some_and(is_name_byte) {
            self.i += 1;
        }
        self.s.get(start..self.i)
    }

    /// A double-quoted string with `\\`, `\"` and `\n` escapes.
    fn quoted(&mut self) -> Option<Cow<'a, str>> {
        if !self.eat(b'"') {
            return None;
        }
        let start = self.i;
        let bytes = self.s.as_bytes();
        let mut owned: Option<String> = None;
        let mut run = start;
        loop {
            match bytes.get(self.i).copied()? {
                b'"' => {
                    let tail = self.s.get(run..self.i)?;
                    self.i += 1;
                    return Some(match owned {
                        Some(mut o) => {
                            o.push_str(tail);
                            Cow::Owned(o)
                        }
                        None => Cow::Borrowed(self.s.get(start..self.i - 1)?),
                    });
                }
                b'\\' => {
                    let o = owned.get_or_insert_with(String::new);
                    o.push_str(self.s.get(run..self.i)?);
                    let esc = bytes.get(self.i + 1).copied()?;
                    match esc {
                        b'n' => o.push('\n'),
                        b'\\' => o.push('\\'),
                        b'"' => o.push('"'),
                        // Unknown escapes are kept as written.
                        _ => {
                            o.push('\\');
                            // Multi-byte characters: copy the whole char.
                            let ch = self.s.get(self.i + 1..)?.chars().next()?;
                            o.push(ch);
                            self.i += ch.len_utf8() - 1;
                        }
                    }
                    self.i += 2;
                    run = self.i;
                }
                _ => self.i += 1,
            }
        }
    }

    /// The next whitespace-delimited token.
    fn token(&mut self) -> Option<&'a str> {
        self.skip_ws();
        let start = self.i;
        while matches!(self.peek(), Some(b) if b != b' ' && b != b'\t') {
            self.i += 1;
        }
        if self.i == start {
            None
        } else {
            self.s.get(start..self.i)
        }
    }
}

/// `name{labels} value [timestamp] [# exemplar]`, or the quoted-name form
/// `{"name", label="v"} value`. `None` when malformed.
fn sample_line<'a>(line: &'a str, limits: &Limits) -> Option<SampleRef<'a>> {
    let mut c = Cur { s: line, i: 0 };
    let mut name: Option<Cow<'a, str>> = c.name().map(Cow::Borrowed);
    let mut labels = vec![];
    // Blanks may stand between the name and its labels.
    let after_name = c.i;
    c.skip_ws();
    if !matches!(c.peek(), Some(b'{')) {
        c.i = after_name;
    }
    if c.eat(b'{') {
        loop {
            c.skip_ws();
            if c.eat(b'}') {
                break;
            }
            let quoted = c.peek()? == b'"';
            let key: Cow<'a, str> = if quoted {
                c.quoted()?
            } else {
                Cow::Borrowed(c.name()?)
            };
            c.skip_ws();
            if c.eat(b'=') {
                c.skip_ws();
                let value = c.quoted()?;
                if labels.len() >= limits.max_labels {
                    return None;
                }
                labels.push((key, value));
            } else if name.is_none() && quoted {
                // A quoted metric name inside the braces.
                name = Some(key);
            } else {
                return None;
            }
            c.skip_ws();
            if c.eat(b',') {
                continue;
            }
            c.skip_ws();
            if !c.eat(b'}') {
                return None;
            }
            break;
        }
    }
    let name = name?;
    if name.is_empty() {
        return None;
    }
    // The value must be separated from the name or the labels.
    if !matches!(c.peek(), Some(b' ' | b'\t')) {
        return None;
    }
    let value = parse_float(c.token()?)?;
    let timestamp_ms = match c.token() {
        None => None,
        Some(t) if t.starts_with('#') => None,
        Some(t) => Some(match t.parse::<i64>() {
            Ok(ms) => ms,
            // OpenMetrics: seconds with a fraction.
            Err(_) => {
                let s = t.parse::<f64>().ok().filter(|s| s.is_finite())?;
                (s * 1000.0) as i64
            }
        }),
    };
    // Anything after the timestamp must be an exemplar.
    c.skip_ws();
    if timestamp_ms.is_some() && c.peek().is_some_and(|b| b != b'#') {
        return None;
    }
    Some(SampleRef {
        name,
        labels,
        value,
        timestamp_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn one(line: &str) -> Option<Sample> {
        let e = parse(line.as_bytes(), &Limits::default()).ok()?;
        e.samples.into_iter().next()
    }

    #[test]
    fn plain_sample_with_labels_and_timestamp() {
        let s = one(r#"http_requests_total{method="post",code="200"} 1027 1395066363000"#)
            .expect("sample");
        assert_eq!(s.name, "http_requests_total");
        assert_eq!(s.label("method"), Some("post"));
        assert_eq!(s.label("code"), Some("200"));
        assert_eq!(s.value, 1027.0);
        assert_eq!(s.timestamp_ms, Some(1395066363000));
    }

    #[test]
    fn label_values_unescape_backslash_quote_and_newline() {
        let s = one(r#"msdos_file_access_time_seconds{path="C:\\DIR\\FILE.TXT",error="Cannot find file:\n\"FILE.TXT\""} 1.458255915e9"#)
            .expect("sample");
        assert_eq!(s.label("path"), Some(r"C:\DIR\FILE.TXT"));
        assert_eq!(s.label("error"), Some("Cannot find file:\n\"FILE.TXT\""));
        assert_eq!(s.value, 1.458255915e9);
    }

    #[test]
    fn special_values_nan_and_infinities() {
        assert!(one("x NaN").expect("nan").value.is_nan());
        assert_eq!(one("x +Inf").expect("inf").value, f64::INFINITY);
        assert_eq!(one("x -Inf").expect("-inf").value, f64::NEG_INFINITY);
        assert_eq!(one("x 1e+06").expect("exp").value, 1e6);
        assert_eq!(one("x -0.5").expect("neg").value, -0.5);
    }

    #[test]
    fn metric_names_may_hold_colons_as_engines_use_them() {
        let s = one(r#"vllm:num_requests_waiting{engine="0",model_name="m"} 3.0"#).expect("s");
        assert_eq!(s.name, "vllm:num_requests_waiting");
        assert_eq!(s.value, 3.0);
    }

    #[test]
    fn trailing_comma_whitespace_and_crlf_are_accepted() {
        let e = parse(
            b"a{x=\"1\",} 2\r\n  b { y = \"2\" } 3 \r\n\tc 4\t\r\n",
            &Limits::default(),
        )
        .expect("parse");
        let got: Vec<_> = e.samples.iter().map(|s| (&s.name[..], s.value)).collect();
        assert_eq!(got, vec![("a", 2.0), ("b", 3.0), ("c", 4.0)]);
        assert_eq!(e.samples[1].label("y"), Some("2"));
    }

    #[test]
    fn help_and_type_lines_are_metadata_not_samples() {
        let body = b"# HELP tgi_queue_size Current queue size\\nwith a backslash \\\\\n\
# TYPE tgi_queue_size gauge\n\
# just a comment\n\
\n\
tgi_queue_size 7\n";
        let e = parse(body, &Limits::default()).expect("parse");
        assert_eq!(e.samples.len(), 1);
        assert_eq!(e.types.get("tgi_queue_size"), Some(&MetricType::Gauge));
        assert_eq!(
            e.help.get("tgi_queue_size").map(String::as_str),
            Some("Current queue size\nwith a backslash \\")
        );
        assert_eq!(e.summary.bad_lines, 0);
    }

    #[test]
    fn histogram_buckets_sum_and_count_belong_to_their_family() {
        let body = br#"# TYPE lat_seconds histogram
lat_seconds_bucket{le="0.1",model_name="a"} 1
lat_seconds_bucket{le="1.0",model_name="a"} 3
lat_seconds_bucket{le="+Inf",model_name="a"} 4
lat_seconds_sum{model_name="a"} 2.5
lat_seconds_count{model_name="a"} 4
lat_seconds_bucket{le="0.1",model_name="b"} 0
lat_seconds_bucket{le="1.0",model_name="b"} 1
lat_seconds_bucket{le="+Inf",model_name="b"} 1
lat_seconds_sum{model_name="b"} 0.5
lat_seconds_count{model_name="b"} 1
"#;
        let e = parse(body, &Limits::default()).expect("parse");
        assert_eq!(e.family_of("lat_seconds_bucket"), "lat_seconds");
        assert_eq!(e.family_of("lat_seconds_count"), "lat_seconds");
        assert_eq!(e.family_of("other_count"), "other_count");
        let h = e.histogram("lat_seconds").expect("histogram");
        assert_eq!(
            h.buckets,
            vec![(0.1, 1.0), (1.0, 4.0), (f64::INFINITY, 5.0)]
        );
        assert_eq!(h.sum, 3.0);
        assert_eq!(h.count, 5.0);
    }

    #[test]
    fn openmetrics_eof_exemplars_and_float_timestamps() {
        let body = b"# TYPE a counter\n\
a_total 5 # {trace_id=\"abc\"} 1.0 1520879607.789\n\
b 1 1520879607.789\n\
# EOF\n\
c 9\n";
        let e = parse(body, &Limits::default()).expect("parse");
        let names: Vec<_> = e.samples.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, vec!["a_total", "b"], "nothing after # EOF");
        assert_eq!(e.samples[0].timestamp_ms, None);
        assert_eq!(e.samples[1].timestamp_ms, Some(1520879607789));
    }

    #[test]
    fn quoted_utf8_metric_names_parse() {
        let s = one(r#"{"my.metric", "some.label"="v"} 2"#).expect("sample");
        assert_eq!(s.name, "my.metric");
        assert_eq!(s.label("some.label"), Some("v"));
    }

    #[test]
    fn malformed_lines_are_skipped_and_counted() {
        let body = b"good 1\nbad{ 2\nalso bad\n1starts_with_digit 3\nx{a=\"1\"}4\ngood2 2 notatimestamp\nfine 5\n";
        let e = parse(body, &Limits::default()).expect("parse");
        let names: Vec<_> = e.samples.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, vec!["good", "fine"]);
        assert_eq!(e.summary.bad_lines, 5);
    }

    #[test]
    fn a_body_with_no_sample_and_garbage_is_not_an_exposition() {
        let err =
            parse(b"<html><body>Not Found</body></html>\n", &Limits::default()).expect_err("html");
        assert_eq!(err, ParseError::NotAnExposition { bad_lines: 1 });
        // Empty or comment-only bodies are valid, just empty.
        assert_eq!(
            parse(b"", &Limits::default()).expect("empty").samples,
            vec![]
        );
        assert_eq!(
            parse(b"# HELP x y\n", &Limits::default())
                .expect("comments")
                .samples,
            vec![]
        );
    }

    #[test]
    fn body_over_the_size_limit_is_refused() {
        let limits = Limits {
            max_body_bytes: 10,
            ..Limits::default()
        };
        assert_eq!(
            parse(b"a 1\nb 2\nc 3\n", &limits).expect_err("too large"),
            ParseError::TooLarge {
                len_bytes: 12,
                max_bytes: 10
            }
        );
    }

    #[test]
    fn parsing_stops_at_the_series_limit_and_says_so() {
        let limits = Limits {
            max_series: 2,
            ..Limits::default()
        };
        let e = parse(b"a 1\nb 2\nc 3\n", &limits).expect("parse");
        assert_eq!(e.samples.len(), 2);
        assert!(e.summary.truncated);
    }

    #[test]
    fn too_many_labels_is_malformed() {
        let limits = Limits {
            max_labels: 2,
            ..Limits::default()
        };
        let e = parse(b"a{x=\"1\",y=\"2\",z=\"3\"} 1\nb 2\n", &limits).expect("parse");
        assert_eq!(e.samples.len(), 1);
        assert_eq!(e.summary.bad_lines, 1);
    }

    #[test]
    fn unescaped_label_values_are_borrowed_not_copied() {
        let mut borrowed = None;
        parse_with(
            br#"a{x="plain",y="esc\"aped"} 1"#,
            &Limits::default(),
            |s| {
                borrowed = Some(
                    s.labels
                        .iter()
                        .map(|(_, v)| matches!(v, Cow::Borrowed(_)))
                        .collect::<Vec<_>>(),
                )
            },
            |_, _| {},
        )
        .expect("parse");
        assert_eq!(borrowed, Some(vec![true, false]));
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = parse(&body, &Limits::default());
        }

        #[test]
        fn mutated_expositions_never_panic(
            cut in 0usize..400,
            flips in proptest::collection::vec((0usize..400, any::<u8>()), 0..8),
        ) {
            let mut body = br#"# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m\"q\\"} 3.0 1700000000000
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} NaN
{"quoted.name",a="b"} -Inf # {t="1"} 2
"#.to_vec();
            for (at, b) in flips {
                if let Some(x) = body.get_mut(at) { *x = b; }
            }
            body.truncate(cut.min(body.len()));
            let _ = parse(&body, &Limits::default());
        }

        #[test]
        fn generated_label_values_round_trip(v in "[ -~\\n]{0,40}") {
            let escaped = v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
            let line = format!("m{{k=\"{escaped}\"}} 1");
            let s = one(&line).expect("sample");
            prop_assert_eq!(s.label("k"), Some(v.as_str()));
        }
    }
}
