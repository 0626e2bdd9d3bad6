//! The agent's rooms and the import rule (docs/architecture.md, "Rooms"):
//! no module imports from a room on a floor above its own. Read from the
//! source: every `crate::ROOM` a file of `agent/src` names outside
//! comments, in paths and in `use crate::{…}` groups. The upward imports
//! still there are listed with their reason; one that is gone must leave
//! the list too, so the list stays the truth.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

/// Floors, lowest first: a room may import its own floor and those below.
const FLOORS: &[&[&str]] = &[
    // The contracts' vocabulary and data: records, socket events, names.
    // The engine catalogue (data about each engine) is here too.
    &["vocab", "event", "record", "selftraffic", "engines"],
    // Sources of facts: the kernel capture, capture files, identity rules.
    // Host facts: /proc, engine discovery, the Kubernetes API's pods.
    &["capture", "capfile", "identity", "host", "tokenize"],
    // Turning facts into records and events.
    &["decode", "source"],
    // The stage contracts every feature implements or reads: Sink, Task,
    // Enricher, NodeState, Health, the timeline event, the GPU sample.
    &["stage"],
    // Features: GPU join and sampling, engines' own metrics, pod names,
    // timeline detectors.
    &["gpu", "enginemetrics", "timeline"],
    // Outputs.
    &["sinks"],
    // The pipeline, the plan and the drivers.
    &["pipeline"],
];

/// Rooms that never import one another, whatever their floors: the
/// features see each other, and the sinks see the features, only through
/// the stage contracts (a feature hands the OTLP sink its instruments as a
/// `stage::InstrumentSet`).
const APART: &[&str] = &["gpu", "enginemetrics", "timeline", "sinks"];

/// Upward imports not yet removed: (room, room it imports, why).
const KNOWN_UPWARD: &[(&str, &str, &str)] = &[];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The rooms `text` names as `crate::ROOM`, directly or in a use group.
fn imported_rooms(text: &str) -> BTreeSet<String> {
    let code: String = text
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level names of the group: split on commas at depth 0.
            let mut depth = 0;
            let mut start = 0;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        out.insert(ident(&group[start..j]));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.insert(ident(&group[start..j]));
                        start = j + 1;
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(ident(rest));
        }
    }
    out.retain(|r| !r.is_empty());
    out
}

#[test]
fn no_room_imports_a_room_on_a_floor_above_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../agent/src");
    let floor_of = |room: &str| FLOORS.iter().position(|f| f.contains(&room));
    let mut files = vec![];
    rust_files(&src, &mut files);
    let mut upward: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap().to_string_lossy().to_string();
        let room = rel
            .split('/')
            .next()
            .unwrap()
            .trim_end_matches(".rs")
            .to_string();
        if matches!(room.as_str(), "lib" | "main") {
            continue; // the crate root and the binary sit on top
        }
        let Some(own) = floor_of(&room) else {
            panic!(
                "{rel}: room `{room}` is on no floor: add it to FLOORS and docs/architecture.md"
            );
        };
        for other in imported_rooms(&std::fs::read_to_string(f).unwrap()) {
            if other == room {
                continue;
            }
            let Some(theirs) = floor_of(&other) else {
                panic!("{rel} imports crate::{other}, a room on no floor");
            };
            if theirs > own || (APART.contains(&room.as_str()) && APART.contains(&other.as_str())) {
                upward
                    .entry((room.clone(), other))
                    .or_default()
                    .push(rel.clone());
            }
        }
    }
    let known: BTreeSet<(String, String)> = KNOWN_UPWARD
        .iter()
        .map(|(a, b, _)| (a.to_string(), b.to_string()))
        .collect();
    let new: Vec<_> = upward.iter().filter(|(k, _)| !known.contains(k)).collect();
    assert!(
        new.is_empty(),
        "imports from a room above, or between rooms kept apart: {new:?} (docs/architecture.md, \"Rooms\")"
    );
    let gone: Vec<_> = known.iter().filter(|k| !upward.contains_key(*k)).collect();
    assert!(
        gone.is_empty(),
        "these upward imports are gone: remove them from KNOWN_UPWARD: {gone:?}"
    );
}

#[test]
fn imports_are_read_from_paths_and_use_groups_but_not_comments() {
    let text = "use crate::{a::{B, C}, d::E, f};\n// crate::g\nlet x = crate::h::i();";
    let got: Vec<String> = imported_rooms(text).into_iter().collect();
    assert_eq!(got, ["a", "d", "f", "h"]);
}
