//! The configuration file of `qpath host` (`--config host.toml`): the ublk devices it
//! serves, so that what an operator created comes back after a reboot.
//!
//! ```toml
//! [[ublk]]
//! name = "db"                       # optional; how logs, `ublk_list` and `ublk_del` name it
//! paths = ["10.0.0.1:4420", "10.0.1.1:4420"]
//! subnqn = "nqn.2026-11.io.qpath:default"
//! nsid = 1
//! id = 0                            # /dev/ublkb0; optional (the kernel picks)
//! ctrl_loss_tmo = -1
//! dhchap_secret_file = "/etc/qpath/host.key"
//! ```
//!
//! Each `[[ublk]]` table holds the parameters `ublk_add` takes over the control socket
//! (the same names, defaults and checks: [`crate::rpc`]), with `id` for `dev_id`, plus an
//! optional `name`. A secret is never in the file: only the path of the file that holds
//! it, as a device's state file keeps it.
//!
//! * **Checked at start**: an unknown key, a bad value, two devices with one id or one name
//!   are refused naming the line and the key, never the text of the line (it may be a
//!   secret pasted in the wrong place).
//! * **Saved** under `--persist`, after every `ublk_add` / `ublk_del` and before it
//!   answers: written whole from what is configured ([`HostConfig::to_toml`]), atomically (a
//!   new file beside it, fsync, the previous file kept as `FILE.bak`, rename, fsync of the
//!   directory), as `qpath target --persist` saves its own.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde_json::{Map, Value, json};

use crate::error::{Error, ErrorKind, Result};
use crate::rpc::split_add_params;
use crate::service::AddOptions;
use crate::spec::HeadSpec;

/// Most devices one file configures.
pub const DEVICES_MAX: usize = 256;

/// Longest device name.
pub const NAME_LEN_MAX: usize = 64;

/// Largest file read (a device takes well under 1 KiB).
pub const FILE_LEN_MAX: u64 = 1 << 20;

/// The devices one `qpath host` serves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostConfig {
    /// The ublk devices, in file order.
    pub ublk: Vec<UblkEntry>,
}

/// One configured ublk device.
#[derive(Clone, Debug)]
pub struct UblkEntry {
    /// The operator's name for it.
    pub name: Option<String>,
    /// The namespace and its paths.
    pub spec: HeadSpec,
    /// The device's layout (and its number, when given).
    pub opts: AddOptions,
    /// Line of its `[[ublk]]` table in the file read (0: added over RPC).
    pub line: usize,
}

impl PartialEq for UblkEntry {
    fn eq(&self, o: &UblkEntry) -> bool {
        self.name == o.name && self.spec == o.spec && self.opts == o.opts
    }
}

impl Eq for UblkEntry {}

impl UblkEntry {
    /// A device added over RPC.
    pub fn new(name: Option<String>, spec: HeadSpec, opts: AddOptions) -> UblkEntry {
        UblkEntry { name, spec, opts, line: 0 }
    }

    /// How the device is named in logs, `ublk_list` and `ublk_del name=...`: its name, else
    /// its device, else its namespace.
    pub fn label(&self) -> String {
        match (&self.name, self.opts.dev_id) {
            (Some(n), _) => n.clone(),
            (None, Some(id)) => format!("/dev/ublkb{id}"),
            (None, None) => format!("namespace {} of {}", self.spec.nsid, self.spec.subnqn),
        }
    }

    /// The entry as `ublk_add`'s parameters (`name` and `dev_id` included when set); no
    /// secret, only the paths of secret files.
    pub fn params(&self) -> Value {
        let mut m = match serde_json::to_value(&self.spec) {
            Ok(Value::Object(m)) => m,
            _ => Map::new(),
        };
        m.retain(|_, v| !v.is_null());
        if let Some(n) = &self.name {
            m.insert("name".into(), json!(n));
        }
        if let Ok(Value::Object(o)) = serde_json::to_value(&self.opts) {
            m.extend(o);
        }
        Value::Object(m)
    }
}

/// Checks a device name: 1 to [`NAME_LEN_MAX`] letters, digits, `.`, `_`, `-`, `:`.
pub fn check_name(n: &str) -> Result<()> {
    let ok = !n.is_empty()
        && n.len() <= NAME_LEN_MAX
        && n.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':'));
    if ok {
        Ok(())
    } else {
        Err(Error::new(ErrorKind::Invalid, format!("name: 1 to {NAME_LEN_MAX} letters, digits, '.', '_', '-' or ':'")))
    }
}

/// The file's shape: `[[ublk]]` tables, each key with where it is.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    #[serde(default)]
    ublk: Vec<toml::Spanned<BTreeMap<String, toml::Spanned<toml::Value>>>>,
}

/// Line (1-based) of byte `at` of `text`.
fn line_of(text: &str, at: usize) -> usize {
    text[..at.min(text.len())].matches('\n').count() + 1
}

fn config_error(what: String) -> Error {
    Error::new(ErrorKind::Invalid, what)
}

/// One table's keys as `ublk_add` parameters (`id` is `dev_id`; `name` taken out).
fn entry_params(t: &BTreeMap<String, toml::Spanned<toml::Value>>) -> (Map<String, Value>, Option<Value>) {
    let mut m = Map::new();
    let mut name = None;
    for (k, v) in t {
        let v = serde_json::to_value(v.get_ref()).unwrap_or(Value::Null);
        match k.as_str() {
            "name" => name = Some(v),
            "id" => {
                m.insert("dev_id".into(), v);
            }
            // `dev_id` is what the RPC calls it: the file says `id`, as `qpath ublk add --id`.
            "dev_id" => {
                m.insert("dev_id (write id)".into(), v);
            }
            _ => {
                m.insert(k.clone(), v);
            }
        }
    }
    (m, name)
}

/// What one key is wrong with, alone beside placeholders for the required keys; `None`
/// when it is fine alone.
fn key_problem(k: &str, v: &Value) -> Option<String> {
    let mut m = Map::new();
    m.insert("paths".into(), json!(["127.0.0.1:4420"]));
    m.insert("subnqn".into(), json!("nqn.2014-08.org.nvmexpress:placeholder"));
    let key = if k == "id" { "dev_id" } else { k };
    m.insert(key.into(), v.clone());
    split_add_params(&Value::Object(m)).err().map(|e| e.context.trim_start_matches("ublk_add: ").to_string())
}

impl HostConfig {
    /// Reads and checks a file. Errors name the file, the line and the key.
    pub fn load(path: &Path) -> Result<HostConfig> {
        let len = std::fs::metadata(path).map_err(|e| Error::io(format!("read {}", path.display()), &e))?.len();
        if len > FILE_LEN_MAX {
            return Err(config_error(format!("{}: {len} bytes; at most {FILE_LEN_MAX}", path.display())));
        }
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(format!("read {}", path.display()), &e))?;
        HostConfig::parse(&text).map_err(|e| Error::new(e.kind, format!("{}: {}", path.display(), e.context)))
    }

    /// Parses and checks TOML text.
    pub fn parse(text: &str) -> Result<HostConfig> {
        let raw: Raw = toml::from_str(text).map_err(|e| {
            let at = e.span().map(|s| format!("line {}: ", line_of(text, s.start))).unwrap_or_default();
            config_error(format!("{at}{}", e.message().trim_end()))
        })?;
        if raw.ublk.len() > DEVICES_MAX {
            return Err(config_error(format!("{} devices: at most {DEVICES_MAX}", raw.ublk.len())));
        }
        let mut out = HostConfig::default();
        for t in &raw.ublk {
            let line = line_of(text, t.span().start);
            let keys = t.get_ref();
            let (params, name) = entry_params(keys);
            let name = match name {
                None => None,
                Some(Value::String(n)) => Some(n),
                Some(_) => None.ok_or_else(|| {
                    let l = keys.get("name").map_or(line, |v| line_of(text, v.span().start));
                    config_error(format!("line {l}: name: expected a string"))
                })?,
            };
            if let Some(n) = &name {
                check_name(n).map_err(|e| {
                    let l = keys.get("name").map_or(line, |v| line_of(text, v.span().start));
                    config_error(format!("line {l}: {e}"))
                })?;
            }
            let (spec, opts) = match split_add_params(&Value::Object(params.clone())) {
                Ok(x) => x,
                Err(e) => {
                    // The key at fault, alone; else (a missing key, two keys that do not
                    // go together) the table's line.
                    let mut by_line: Vec<(&String, &toml::Spanned<toml::Value>)> = keys.iter().collect();
                    by_line.sort_by_key(|(_, v)| v.span().start);
                    for (k, v) in by_line {
                        let jv = serde_json::to_value(v.get_ref()).unwrap_or(Value::Null);
                        if k == "name" {
                            continue;
                        }
                        if k == "dev_id" {
                            return Err(config_error(format!(
                                "line {}: unknown key `dev_id`: the device's number is `id`",
                                line_of(text, v.span().start)
                            )));
                        }
                        if let Some(why) = key_problem(k, &jv) {
                            // In the file the device's number is `id`; a reason that already
                            // names its key is not prefixed with it again.
                            let why = why.replace("`dev_id`", "`id`");
                            let why = if why.starts_with("unknown key") || why.starts_with(&format!("{k}:")) {
                                why
                            } else {
                                format!("{k}: {why}")
                            };
                            return Err(config_error(format!("line {}: {why}", line_of(text, v.span().start))));
                        }
                    }
                    return Err(config_error(format!(
                        "line {line}: [[ublk]]: {}",
                        e.context.trim_start_matches("ublk_add: ")
                    )));
                }
            };
            out.ublk.push(UblkEntry { name, spec, opts, line });
        }
        out.check()?;
        Ok(out)
    }

    /// No two devices with one id, and no two with one label (a name, or for an unnamed
    /// device without an id, its namespace).
    pub fn check(&self) -> Result<()> {
        let at = |e: &UblkEntry| if e.line > 0 { format!("line {}: ", e.line) } else { String::new() };
        let on = |e: &UblkEntry| if e.line > 0 { format!(" on line {}", e.line) } else { String::new() };
        for (i, e) in self.ublk.iter().enumerate() {
            for o in &self.ublk[..i] {
                if let (Some(a), Some(b)) = (e.opts.dev_id, o.opts.dev_id)
                    && a == b
                {
                    return Err(config_error(format!("{}id {a} is the id of the device{} too", at(e), on(o))));
                }
                if e.label() == o.label() {
                    let why = if e.name.is_some() {
                        if o.line > 0 {
                            format!("name {:?} is the name of the device{} too", e.label(), on(o))
                        } else {
                            format!("a device named {:?} is configured already", e.label())
                        }
                    } else {
                        format!(
                            "a second device over {}{}: give each a name (or an id)",
                            e.label(),
                            if o.line > 0 { format!(" (the first is on line {})", o.line) } else { String::new() }
                        )
                    };
                    return Err(config_error(format!("{}{why}", at(e))));
                }
            }
        }
        Ok(())
    }

    /// The entry labelled `label`.
    pub fn find(&self, label: &str) -> Option<&UblkEntry> {
        self.ublk.iter().find(|e| e.label() == label)
    }

    /// The file `--persist` writes: a comment saying who wrote it and when, then one
    /// `[[ublk]]` table per device, keys as the file takes them.
    pub fn to_toml(&self) -> Result<String> {
        let mut list = Vec::new();
        for e in &self.ublk {
            let mut p = e.params();
            if let Some(m) = p.as_object_mut()
                && let Some(id) = m.remove("dev_id")
            {
                m.insert("id".into(), id);
            }
            let t = toml::Value::try_from(&p).map_err(|e| config_error(format!("configuration as TOML: {e}")))?;
            list.push(t);
        }
        let mut doc = toml::Table::new();
        if !list.is_empty() {
            doc.insert("ublk".into(), toml::Value::Array(list));
        }
        let body = toml::to_string(&doc).map_err(|e| config_error(format!("configuration as TOML: {e}")))?;
        Ok(format!(
            "# Written by qpath {} (qpath host --persist) at {}: the ublk devices it serves, one\n\
             # [[ublk]] table each. Secrets are never written here, only the files that hold them.\n\n{body}",
            env!("CARGO_PKG_VERSION"),
            uring::file::utc_rfc3339(std::time::SystemTime::now())
        ))
    }

    /// Saves to `path` atomically (the previous file kept as `path.bak`), keeping the
    /// file's mode (0644 for a new one).
    pub fn save(&self, path: &Path) -> Result<()> {
        let text = self.to_toml()?;
        let mode = std::fs::metadata(path).map_or(0o644, |m| m.permissions().mode() & 0o7777);
        uring::file::write_atomically(path, &text, mode).map(drop).map_err(|e| {
            let kind =
                if e.source.kind() == std::io::ErrorKind::InvalidInput { ErrorKind::Invalid } else { ErrorKind::Io };
            Error::new(kind, format!("save the configuration to {}: {e}", path.display()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    const NQN: &str = "nqn.2026-11.io.qpath:default";

    struct Dir(PathBuf);
    impl Dir {
        fn new(name: &str) -> Dir {
            let d = std::env::temp_dir().join(format!("qpath-host-config-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Dir(d)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn err(text: &str) -> String {
        HostConfig::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn a_file_parses_with_the_rpc_names_and_defaults() {
        let text = format!(
            "# two devices\n[[ublk]]\nname = \"db\"\npaths = [\"10.0.0.1:4420\", \"10.0.1.1:4420\"]\nsubnqn = \"{NQN}\"\n\
             nsid = 2\nid = 3\nqueues = 2\ndepth = 64\nctrl_loss_tmo = -1\niopolicy = \"round-robin\"\n\
             dhchap_secret_file = \"/etc/qpath/host.key\"\n\n[[ublk]]\npaths = [\"10.0.0.1:4420\"]\nsubnqn = \"{NQN}\"\n"
        );
        let c = HostConfig::parse(&text).unwrap();
        assert_eq!(c.ublk.len(), 2);
        let a = &c.ublk[0];
        assert_eq!(
            (a.name.as_deref(), a.spec.nsid, a.opts.dev_id, a.opts.queues, a.opts.depth),
            (Some("db"), 2, Some(3), 2, 64)
        );
        assert_eq!((a.spec.ctrl_loss_tmo, a.spec.iopolicy.as_str(), a.line), (-1, "round-robin", 2));
        assert_eq!(a.spec.dhchap_secret_file.as_deref(), Some(Path::new("/etc/qpath/host.key")));
        let b = &c.ublk[1];
        assert_eq!(b.spec, HeadSpec::new(vec!["10.0.0.1:4420".into()], NQN));
        assert_eq!((b.opts.clone(), b.line), (AddOptions::default(), 14));
        assert_eq!((a.label(), b.label()), ("db".to_string(), format!("namespace 1 of {NQN}")));
        assert_eq!(HostConfig::parse("").unwrap(), HostConfig::default(), "an empty file serves nothing");
        assert_eq!(HostConfig::parse("# nothing yet\n").unwrap().ublk.len(), 0);
    }

    #[test]
    fn a_wrong_file_is_refused_naming_the_line_and_the_key() {
        let head = format!("[[ublk]]\npaths = [\"127.0.0.1:4420\"]\nsubnqn = \"{NQN}\"\n");
        let e = err(&format!("{head}quues = 2\n"));
        assert!(e.starts_with("line 4: unknown key `quues`;") && e.contains("`queues`"), "{e}");
        assert!(e.contains("`id`") && !e.contains("dev_id"), "the file's key for the number: {e}");
        let e = err(&format!("{head}queues = \"two\"\n"));
        assert!(e.starts_with("line 4: queues: "), "{e}");
        let e = err(&format!("{head}\nqueues = 0\n"));
        assert!(e.starts_with("line 5: queues: ") && e.contains("not 1 to 64"), "{e}");
        let e = err(&format!("{head}iopolicy = \"fastest\"\n"));
        assert!(e.starts_with("line 4: iopolicy: "), "{e}");
        let e = err(&format!("{head}dev_id = 1\n"));
        assert!(e.starts_with("line 4: ") && e.contains("`id`"), "{e}");
        let e = err(&format!("{head}name = \"a b\"\n"));
        assert!(e.starts_with("line 4: name: "), "{e}");
        let e = err("[[ublk]]\nsubnqn = \"n\"\n");
        assert!(e.starts_with("line 1: [[ublk]]: ") && e.contains("paths"), "{e}");
        let e = err("colour = 3\n");
        assert!(e.starts_with("line 1: ") && e.contains("colour"), "{e}");
        let e = err("[[ublk]\n");
        assert!(e.starts_with("line 1: "), "{e}");
        // Two devices with one id, one name, or (unnamed, no id) one namespace.
        let e = err(&format!("{head}id = 1\n{head}id = 1\n"));
        assert!(e.starts_with("line 5: id 1 is the id of the device on line 1 too"), "{e}");
        let e = err(&format!("{head}name = \"x\"\n{head}name = \"x\"\n"));
        assert!(e.starts_with("line 5: name \"x\" is the name of the device on line 1 too"), "{e}");
        let e = err(&format!("{head}{head}"));
        assert!(e.starts_with("line 4: a second device over namespace 1 of") && e.contains("line 1"), "{e}");
        assert!(HostConfig::parse(&format!("{head}id = 1\n{head}id = 2\n")).is_ok());
        // A secret pasted where a file's path belongs is refused without being repeated.
        let secret = "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:";
        let e = err(&format!("{head}dhchap_secret_file = \"{secret}\"\n"));
        assert!(e.starts_with("line 4: dhchap_secret_file: ") && !e.contains("ia6zGodOr4"), "{e}");
        let e = err(&format!("{head}dhchap_secret = \"{secret}\"\n"));
        assert!(e.contains("dhchap_secret") && !e.contains("ia6zGodOr4"), "{e}");
    }

    /// What `--persist` writes reads back as the same devices; it holds secret files'
    /// paths, never their text; the previous file is kept as `.bak`.
    #[test]
    fn what_persist_writes_reads_back_and_holds_no_secret() {
        let d = Dir::new("roundtrip");
        let secret = "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:";
        let key = d.0.join("host.key");
        std::fs::write(&key, format!("{secret}\n")).unwrap();
        let mut spec = HeadSpec::new(vec!["127.0.0.1:4420".into(), "127.0.0.1:4421".into()], NQN);
        spec.dhchap_secret_file = Some(key.clone());
        spec.ctrl_loss_tmo = -1;
        spec.hostnqn = Some("nqn.2014-08.org.nvmexpress:uuid:0f0e0d0c-0b0a-0908-0706-050403020100".into());
        spec.tls_offload = "off".into();
        let opts = AddOptions { dev_id: Some(7), queues: 2, depth: 32, max_transfer: 1 << 20, read_only: true };
        let mut c = HostConfig::default();
        c.ublk.push(UblkEntry::new(Some("db".into()), spec, opts));
        c.ublk.push(UblkEntry::new(None, HeadSpec::new(vec!["[::1]:4420".into()], NQN), AddOptions::default()));
        let file = d.0.join("host.toml");
        c.save(&file).unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.contains("host.key") && !text.contains("DHHC") && !text.contains("ia6zGodOr4"), "{text}");
        assert!(text.starts_with("# Written by qpath"), "{text}");
        assert_eq!(HostConfig::load(&file).unwrap(), c);
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o644);
        assert!(!d.0.join("host.toml.bak").exists(), "no previous file, no backup");
        // A second save keeps the first as .bak and the file's mode.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
        c.ublk.pop();
        c.save(&file).unwrap();
        assert_eq!(std::fs::read_to_string(d.0.join("host.toml.bak")).unwrap(), text);
        assert_eq!(HostConfig::load(&file).unwrap(), c);
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o640);
        let names: Vec<String> =
            std::fs::read_dir(&d.0).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert_eq!(names.len(), 3, "the file, its .bak and the key, nothing left over: {names:?}");
        // Everything saved: the empty configuration too.
        c.ublk.clear();
        c.save(&file).unwrap();
        assert_eq!(HostConfig::load(&file).unwrap(), c);
        // A file far larger than any configuration is refused before it is read.
        let big = d.0.join("big.toml");
        std::fs::write(&big, vec![b'#'; usize::try_from(FILE_LEN_MAX).unwrap() + 1]).unwrap();
        assert!(HostConfig::load(&big).unwrap_err().to_string().contains("at most"));
        assert!(HostConfig::load(&d.0.join("missing.toml")).unwrap_err().to_string().contains("missing.toml"));
    }

    #[test]
    fn a_link_stays_a_link() {
        let d = Dir::new("link");
        let real = d.0.join("real.toml");
        std::fs::write(&real, "").unwrap();
        let link = d.0.join("host.toml");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let mut c = HostConfig::default();
        c.ublk.push(UblkEntry::new(
            Some("x".into()),
            HeadSpec::new(vec!["127.0.0.1:1".into()], NQN),
            AddOptions::default(),
        ));
        c.save(&link).unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(HostConfig::load(&real).unwrap(), c);
    }
}
