//! fio's ini dialect, as `init.c:__parse_jobs_ini` reads it.
//!
//! - A section is `[name]`; `[global...]` sections set defaults for the jobs after them.
//! - Blank lines and lines starting with `;` or `#` are skipped; a `;` or `#` anywhere
//!   else ends the line (fio's `strip_blank_end`), so trailing comments work.
//! - `key=value` splits at the first `=`; spaces inside the value are kept, so
//!   `filename=trtype=TCP traddr=10.0.0.1 ...` survives whole.
//! - A line without `=` is a bare flag (`time_based`, `group_reporting`).
//! - `${NAME}` in a value expands from the environment, as fio does.

use crate::error::{Error, ErrorKind, Result};

/// Longest line we accept (fio's OPT_LEN_MAX is 8 KiB).
pub const LINE_MAX: usize = 8192;
/// Most sections in one job file.
pub const SECTIONS_MAX: usize = 4096;

/// One `key[=value]` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawOption {
    /// The option name as written (aliases not yet resolved).
    pub key: String,
    /// The value, `None` for a bare flag.
    pub value: Option<String>,
    /// 1-based line number in the job file (0 for command-line options).
    pub line: usize,
}

/// One `[section]` with its options in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// The name between the brackets.
    pub name: String,
    /// Whether this is a `[global]` section.
    pub global: bool,
    /// Options in order.
    pub options: Vec<RawOption>,
    /// 1-based line of the `[name]` header.
    pub line: usize,
}

/// Split job-file text into sections.
pub fn parse(text: &str, origin: &str) -> Result<Vec<Section>> {
    let mut sections: Vec<Section> = Vec::new();
    for (idx, raw) in text.lines().enumerate() {
        let line_no = idx + 1;
        if raw.len() > LINE_MAX {
            return Err(Error::new(
                ErrorKind::JobFile,
                format!("{origin} line {line_no}: longer than {LINE_MAX} bytes"),
            ));
        }
        let line = raw.trim_start();
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        let line = strip_comment(line).trim_end();
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let name = rest.strip_suffix(']').ok_or_else(|| {
                Error::new(
                    ErrorKind::JobFile,
                    format!("{origin} line {line_no}: section header '{line}' has no closing ']'"),
                )
            })?;
            let name = name.trim();
            if name.is_empty() {
                return Err(Error::new(ErrorKind::JobFile, format!("{origin} line {line_no}: empty section name")));
            }
            if sections.len() >= SECTIONS_MAX {
                return Err(Error::new(ErrorKind::JobFile, format!("{origin}: more than {SECTIONS_MAX} sections")));
            }
            sections.push(Section {
                name: name.to_string(),
                global: name.starts_with("global"),
                options: Vec::new(),
                line: line_no,
            });
            continue;
        }
        let Some(section) = sections.last_mut() else {
            return Err(Error::new(
                ErrorKind::JobFile,
                format!("{origin} line {line_no}: option <{line}> outside of [] job section"),
            ));
        };
        if line == "include" || line.starts_with("include ") {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("{origin} line {line_no}: 'include' is not supported; inline the file"),
            ));
        }
        section.options.push(split_option(line, line_no));
    }
    Ok(sections)
}

/// Turn fio command-line job options (`--name=a --rw=read --bs=4k --name=b ...`) into
/// sections: options before the first `--name` are global, each `--name` starts a job.
pub fn parse_args<S: AsRef<str>>(args: &[S]) -> Result<Vec<Section>> {
    let mut sections = vec![Section { name: "global".into(), global: true, options: Vec::new(), line: 0 }];
    for arg in args {
        let arg = arg.as_ref();
        let Some(opt) = arg.strip_prefix("--") else {
            return Err(Error::new(ErrorKind::JobFile, format!("command-line job option '{arg}' must start with --")));
        };
        let raw = split_option(opt, 0);
        if raw.key == "name" {
            let name = raw.value.clone().unwrap_or_default();
            if name.is_empty() {
                return Err(Error::new(ErrorKind::JobFile, "--name needs a value"));
            }
            if sections.len() >= SECTIONS_MAX {
                return Err(Error::new(ErrorKind::JobFile, "too many --name jobs"));
            }
            sections.push(Section { global: false, name, options: Vec::new(), line: 0 });
        } else if let Some(last) = sections.last_mut() {
            last.options.push(raw);
        }
    }
    Ok(sections)
}

/// fio's `strip_blank_end`: everything from the first `;` or `#` is a comment.
fn strip_comment(line: &str) -> &str {
    match line.find([';', '#']) {
        Some(i) => &line[..i],
        None => line,
    }
}

fn split_option(line: &str, line_no: usize) -> RawOption {
    match line.split_once('=') {
        Some((k, v)) => RawOption { key: k.trim().to_string(), value: Some(expand_env(v.trim())), line: line_no },
        None => RawOption { key: line.trim().to_string(), value: None, line: line_no },
    }
}

/// Expand `${NAME}` from the environment; an unset variable is left as written.
fn expand_env(v: &str) -> String {
    if !v.contains("${") {
        return v.to_string();
    }
    let mut out = String::with_capacity(v.len());
    let mut rest = v;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        match after.find('}') {
            Some(end) => {
                let name = &after[..end];
                match std::env::var(name) {
                    Ok(val) => out.push_str(&val),
                    Err(_) => {
                        out.push_str("${");
                        out.push_str(name);
                        out.push('}');
                    }
                }
                rest = &after[end + 1..];
            }
            None => {
                out.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_comments_and_flags() {
        let text = "; header\n[global]\nbs=4k ; trailing\n# full comment\n  time_based\n\n[job1]\nrw=randread\tx\n";
        let s = parse(text, "t").unwrap();
        assert_eq!(s.len(), 2);
        assert!(s[0].global);
        assert_eq!(s[0].options[0].key, "bs");
        assert_eq!(s[0].options[0].value.as_deref(), Some("4k"));
        assert_eq!(s[0].options[1].key, "time_based");
        assert_eq!(s[0].options[1].value, None);
        assert_eq!(s[0].options[1].line, 5);
        assert_eq!(s[1].name, "job1");
        assert_eq!(s[1].options[0].value.as_deref(), Some("randread\tx"));
    }

    #[test]
    fn spaces_and_equals_inside_values_survive() {
        let text = "[j]\nfilename=trtype=TCP adrfam=IPv4 traddr=127.0.0.1 trsvcid=4420 subnqn=nqn.2016-06.io.spdk\\:cnode1 ns=1\n";
        let s = parse(text, "t").unwrap();
        assert_eq!(
            s[0].options[0].value.as_deref(),
            Some("trtype=TCP adrfam=IPv4 traddr=127.0.0.1 trsvcid=4420 subnqn=nqn.2016-06.io.spdk\\:cnode1 ns=1")
        );
    }

    #[test]
    fn options_outside_sections_and_include_are_errors() {
        assert!(parse("bs=4k\n", "t").unwrap_err().context.contains("outside"));
        assert_eq!(parse("[a]\ninclude x.fio\n", "t").unwrap_err().kind, ErrorKind::Unsupported);
        assert!(parse("[a\n", "t").is_err());
    }

    #[test]
    fn command_line_jobs() {
        let s = parse_args(&["--bs=4k", "--name=a", "--rw=read", "--name=b", "--rw=write"]).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].options[0].key, "bs");
        assert_eq!(s[1].name, "a");
        assert_eq!(s[2].options[0].value.as_deref(), Some("write"));
        assert!(parse_args(&["rw=read"]).is_err());
    }

    #[test]
    fn env_expansion() {
        assert_eq!(expand_env("a${QPATH_BENCH_SURELY_UNSET}b"), "a${QPATH_BENCH_SURELY_UNSET}b");
        let home = std::env::var("PATH").unwrap();
        assert_eq!(expand_env("${PATH}"), home);
    }
}
