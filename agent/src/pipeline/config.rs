//! The config file (`tokentap run --config FILE`, `tokentap replay
//! --config FILE`), read once and parsed once: its flat keys are `run`'s
//! options by their long names, read into [`RunFlags`] (serde, the same
//! structure and checks as the command line); `[[request_type]]` tables
//! are the request-type rules; the `[events]` table the timeline
//! detectors' thresholds. Any other key is refused, named.
//!
//! Owns: reading the file and merging its options under the command
//! line's. Must not: start anything.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{parser::ValueSource, ArgAction, ArgMatches, Args};
use serde::Deserialize;

use super::plan::{resolve, Env, RunFlags, RunPlan};
use crate::{identity::request_type, timeline};

/// `run`'s plan: the command line's flags (`given` says which it set),
/// the config file's options under them and its sections, the
/// environment.
pub fn run_plan(mut flags: RunFlags, given: &dyn Given, env: &dyn Env) -> Result<RunPlan> {
    let cfg = match &flags.config {
        Some(p) => ConfigFile::load(p)?,
        None => ConfigFile::default(),
    };
    cfg.apply(&mut flags, given)?;
    let mut plan = resolve(&flags, env)?;
    plan.request_types = cfg.request_types;
    plan.events = cfg.events;
    Ok(plan)
}

/// One config file, every section typed.
#[derive(Clone, Debug, Default)]
pub struct ConfigFile {
    pub path: PathBuf,
    /// `run` options (flat keys, `-` or `_` between words), checked only
    /// when applied ([`ConfigFile::apply`]): `replay` ignores them.
    options: toml::Table,
    /// `[[request_type]]`.
    pub request_types: request_type::Rules,
    /// `[events]`.
    pub events: timeline::Config,
}

/// Long options of `run` a config file may not set: the file itself, help,
/// and the bench build's reference path.
const NOT_IN_FILE: [&str; 3] = ["config", "help", "capture-reference"];

/// What the command line gave, per long option name.
pub trait Given {
    /// Whether the option was on the command line (not a default or an
    /// environment variable: the file wins over those).
    fn on_command_line(&self, long: &str) -> bool;
}

impl Given for ArgMatches {
    fn on_command_line(&self, long: &str) -> bool {
        run_option(long).is_some_and(|a| {
            self.value_source(a.get_id().as_str()) == Some(ValueSource::CommandLine)
        })
    }
}

/// `run`'s argument whose long name is `long`.
fn run_option(long: &str) -> Option<clap::Arg> {
    RunFlags::augment_args(clap::Command::new("run"))
        .get_arguments()
        .find(|a| a.get_long() == Some(long))
        .cloned()
}

impl ConfigFile {
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        Self::parse(&text, path).with_context(|| format!("config file {}", path.display()))
    }

    /// A config file's text (`path` only names it).
    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let mut options: toml::Table = toml::from_str(text).context("not valid TOML")?;
        let request_types =
            request_type::Rules::from_value(options.remove(request_type::CONFIG_KEY).as_ref())?;
        let events = timeline::Config::from_value(options.remove(timeline::config::CONFIG_KEY))?;
        Ok(Self {
            path: path.to_path_buf(),
            options,
            request_types,
            events,
        })
    }

    /// Merges the file's options into `flags` (read from the command
    /// line, which `given` describes): an option given on the command
    /// line wins; lists are joined, the file's first. Every key is checked
    /// on its own, so an error names the file, the key and why.
    pub fn apply(&self, flags: &mut RunFlags, given: &dyn Given) -> Result<()> {
        if self.options.is_empty() {
            return Ok(());
        }
        let path = self.path.display();
        let mut merged = toml::Table::try_from(&*flags)
            .context("reading the command line's options as a table")?;
        for (key, value) in &self.options {
            let name = key.replace('_', "-");
            let Some(arg) = run_option(&name).filter(|_| !NOT_IN_FILE.contains(&name.as_str()))
            else {
                bail!("config file {path}: unknown option `{key}` (the keys are `tokentap run` long option names, see `tokentap run --help`; tables: [[{}]], [{}])",
                    request_type::CONFIG_KEY, timeline::config::CONFIG_KEY);
            };
            let mut one = toml::Table::new();
            one.insert(name.clone(), value.clone());
            if let Err(e) = RunFlags::deserialize(toml::Value::Table(one)) {
                // Header values carry credentials: never echoed.
                let shown = if name == "otlp-header" {
                    "…".to_string()
                } else {
                    toml_text(value)
                };
                bail!(
                    "config file {path}: `{key} = {shown}`: {}",
                    e.message().trim()
                );
            }
            let list = matches!(arg.get_action(), ArgAction::Append);
            let value = match value {
                toml::Value::Array(_) => value.clone(),
                v if list => toml::Value::Array(vec![v.clone()]),
                v => v.clone(),
            };
            let joined = match (
                given.on_command_line(&name),
                list,
                merged.get(&name),
                &value,
            ) {
                (false, _, _, _) => value,
                (true, true, Some(toml::Value::Array(cli)), toml::Value::Array(file)) => {
                    // The file's first; a value both give is kept once.
                    let from_cli = cli.iter().filter(|v| !file.contains(v));
                    toml::Value::Array(file.iter().chain(from_cli).cloned().collect())
                }
                (true, _, _, _) => continue,
            };
            merged.insert(name, joined);
        }
        let mut merged = RunFlags::deserialize(toml::Value::Table(merged))
            .map_err(|e| anyhow::anyhow!("config file {path}: {}", e.message().trim()))?;
        // The fields no file may set (serde skips them) keep the command
        // line's values.
        merged.config = flags.config.take();
        #[cfg(feature = "bench-reference")]
        {
            merged.kernel.capture_reference = flags.kernel.capture_reference;
        }
        *flags = merged;
        Ok(())
    }
}

/// A TOML value as it was written (strings quoted), for errors.
fn toml_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => format!("{s:?}"),
        toml::Value::Array(a) => format!(
            "[{}]",
            a.iter().map(toml_text).collect::<Vec<_>>().join(", ")
        ),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        toml::Value::Datetime(d) => d.to_string(),
        toml::Value::Table(_) => "{…}".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use clap::Parser;

    use super::super::plan::test_cli::{Cli, Sub};
    use super::*;

    /// The command line `args` (after `run`) with `file`'s options merged.
    fn merged(file: &str, args: &[&str]) -> Result<RunFlags> {
        let mut v = vec!["tokentap", "run"];
        v.extend_from_slice(args);
        let m = <Cli as clap::CommandFactory>::command().get_matches_from(v);
        let Sub::Run(mut flags) = <Cli as clap::FromArgMatches>::from_arg_matches(&m)
            .unwrap()
            .cmd;
        let cfg = ConfigFile::parse(file, Path::new("c.toml"))?;
        cfg.apply(&mut flags, m.subcommand_matches("run").unwrap())?;
        Ok(flags)
    }

    #[test]
    fn the_command_line_wins_and_lists_are_joined_file_first() {
        let f = merged(
            "pid = [1, 2]\nno-console = true\nexport_interval = 2.5\nexponential-histograms = false\ntenant-header = \"X-Org\"\ngpu-interval = 3\n",
            &["--export-interval", "3", "--pid", "9", "--pid", "2", "--tenant-header", "X-T"],
        )
        .unwrap();
        assert_eq!(f.pids, vec![1, 2, 9], "joined, each once");
        assert!(f.no_console && !f.exponential_histograms);
        assert_eq!((f.export_interval, f.gpu_interval), (3.0, 3.0));
        assert_eq!(f.tenant_headers, ["X-Org", "X-T"]);
        // Untouched options keep their defaults.
        assert_eq!((f.max_tenants, f.console_window), (100, 60));
        let f = merged("data-hooks = \"tracepoint\"\nmax-conns = 7\n", &[]).unwrap();
        assert_eq!(f.kernel.data_hooks, crate::capture::DataHooks::Tracepoint);
        assert_eq!(f.kernel.max_conns, 7);
    }

    #[test]
    fn fields_no_file_may_set_keep_the_command_lines_values() {
        let f = merged("no-console = true\n", &["--config", "c.toml"]).unwrap();
        assert_eq!(f.config.as_deref(), Some(Path::new("c.toml")));
        assert!(f.no_console);
        #[cfg(feature = "bench-reference")]
        {
            let f = merged("no-console = true\n", &["--capture-reference"]).unwrap();
            assert!(f.kernel.capture_reference);
        }
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named_by_file_and_key() {
        let e = format!("{:#}", merged("nope = 1\n", &[]).unwrap_err());
        assert!(
            e.contains("config file c.toml: unknown option `nope`"),
            "{e}"
        );
        let e = format!("{:#}", merged("config = \"x\"\n", &[]).unwrap_err());
        assert!(e.contains("unknown option `config`"), "{e}");
        for (text, says) in [
            ("max-tenants = 0\n", "`max-tenants = 0`: 0 is not in 1.."),
            (
                "export-interval = \"soon\"\n",
                "`export-interval = \"soon\"`",
            ),
            ("export-interval = 0.05\n", "≥ 0.1"),
            ("pid = [\"abc\"]\n", "`pid = [\"abc\"]`"),
            ("port = 0\n", "`port = 0`"),
            ("port = 70000\n", "`port = 70000`"),
            ("ring-buffer-bytes = 5000\n", "not a power of two"),
            ("max-call-bytes = 2000000\n", "1..=1048576"),
            ("data-hooks = \"fast\"\n", "`data-hooks = \"fast\"`"),
            ("duration = -1\n", "≥ 0"),
            ("no-console = \"yes\"\n", "`no-console = \"yes\"`"),
        ] {
            let e = format!("{:#}", merged(text, &[]).unwrap_err());
            assert!(
                e.starts_with("config file c.toml: ") && e.contains(says),
                "{text}: {e}"
            );
        }
        // Header values are credentials: never in an error.
        let e = format!("{:#}", merged("otlp-header = 5\n", &[]).unwrap_err());
        assert!(e.contains("`otlp-header = …`"), "{e}");
    }

    struct NoEnv;
    impl Env for NoEnv {
        fn var(&self, _: &str) -> Option<String> {
            None
        }
        fn stdout_is_terminal(&self) -> bool {
            false
        }
    }

    #[test]
    fn a_run_plan_takes_the_files_options_rules_and_thresholds() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.toml");
        std::fs::write(
            &f,
            "no-console = true\ntenant-header = [\"X-Tenant-ID\", \"X-Org\"]\nmax-tenants = 7\n\n[[request_type]]\nname = \"rag\"\njson_field = \"documents\"\n[events]\nsurge_factor = 4\n",
        )
        .unwrap();
        let v = ["tokentap", "run", "--config", f.to_str().unwrap()];
        let m = <Cli as clap::CommandFactory>::command().get_matches_from(v);
        let Sub::Run(flags) = <Cli as clap::FromArgMatches>::from_arg_matches(&m)
            .unwrap()
            .cmd;
        let p = run_plan(flags.clone(), m.subcommand_matches("run").unwrap(), &NoEnv).unwrap();
        assert_eq!(p.identity.tenant_headers, vec!["x-tenant-id", "x-org"]);
        assert_eq!((p.max_tenants, p.console.is_none()), (7, true));
        assert_eq!(p.request_types.rules()[0].name, "rag");
        assert_eq!(p.events.surge_factor, 4.0);
        std::fs::remove_file(&f).unwrap();
        let e = format!("{:#}", run_plan(flags, &m, &NoEnv).unwrap_err());
        assert!(e.contains("cannot read config file"), "{e}");
    }

    #[test]
    fn the_sections_are_typed_and_other_tables_are_options_refused() {
        let c = ConfigFile::parse(
            "no-console = true\n[[request_type]]\nname = \"rag\"\njson_field = \"documents\"\n[events]\nwindow_s = 2\n",
            Path::new("c.toml"),
        )
        .unwrap();
        assert_eq!(c.request_types.rules()[0].name, "rag");
        assert_eq!(c.events.window_s, 2.0);
        let e = format!(
            "{:#}",
            merged("[identity]\nrules_file = \"x\"\n", &[]).unwrap_err()
        );
        assert!(e.contains("unknown option `identity`"), "{e}");
        let e = format!(
            "{:#}",
            ConfigFile::parse("[events]\nwindow = 2\n", Path::new("c.toml")).unwrap_err()
        );
        assert!(e.contains("window"), "{e}");
    }

    #[test]
    fn every_run_option_is_a_config_key_of_the_same_name_and_round_trips() {
        let longs: HashSet<String> = RunFlags::augment_args(clap::Command::new("run"))
            .get_arguments()
            .filter_map(|a| a.get_long().map(str::to_string))
            .filter(|l| !NOT_IN_FILE.contains(&l.as_str()))
            .collect();
        // Every option that has no default set, so that every field is in
        // the table (a new optional flag must be added here).
        let set = [
            "--pid=1",
            "--port=2",
            "--requests-log=a",
            "--events-log=b",
            "--console-interval=1",
            "--duration=1",
            "--otlp-endpoint=http://c:4317",
            "--otlp-ca-file=ca.pem",
            "--otlp-header=k=v",
            "--otlp-protocol=grpc",
            "--tenant-header=t",
            "--api-key-salt-file=s",
            "--nvml-library=n",
            "--kube-node=k",
            "--health-addr=1.2.3.4:5",
            "--traces-slow-ttft=2",
        ];
        let mut v = vec!["tokentap", "run"];
        v.extend_from_slice(&set);
        let Sub::Run(flags) = Cli::try_parse_from(v).unwrap().cmd;
        let table = toml::Table::try_from(&flags).unwrap();
        let keys: HashSet<String> = table.keys().cloned().collect();
        assert_eq!(keys, longs, "serde keys vs clap long names");
        let back = RunFlags::deserialize(toml::Value::Table(table)).unwrap();
        assert_eq!(format!("{back:?}"), format!("{flags:?}"));
    }
}
