//! The manual pages and shell completions the package installs, as `qpath man DIR` and
//! `qpath completions SHELL` generate them: a page for qpath and for every command `--help`
//! lists, each option of `qpath target --help` in its page, none for the hidden commands;
//! completion scripts that bash accepts and that name the commands and options.

mod target_process;
use target_process::{CALL_WITHIN, Dir, qpath};

/// The long options a help text lists (`--config`, `--persist`...), `--help` aside.
fn long_options(help: &str) -> Vec<String> {
    help.lines()
        .filter(|l| l.trim_start().starts_with('-'))
        .filter_map(|l| l.split([' ', ',', '=', '<']).find(|w| w.starts_with("--")))
        .filter(|o| *o != "--help" && *o != "--version")
        .map(str::to_string)
        .collect()
}

#[test]
fn man_writes_a_page_per_command_with_every_option() {
    let dir = Dir::new("man");
    let out = dir.path("man1");
    let (ok, stdout, err) = qpath(&["man", out.to_str().unwrap()], CALL_WITHIN);
    assert!(ok, "qpath man: {err}");
    let page = |name: &str| {
        std::fs::read_to_string(out.join(name)).unwrap_or_else(|e| panic!("{name} (qpath man printed {stdout}): {e}"))
    };
    let top = page("qpath.1");
    assert!(top.starts_with(".ie") || top.contains(".TH qpath 1"), "{top}");
    assert!(top.contains("RUST_LOG"), "qpath.1 tells how to get logs");
    for cmd in ["target", "rpc", "stats", "discover", "connect", "list-subsys", "resv", "bench", "lab"] {
        let p = page(&format!("qpath-{cmd}.1"));
        assert!(p.contains(&format!(".TH qpath-{cmd} 1")), "qpath-{cmd}.1 has its title");
        let roff = format!("qpath-{cmd}(1)").replace('-', "\\-");
        assert!(top.contains(&roff), "qpath.1 names qpath-{cmd}(1)");
    }
    // Every option of `qpath target --help` is documented in its page (roff escapes '-').
    let (ok, help, err) = qpath(&["target", "--help"], CALL_WITHIN);
    assert!(ok, "{err}");
    let target = page("qpath-target.1");
    let options = long_options(&help);
    assert!(options.len() >= 10 && options.iter().any(|o| o == "--persist"), "{options:?} from {help}");
    for o in &options {
        assert!(target.contains(&o.replace('-', "\\-")), "qpath-target.1 lacks {o}");
    }
    // The service's files are named where an operator looks (roff escapes '-').
    for file in ["/etc/qpath/target.toml", "/run/qpath/qpath.sock", "/etc/default/qpath\\-target"] {
        assert!(target.contains(file), "qpath-target.1 does not name {file}");
    }
    // The hidden commands get no page and are not listed.
    for hidden in ["man", "completions"] {
        assert!(!out.join(format!("qpath-{hidden}.1")).exists(), "a page for the hidden {hidden}");
        assert!(!top.contains(&format!("qpath\\-{hidden}(1)")), "qpath.1 lists the hidden {hidden}");
    }
}

#[test]
fn completions_name_the_commands_and_bash_accepts_its_script() {
    for (shell, marker) in [("bash", "_qpath()"), ("zsh", "#compdef qpath"), ("fish", "complete -c qpath")] {
        let (ok, script, err) = qpath(&["completions", shell], CALL_WITHIN);
        assert!(ok, "qpath completions {shell}: {err}");
        assert!(script.contains(marker), "{shell}: no {marker:?}");
        for word in ["target", "list-subsys"] {
            assert!(script.contains(word), "{shell} completion lacks {word}");
        }
        // fish names long options without their dashes (`-l persist`).
        for option in ["--persist", "--rpc-socket"] {
            let word = if shell == "fish" { format!("-l {}", &option[2..]) } else { option.to_string() };
            assert!(script.contains(&word), "{shell} completion lacks {option}");
        }
    }
    let (ok, _, err) = qpath(&["completions", "tcsh"], CALL_WITHIN);
    assert!(!ok && err.contains("tcsh"), "an unknown shell is refused, naming it: {err}");

    let dir = Dir::new("completions");
    let file = dir.path("qpath.bash");
    let (_, script, _) = qpath(&["completions", "bash"], CALL_WITHIN);
    std::fs::write(&file, script).unwrap();
    // Sourced in a bash, the script registers its function for `qpath`.
    let mut c = std::process::Command::new("bash");
    c.arg("-c").arg(format!("source {} && complete -p qpath", file.display()));
    let (ok, out, err) = target_process::run(c, CALL_WITHIN);
    assert!(ok && out.contains("qpath"), "bash did not accept the completion script: {err}");
}
