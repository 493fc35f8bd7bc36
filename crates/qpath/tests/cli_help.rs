//! The help texts as a new user reads them: `qpath --help` names every command with a
//! line saying what it does and how to get debug logs; no help text anywhere speaks in
//! issue numbers or Rust type names; `qpath --version` says which commit it was built from.

mod target_process;
use target_process::{CALL_WITHIN, qpath};

/// The commands listed under "Commands:" of a help text, with their descriptions.
fn commands(help: &str) -> Vec<(String, String)> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| {
            let t = l.trim();
            let (name, desc) = t.split_once(char::is_whitespace)?;
            Some((name.to_string(), desc.trim().to_string()))
        })
        .filter(|(n, _)| n != "help")
        .collect()
}

fn help(args: &[&str]) -> String {
    let mut a = args.to_vec();
    a.push("--help");
    let (ok, out, err) = qpath(&a, CALL_WITHIN);
    assert!(ok, "qpath {a:?}: {err}");
    out
}

#[test]
fn top_level_help_lists_every_command_and_how_to_get_logs() {
    let h = help(&[]);
    let listed: Vec<String> = commands(&h)
        .into_iter()
        .map(|(n, d)| {
            assert!(d.len() > 10, "command {n} has no description: {h}");
            n
        })
        .collect();
    for want in ["target", "rpc", "stats", "discover", "connect", "list-subsys", "resv", "bench", "lab"] {
        assert!(listed.iter().any(|n| n == want), "{want} missing from qpath --help:\n{h}");
    }
    // The first line (the tool's description) must not name only some of them.
    let first = h.lines().next().unwrap();
    assert!(!first.contains("list-subsys, bench, rpc"), "{first}");
    assert!(h.contains("RUST_LOG") && h.contains("debug"), "how to get debug logs:\n{h}");
}

#[test]
fn no_help_text_speaks_in_issue_numbers_or_type_names() {
    let mut texts = vec![(String::from("qpath"), help(&[]))];
    for (cmd, _) in commands(&texts[0].1) {
        let h = help(&[&cmd]);
        for (sub, _) in commands(&h) {
            texts.push((format!("qpath {cmd} {sub}"), help(&[&cmd, &sub])));
        }
        texts.push((format!("qpath {cmd}"), h));
    }
    assert!(texts.len() > 20, "every command and lab: {}", texts.len());
    let internal =
        ["Issue ", "issue ", "Issue#", "issue #", "SharedRegion", "SizeValue", "TargetOptions", "JobSpec", "::"];
    for (what, text) in &texts {
        for word in internal {
            assert!(!text.contains(word), "{what} --help says {word:?}:\n{text}");
        }
    }
}

#[test]
fn version_names_the_commit() {
    let (ok, out, _) = qpath(&["--version"], CALL_WITHIN);
    assert!(ok);
    let v = out.trim();
    let commit =
        v.strip_prefix(concat!("qpath ", env!("CARGO_PKG_VERSION"), " (commit ")).and_then(|r| r.strip_suffix(')'));
    let commit = commit.unwrap_or_else(|| panic!("qpath --version: {v}"));
    assert!(commit == "unknown" || (commit.len() >= 7 && commit.chars().all(|c| c.is_ascii_hexdigit())), "{v}");
    // Built from this checkout: the commit is its HEAD (when git is there to ask).
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    match head {
        Some(h) => assert_eq!(commit, h, "{v}"),
        None => println!("SKIP: no git checkout to compare the commit with"),
    }
}
