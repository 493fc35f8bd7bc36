//! `qpath target` as an operator runs it: arguments checked before anything starts,
//! `--check` (what a configuration would serve, starting nothing), errors that say what a
//! value should look like, and `examples/target.toml`, which must check clean and start.

use std::net::{SocketAddr, TcpStream};

mod target_process;
use target_process::{CALL_WITHIN, Dir, TargetProcess, free_port, qpath};

fn example() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/target.toml")).unwrap()
}

/// The example with its machine-specific parts moved into `dir`: free loopback ports for
/// 4420, 4421 and 8009, files under `dir` instead of /var/lib/qpath. Returns the text and
/// the three addresses.
fn example_in(dir: &Dir) -> (String, Vec<SocketAddr>) {
    let mut text = example().replace("/var/lib/qpath", dir.0.to_str().unwrap());
    let mut addrs = Vec::new();
    for port in ["4420", "4421", "8009"] {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let from = format!("\"127.0.0.1:{port}\"");
        assert!(text.contains(&from), "examples/target.toml has no {from}");
        text = text.replace(&from, &format!("\"{addr}\""));
        addrs.push(addr);
    }
    (text, addrs)
}

/// The example with every optional setting (`#key = ...`) uncommented, and real
/// DH-HMAC-CHAP secrets in place of the placeholders.
fn uncommented(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        let setting = t.strip_prefix('#').filter(|rest| rest.starts_with(|c: char| c.is_ascii_lowercase()));
        let mut line = match setting {
            Some(rest) => format!("{}{rest}", &line[..line.len() - t.len()]),
            None => line.to_string(),
        };
        while let Some(start) = line.find("DHHC-1:00:<") {
            let end = start + line[start..].find(">:").expect("a placeholder ends with >:") + 2;
            let secret = nvme::auth::Secret::generate(None, 32).unwrap().to_string();
            line.replace_range(start..end, &secret);
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

#[test]
fn the_example_config_parses_checks_clean_and_starts() {
    assert!(target::config::Config::parse(&example()).is_ok(), "examples/target.toml parses as it is");
    let dir = Dir::new("example");
    let (text, addrs) = example_in(&dir);
    let cfg = dir.path("target.toml");
    std::fs::write(&cfg, &text).unwrap();
    let sock = dir.path("check.sock");
    let args = ["target", "--config", cfg.to_str().unwrap(), "--rpc-socket", sock.to_str().unwrap(), "--check"];
    let (ok, out, err) = qpath(&args, CALL_WITHIN);
    assert!(ok, "--check of the example failed:\n{out}\n{err}");
    assert!(out.contains("configuration OK; nothing was started"), "{out}");
    assert!(out.contains("would be created with 1073741824 bytes"), "{out}");
    assert!(!dir.path("vol1.img").exists() && !sock.exists(), "--check created nothing");
    assert!(addrs.iter().all(|a| TcpStream::connect(a).is_err()), "--check bound nothing");

    // Every optional setting uncommented checks clean too.
    let full = dir.path("full.toml");
    std::fs::write(&full, uncommented(&text)).unwrap();
    let mut args = args;
    args[2] = full.to_str().unwrap();
    let (ok, out, err) = qpath(&args, CALL_WITHIN);
    assert!(ok, "--check of the example with its optional settings failed:\n{out}\n{err}");
    assert!(out.contains("2 host(s), 1 authenticating"), "{out}");

    // And it serves both subsystems; discovery on its I/O port shows this host the one it
    // may use (vol1 allows only the hosts it lists).
    let t = TargetProcess::start(
        &dir,
        "example",
        &[
            "--config".into(),
            cfg.to_str().unwrap().into(),
            "--reactors".into(),
            "1".into(),
            "--poll".into(),
            "block".into(),
        ],
        addrs.clone(),
    );
    let subs: serde_json::Value = serde_json::from_str(&t.rpc("list_subsystems", &[]).unwrap()).unwrap();
    let nqns: Vec<&str> = subs.as_array().unwrap().iter().map(|s| s["nqn"].as_str().unwrap()).collect();
    assert_eq!(nqns.len(), 2, "{subs}");
    assert_eq!(subs[0]["namespaces"].as_array().unwrap().len(), 3, "{subs}");
    assert_eq!(std::fs::metadata(dir.path("vol1.img")).unwrap().len(), 1 << 30, "the file namespace was created");
    let port = addrs[0].port().to_string();
    let (ok, out, err) = qpath(&["discover", "-a", "127.0.0.1", "-s", &port], CALL_WITHIN);
    assert!(ok && out.contains("nqn.2026-11.io.qpath:scratch"), "discover on the example's port 1:\n{out}\n{err}");
}

#[test]
fn check_lists_every_problem_and_starts_nothing() {
    let dir = Dir::new("check-bad");
    let cfg = dir.path("bad.toml");
    let missing = dir.path("nowhere/vol.img");
    std::fs::write(
        &cfg,
        format!(
            "[[port]]\nid = 1\naddr = \"127.0.0.1:{}\"\n[[subsystem]]\nnqn = \"nqn.x:bad\"\nallow_any_host = true\n\
             [[subsystem.namespace]]\nbackend = \"ram\"\n\
             [[subsystem.namespace]]\nbackend = \"file\"\npath = \"{}\"\nsize = \"1M\"\n",
            free_port(),
            missing.display()
        ),
    )
    .unwrap();
    let sock = dir.path("t.sock");
    let (ok, out, err) = qpath(
        &["target", "--config", cfg.to_str().unwrap(), "--rpc-socket", sock.to_str().unwrap(), "--check"],
        CALL_WITHIN,
    );
    assert!(!ok, "a bad configuration must fail --check:\n{out}");
    assert!(err.contains("2 problems would stop the target from starting"), "{err}");
    assert!(err.contains("namespace 1 of nqn.x:bad: a ram namespace needs a size"), "{err}");
    assert!(err.contains("namespace 2 of nqn.x:bad") && err.contains("nowhere does not exist"), "{err}");
    assert!(!sock.exists() && !err.contains("target started"), "nothing started:\n{err}");
}

#[test]
fn a_bad_size_says_what_a_size_looks_like() {
    let dir = Dir::new("bad-size");
    let cfg = dir.path("t.toml");
    let body = "[[port]]\nid = 1\naddr = \"127.0.0.1:4420\"\n[[subsystem]]\nnqn = \"nqn.x:a\"\nallow_any_host = true\n\
                [[subsystem.namespace]]\nbackend = \"ram\"\nsize = true\n";
    std::fs::write(&cfg, body).unwrap();
    let (ok, _, err) = qpath(&["target", "--config", cfg.to_str().unwrap(), "--check"], CALL_WITHIN);
    assert!(!ok);
    assert!(err.contains("expected a size: a number of bytes (4096) or a string with a unit"), "{err}");
    assert!(!err.contains("untagged") && !err.contains("SizeValue"), "no Rust type names: {err}");
    // A mistyped field of a host table is named, not hidden behind the untagged enum.
    std::fs::write(
        &cfg,
        body.replace("size = true", "size = \"1M\"")
            .replace("allow_any_host = true", "hosts = [{ nqn = \"nqn.h\", dhchap_kye = \"x\" }]"),
    )
    .unwrap();
    let (ok, _, err) = qpath(&["target", "--config", cfg.to_str().unwrap(), "--check"], CALL_WITHIN);
    assert!(!ok);
    assert!(err.contains("unknown field `dhchap_kye`"), "{err}");
    assert!(!err.contains("untagged") && !err.contains("HostEntry"), "{err}");
}

#[test]
fn listen_is_checked_before_anything_starts() {
    let dir = Dir::new("listen");
    let sock = dir.path("t.sock");
    let s = sock.to_str().unwrap();
    let (a, b) = (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()));
    // Two addresses in one --listen.
    let both = format!("{a},{b}");
    let (ok, _, err) = qpath(&["target", "--rpc-socket", s, "--listen", &both], CALL_WITHIN);
    assert!(!ok);
    assert!(err.contains("one IP:PORT per --listen; repeat --listen for each port"), "{err}");
    assert!(!err.contains("target started") && !sock.exists(), "refused before starting:\n{err}");
    // An address that is not IP:PORT.
    let (ok, _, err) = qpath(&["target", "--rpc-socket", s, "--listen", "127.0.0.1:99999"], CALL_WITHIN);
    assert!(!ok);
    assert!(err.contains("expected IP:PORT") && !err.contains("target started"), "{err}");
    // More --listen than ports: says so in words, and what to do.
    let c = format!("127.0.0.1:{}", free_port());
    let (ok, _, err) =
        qpath(&["target", "--rpc-socket", s, "--listen", &a, "--listen", &b, "--listen", &c], CALL_WITHIN);
    assert!(!ok);
    assert!(err.contains("--listen is given 3 times but the configuration has 2 ports"), "{err}");
    assert!(err.contains("add [[port]] tables"), "{err}");
    assert!(!err.contains("target started") && !sock.exists(), "{err}");
    // A metrics address that cannot be bound is refused before the target starts too.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let m = taken.local_addr().unwrap().to_string();
    let (ok, _, err) =
        qpath(&["target", "--rpc-socket", s, "--listen", &a, "--listen", &b, "--metrics", &m], CALL_WITHIN);
    assert!(!ok);
    assert!(err.contains(&format!("--metrics {m}")), "{err}");
    assert!(!err.contains("target started") && !sock.exists(), "{err}");
    // The help says it repeats.
    let (ok, help, _) = qpath(&["target", "--help"], CALL_WITHIN);
    assert!(ok && help.contains("repeated for") && help.contains("--check"), "{help}");
}
