//! The configuration file: the command-line options of the commands that
//! start a logical host, in TOML, one section per command plus `[common]`.
//!
//! The file's schema is the clap definition itself: a key is an option's
//! name (`host_timeout` or `host-timeout` for `--host-timeout`, `peers` or
//! `peer` for `--peer`), and each value is turned into that option's
//! command-line text and checked by the option's own value parser. So the
//! file accepts exactly what the flags accept, and cannot drift from them.
//!
//! Precedence: flags on the command line, then the command's section, then
//! `[common]`, then the built-in defaults. A repeatable option (`peers`)
//! given at a higher level replaces the lower level's list.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Args, Command};
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use crate::hostopts::HostOpts;
use crate::units::Size;

/// Read when neither `--config` nor `$VKERNEL_CONFIG` names a file, if it exists.
pub const DEFAULT_PATH: &str = "/etc/vkernel/vkernel.toml";
/// The environment variable naming the configuration file (empty: none).
pub const ENV: &str = "VKERNEL_CONFIG";
/// The section whose host options apply to every command.
const COMMON: &str = "common";
/// The option that names the file; a command has a section only if it has it.
const CONFIG_ARG: &str = "config";
/// Options that identify one logical host: two services cannot share them,
/// so they are refused in `[common]`.
const PER_HOST: &[&str] = &["bind", "host_id", "trace", "attach"];
/// Options whose values are secrets: check-config does not print them.
const SECRET: &[&str] = &["keys", "owner_key", "disk_key"];

/// One option set in the file.
#[derive(Clone, Debug)]
struct Setting {
    /// The key as written.
    key: String,
    /// The option's command-line text (`--bind=ADDR`, or none for `false`).
    args: Vec<OsString>,
    /// 1-based line of the key.
    line: usize,
    section: String,
}

/// A configuration file, read and checked.
#[derive(Debug)]
pub struct Config {
    path: PathBuf,
    /// Section name -> option id -> setting.
    sections: BTreeMap<String, BTreeMap<String, Setting>>,
}

/// The commands that take `--config` (those that start a logical host).
fn configurable(root: &Command) -> impl Iterator<Item = &Command> {
    root.get_subcommands()
        .filter(|c| c.get_arguments().any(|a| a.get_id() == CONFIG_ARG))
}

/// The host options alone, as a command (the schema of `[common]`).
fn common_command() -> Command {
    HostOpts::augment_args(Command::new(COMMON))
}

fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset)
        .map_or(1, |t| t.matches('\n').count() + 1)
}

impl Config {
    /// Reads and checks `path` against the commands of `root`: syntax,
    /// sections, keys, value types, and every value through its option's
    /// parser. Errors are `FILE:LINE: ...`, all of them.
    pub fn load(path: &Path, root: &Command) -> Result<Config, Vec<String>> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| vec![format!("{}: cannot read: {e}", path.display())])?;
        let p = path.display();
        let doc = DeTable::parse(&text).map_err(|e| {
            let line = e.span().map_or(1, |s| line_of(&text, s.start));
            vec![format!("{p}:{line}: {}", e.message().trim_end())]
        })?;
        // (line, message), sorted by line at the end.
        let mut errors: Vec<(usize, String)> = Vec::new();
        let mut sections = BTreeMap::new();
        let known: Vec<&str> = std::iter::once(COMMON)
            .chain(configurable(root).map(|c| c.get_name()))
            .collect();
        for (name, value) in doc.get_ref() {
            let line = line_of(&text, name.span().start);
            let name = name.get_ref().as_ref();
            let DeValue::Table(table) = value.get_ref() else {
                errors.push((line, format!(
                    "{p}:{line}: `{name}` is outside any section: put it under [common] or a command's section such as [host]"
                )));
                continue;
            };
            let cmd = if name == COMMON {
                common_command()
            } else if let Some(c) = configurable(root).find(|c| c.get_name() == name) {
                c.clone()
            } else {
                errors.push((
                    line,
                    format!(
                        "{p}:{line}: unknown section [{name}]; sections are {}",
                        known
                            .iter()
                            .map(|s| format!("[{s}]"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
                continue;
            };
            let mut settings: BTreeMap<String, Setting> = BTreeMap::new();
            for (key, value) in table {
                let line = line_of(&text, key.span().start);
                let key = key.get_ref().as_ref();
                let at = format!("{p}:{line}: [{name}] {key}");
                match setting(&cmd, name, key, value) {
                    Err(e) => errors.push((line, format!("{at}: {e}"))),
                    Ok((id, args)) => {
                        if let Some(prev) = settings.get(&id) {
                            errors.push((
                                line,
                                format!(
                                    "{at}: the same option as `{}` on line {}",
                                    prev.key, prev.line
                                ),
                            ));
                            continue;
                        }
                        if let Err(e) = check_values(&cmd, &args) {
                            errors.push((line, format!("{at}: {e}")));
                        }
                        let s = Setting {
                            key: key.to_string(),
                            args,
                            line,
                            section: name.to_string(),
                        };
                        settings.insert(id, s);
                    }
                }
            }
            sections.insert(name.to_string(), settings);
        }
        if errors.is_empty() {
            Ok(Config {
                path: path.to_path_buf(),
                sections,
            })
        } else {
            errors.sort();
            Err(errors.into_iter().map(|(_, e)| e).collect())
        }
    }

    /// The file's settings for command `cmd`: its section over `[common]`.
    fn settings_for(&self, cmd: &str) -> BTreeMap<String, Setting> {
        let mut out = self.sections.get(COMMON).cloned().unwrap_or_default();
        if let Some(s) = self.sections.get(cmd) {
            out.extend(s.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        out
    }

    /// The command-line text of the settings for `cmd`, skipping options
    /// `given` says the command line already sets.
    fn args_for(&self, cmd: &str, given: impl Fn(&str) -> bool) -> Vec<OsString> {
        self.settings_for(cmd)
            .into_iter()
            .filter(|(id, _)| !given(id))
            .flat_map(|(_, s)| s.args)
            .collect()
    }
}

/// Finds the option `key` names in `cmd` and turns `value` into its
/// command-line text; returns the option's id and that text.
fn setting(
    cmd: &Command,
    section: &str,
    key: &str,
    value: &Spanned<DeValue<'_>>,
) -> Result<(String, Vec<OsString>), String> {
    let norm = key.replace('-', "_");
    let arg = cmd
        .get_arguments()
        .filter(|a| a.get_id() != CONFIG_ARG)
        .find(|a| {
            a.get_long().is_some()
                && (a.get_id() == norm.as_str()
                    || a.get_long().map(|l| l.replace('-', "_")) == Some(norm.clone()))
        })
        .ok_or_else(|| {
            let keys: Vec<String> = cmd
                .get_arguments()
                .filter(|a| a.get_long().is_some() && a.get_id() != CONFIG_ARG)
                .filter(|a| !matches!(a.get_action(), ArgAction::Help | ArgAction::Version))
                .map(|a| a.get_id().to_string())
                .collect();
            format!("unknown key; the keys here are {}", keys.join(", "))
        })?;
    let id = arg.get_id().to_string();
    if section == COMMON && PER_HOST.contains(&id.as_str()) {
        return Err(format!(
            "`{key}` belongs to one logical host: set it in each command's section, not in [common]"
        ));
    }
    let long = arg.get_long().unwrap_or(key);
    let flag = format!("--{long}");
    let optional_value = arg.get_num_args().is_some_and(|n| n.min_values() == 0);
    let scalar = |v: &DeValue<'_>| -> Result<Option<OsString>, String> {
        Ok(Some(OsString::from(match v {
            DeValue::String(s) => format!("{flag}={s}"),
            // As written (0x.., 0o..), so the option's parser decides what
            // a radix means: socket_mode = 660 is octal to --socket-mode
            // as on the command line, and 0o660 is too.
            DeValue::Integer(i) => {
                let prefix = match i.radix() {
                    16 => "0x",
                    8 => "0o",
                    2 => "0b",
                    _ => "",
                };
                format!("{flag}={prefix}{}", i.as_str().replace('_', ""))
            }
            DeValue::Float(f) => format!("{flag}={}", f.as_str()),
            DeValue::Boolean(true) if optional_value => flag.clone(),
            DeValue::Boolean(false) if optional_value => return Ok(None),
            DeValue::Boolean(_) => {
                return Err(format!(
                    "expects a value (as for {flag}), not true or false"
                ))
            }
            DeValue::Datetime(_) | DeValue::Array(_) | DeValue::Table(_) => {
                return Err(format!(
                    "expects a string or number (as for {flag}), not {}",
                    v.type_str()
                ))
            }
        })))
    };
    let args = match arg.get_action() {
        ArgAction::SetTrue => match value.get_ref() {
            DeValue::Boolean(b) => b.then(|| OsString::from(&flag)).into_iter().collect(),
            v => return Err(format!("expects true or false, not {}", v.type_str())),
        },
        ArgAction::Append => match value.get_ref() {
            DeValue::Array(items) => {
                let mut out = Vec::new();
                for v in items {
                    if matches!(v.get_ref(), DeValue::Array(_)) {
                        return Err("expects a list of values, not a list of lists".into());
                    }
                    out.extend(scalar(v.get_ref())?);
                }
                out
            }
            v => scalar(v)?.into_iter().collect(),
        },
        ArgAction::Set => match value.get_ref() {
            DeValue::Array(_) => {
                return Err(format!("takes one value (as {flag} does), not a list"))
            }
            v => scalar(v)?.into_iter().collect(),
        },
        _ => return Err("cannot be set in a configuration file".into()),
    };
    Ok((id, args))
}

/// Runs option text through the command's value parsers alone (nothing
/// required), so that a bad value is reported at its line.
fn check_values(cmd: &Command, args: &[OsString]) -> Result<(), String> {
    let probe = cmd
        .clone()
        .no_binary_name(true)
        .subcommand_required(false)
        .mut_args(|a| a.required(false));
    match probe.try_get_matches_from(args) {
        Ok(_) => Ok(()),
        Err(e) => Err(clap_message(&e)),
    }
}

/// A clap error's message on one line, without clap's `error: ` prefix
/// and the usage that follows.
fn clap_message(e: &clap::Error) -> String {
    let s = e.to_string();
    let msg = s.split("\n\n").next().unwrap_or_default();
    let msg = msg.strip_prefix("error: ").unwrap_or(msg);
    msg.lines().map(str::trim).collect::<Vec<_>>().join(" ")
}

/// Where the configuration comes from when `--config` is not given:
/// `$VKERNEL_CONFIG` (must exist; empty means none), else [`DEFAULT_PATH`]
/// if it exists. The bool says whether the file must exist.
pub fn default_path() -> Option<(PathBuf, bool)> {
    match std::env::var_os(ENV) {
        Some(p) if p.is_empty() => None,
        Some(p) => Some((PathBuf::from(p), true)),
        None => Some((PathBuf::from(DEFAULT_PATH), false)),
    }
}

/// Adds the configuration file's settings to a command line, right after
/// the command's name (so they can never be taken for a trailing program
/// argument), for each option the command line does not set itself.
/// Returns the command line unchanged when there is no file or no command
/// that takes one.
pub fn apply(root: &Command, argv: Vec<OsString>) -> Result<Vec<OsString>, String> {
    // A first, lenient parse: which command, which file, which options the
    // command line sets (value_source), even if required ones are missing.
    // --help and --version still end it with an error, so they work even
    // with a broken file.
    let Ok(first) = root
        .clone()
        .ignore_errors(true)
        .try_get_matches_from(argv.iter())
    else {
        return Ok(argv);
    };
    let Some((name, m)) = first.subcommand() else {
        return Ok(argv);
    };
    if !configurable(root).any(|c| c.get_name() == name) {
        return Ok(argv);
    }
    let path = match m.try_get_one::<PathBuf>(CONFIG_ARG).ok().flatten() {
        Some(p) if m.value_source(CONFIG_ARG) == Some(ValueSource::CommandLine) => p.clone(),
        _ => match default_path() {
            Some((p, true)) => p,
            Some((p, false)) if p.exists() => p,
            _ => return Ok(argv),
        },
    };
    let cfg = Config::load(&path, root).map_err(|e| e.join("\n"))?;
    let extra = cfg.args_for(name, |id| {
        m.try_contains_id(id).unwrap_or(false)
            && m.value_source(id) == Some(ValueSource::CommandLine)
    });
    // The command is the first word that is not an option (the top level
    // has only --help and --version).
    let Some(at) = argv
        .iter()
        .skip(1)
        .position(|a| !a.to_string_lossy().starts_with('-'))
        .map(|i| i + 1)
        .filter(|&i| argv[i] == name)
    else {
        return Ok(argv);
    };
    let mut out = argv;
    out.splice(at + 1..at + 1, extra);
    Ok(out)
}

/// Arguments of `vkernel check-config`.
#[derive(clap::Args, Debug)]
#[command(long_about = CHECK_ABOUT)]
pub struct CheckArgs {
    /// The file (default: $VKERNEL_CONFIG, else /etc/vkernel/vkernel.toml).
    #[arg(value_name = "FILE")]
    file: Option<PathBuf>,
}

/// The long help of `vkernel check-config`.
pub const CHECK_ABOUT: &str = "\
Checks a configuration file the way the commands read it: TOML syntax,
section and key names, value types, and every value through the same
parser as its command-line option (addresses, durations, host ids, sizes;
key files are read). Then, for each command's section, prints the options
that command would run with (durations and sizes as parsed, with their
units: 1m 30s, 64 KiB) and where each comes from (the file's line, or the
built-in default). Exits 1, naming FILE:LINE, on any error.

The file: one section per command that starts a logical host ([host],
[echo], [disk], [nbd], [fileserver], [mount], ...) plus [common] for the
host options every command shares (peers, key_file, spin, ...). A key is
the option's long name (host_timeout or host-timeout for --host-timeout;
peers = [\"10.0.0.2:7000\"] for --peer). Flags on the command line win over
the command's section, which wins over [common]. A command reads --config
FILE, else $VKERNEL_CONFIG (empty: none), else /etc/vkernel/vkernel.toml if
it exists. dist/vkernel.toml (installed as PREFIX/share/vkernel/vkernel.toml)
is a commented example.";

/// Runs `vkernel check-config`.
pub fn check(a: CheckArgs, root: &Command) -> Result<(), String> {
    let path = match a.file {
        Some(p) => p,
        None => match default_path() {
            Some((p, _)) if p.exists() => p,
            Some((p, _)) => {
                return Err(format!(
                    "no configuration file: {} does not exist (give FILE or set ${ENV})",
                    p.display()
                ))
            }
            None => return Err(format!("no configuration file: ${ENV} is empty")),
        },
    };
    let cfg = Config::load(&path, root).map_err(|e| e.join("\n"))?;
    let mut errors = Vec::new();
    let mut commands = 0;
    // Written at the end in one piece: a closed pipe (`| head`) is not an
    // error worth a panic.
    let mut out = String::new();
    for cmd in configurable(root) {
        let name = cmd.get_name();
        if !cfg.sections.contains_key(name) {
            continue;
        }
        commands += 1;
        let mut argv = vec![OsString::from("vkernel"), OsString::from(name)];
        argv.extend(cfg.args_for(name, |_| false));
        let m = match root.clone().try_get_matches_from(argv) {
            Ok(m) => m,
            Err(e) => {
                errors.push(format!(
                    "{}: [{name}]: {} (add the key, or give the flag when running `vkernel {name}`)",
                    cfg.path.display(),
                    clap_message(&e)
                ));
                continue;
            }
        };
        let Some((_, sm)) = m.subcommand() else {
            continue;
        };
        out += &format!("[{name}] `vkernel {name}` would run with:\n");
        effective(&mut out, cmd, sm, &cfg.settings_for(name));
        for w in warnings(name, sm) {
            out += &format!("  warning: {w}\n");
        }
        out += "\n";
    }
    if !errors.is_empty() {
        return Err(errors.join("\n"));
    }
    out += &format!(
        "{}: OK ({commands} command section{}{})\n",
        cfg.path.display(),
        if commands == 1 { "" } else { "s" },
        if cfg.sections.contains_key(COMMON) {
            " and [common]"
        } else {
            ""
        }
    );
    let _ = std::io::stdout().lock().write_all(out.as_bytes());
    Ok(())
}

/// Writes each option of `cmd`: its value and where it comes from.
fn effective(out: &mut String, cmd: &Command, m: &ArgMatches, file: &BTreeMap<String, Setting>) {
    let width = cmd
        .get_arguments()
        .map(|a| a.get_id().as_str().len())
        .max()
        .unwrap_or(0);
    for a in cmd.get_arguments() {
        let id = a.get_id().as_str();
        if a.get_long().is_none()
            || id == CONFIG_ARG
            || matches!(a.get_action(), ArgAction::Help | ArgAction::Version)
        {
            continue;
        }
        let raw: Vec<String> = m
            .try_get_raw(id)
            .ok()
            .flatten()
            .map(|v| v.map(|s| s.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let value = if matches!(a.get_action(), ArgAction::SetTrue) {
            let on = m.try_get_one::<bool>(id).ok().flatten();
            on.copied().unwrap_or(false).to_string()
        } else if raw.is_empty() {
            "(not set)".to_string()
        } else if SECRET.contains(&id) {
            "(set; not shown)".to_string()
        } else if let Ok(Some(d)) = m.try_get_one::<Duration>(id) {
            // As parsed, with its unit: what the command will use.
            crate::units::show_duration(*d)
        } else if let Ok(Some(s)) = m.try_get_one::<Size>(id) {
            s.to_string()
        } else {
            raw.join(", ")
        };
        let source = match (file.get(id), m.value_source(id)) {
            (Some(s), _) => format!("[{}] line {}", s.section, s.line),
            (None, Some(ValueSource::DefaultValue)) => "default".to_string(),
            _ => String::new(),
        };
        if source.is_empty() {
            *out += &format!("  {id:<width$} = {value}\n");
        } else {
            *out += &format!("  {id:<width$} = {value:<24} # {source}\n");
        }
    }
}

/// What a value parser cannot know: state of the machine that may change
/// before the service starts (systemd creates state directories at start),
/// so reported but not fatal.
fn warnings(cmd: &str, m: &ArgMatches) -> Vec<String> {
    let mut out = Vec::new();
    if cmd == "fileserver" {
        if let Some(root) = m.try_get_one::<PathBuf>("root").ok().flatten() {
            if !root.is_dir() {
                out.push(format!("root {} is not a directory (yet)", root.display()));
            }
        }
    }
    out
}
