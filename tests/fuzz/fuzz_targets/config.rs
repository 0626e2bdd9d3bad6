//! The agent's config file (`--config FILE`): TOML with run options,
//! `[[request_type]]` rules and `[events]` thresholds. Parsed and applied
//! to default flags: an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokentap::pipeline::{config::ConfigFile, plan::RunFlags};

struct Nothing;

impl tokentap::pipeline::config::Given for Nothing {
    fn on_command_line(&self, _: &str) -> bool {
        false
    }
}

fuzz_target!(|input: &[u8]| {
    let Ok(text) = std::str::from_utf8(input) else {
        return;
    };
    if let Ok(c) = ConfigFile::parse(text, std::path::Path::new("fuzz.toml")) {
        let mut flags = RunFlags::default();
        let _ = c.apply(&mut flags, &Nothing);
    }
});
