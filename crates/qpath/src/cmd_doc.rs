//! `qpath man DIR` and `qpath completions SHELL` (hidden commands): the manual pages and
//! the shell completions, generated from the command line's own definition so they never
//! disagree with `--help`. The package build (`scripts/build-deb.sh`) runs them on the
//! binary it packages; a build script could not, as the definitions live in this binary
//! and the library crates it links.

use std::path::PathBuf;

/// Arguments of `qpath man`.
#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// Directory to write qpath.1 and one page per command into (qpath-target.1, ...);
    /// created if missing. Pages already there with the same names are replaced.
    dir: PathBuf,
}

/// Arguments of `qpath completions`.
#[derive(clap::Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to print a completion script for.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

/// The closing text of qpath(1): `--help`'s, whose aligned columns a manual page would
/// refill into a jumble, as prose.
const MAN_AFTER_HELP: &str = "Logs go to stderr (the journal, under systemd). RUST_LOG chooses what is logged; the \
default is warn,qpath_target=info,qpath_blockdev=info. RUST_LOG=debug logs everything at debug level; \
RUST_LOG=warn,qpath_host=debug one part (qpath_target, qpath_host, qpath_blockdev, qpath_bench, nvme, uring or blk). \
qpath-COMMAND(1), or qpath COMMAND --help, describes each command.";

/// The closing text of qpath-target(1): where the service keeps what.
const MAN_TARGET_AFTER_HELP: &str = "As a system service (the qpath-target unit of the qpath package): \
the configuration is /etc/qpath/target.toml (saved there by --persist, the previous one kept as \
target.toml.bak), more options go in QPATH_TARGET_OPTS in /etc/default/qpath-target, the RPC \
socket is /run/qpath/qpath.sock, and file namespaces' images belong in /var/lib/qpath. \
systemctl reload qpath-target sends SIGHUP. Every field of the configuration, with comments: \
/usr/share/doc/qpath/examples/target.toml.";

/// Writes the manual pages of `cmd` (section 1) into the directory, one per command that
/// `--help` lists, and prints their names.
pub fn man(a: &ManArgs, cmd: clap::Command) -> Result<(), Box<dyn std::error::Error>> {
    let cmd = cmd.after_help(MAN_AFTER_HELP).mut_subcommand("target", |t| t.after_help(MAN_TARGET_AFTER_HELP));
    std::fs::create_dir_all(&a.dir).map_err(|e| format!("{}: {e}", a.dir.display()))?;
    clap_mangen::generate_to(cmd, &a.dir).map_err(|e| format!("writing manual pages into {}: {e}", a.dir.display()))?;
    let mut pages: Vec<_> = std::fs::read_dir(&a.dir)?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("qpath") && n.ends_with(".1"))
        .collect();
    pages.sort();
    for p in pages {
        println!("{}", a.dir.join(p).display());
    }
    Ok(())
}

/// Prints the completion script of `cmd` for the shell.
pub fn completions(a: &CompletionsArgs, mut cmd: clap::Command) -> Result<(), Box<dyn std::error::Error>> {
    // Into memory first: writing to stdout directly panics on a closed pipe (`| head`).
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "qpath", &mut script);
    std::io::Write::write_all(&mut std::io::stdout().lock(), &script)?;
    Ok(())
}
