//! `qpath rpc` against a running `qpath target`, as a user types it: `key=value` is a
//! string the target converts to the parameter's type, `key:=JSON` is raw JSON, no params
//! is an empty object, and every `qpath rpc` line of the README runs as written (and with
//! its numbers written the other way). The methods are listed and described by the target
//! (`--list`, `METHOD --help`), unknown parameters are refused, changes are audited in the
//! log without secrets, and a second target never takes the first one's socket.

mod target_process;
use target_process::{CALL_WITHIN, Dir, TargetProcess, free_port, qpath};

const NQN: &str = "nqn.2026-11.io.qpath:default";

#[test]
fn key_value_is_a_string_and_colon_equals_is_json() {
    let dir = Dir::new("rpc-typed");
    let t = TargetProcess::start_default(&dir, "t", &[]);
    // A string that parses as JSON stays a string: these failed with serde errors when
    // values were read as JSON first (`null` is not a string, 1234 is not a string).
    let nqn = format!("nqn={NQN}");
    let out = t.rpc("add_namespace", &[&nqn, "backend=null", "size=1M"]).expect("backend=null");
    let nsid: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(nsid["nsid"], 2, "{out}");
    t.rpc("add_subsystem", &["nqn=nqn.2026-11.io.qpath:serial", "serial=1234", "allow_any_host:=true"])
        .expect("serial=1234");
    let subs: serde_json::Value = serde_json::from_str(&t.rpc("list_subsystems", &[]).unwrap()).unwrap();
    let s = subs.as_array().unwrap().iter().find(|s| s["nqn"] == "nqn.2026-11.io.qpath:serial").unwrap();
    assert_eq!(s["serial"], "1234");
    assert_eq!(s["allow_any_host"], true);
    // Numbers and booleans go typed with :=.
    t.rpc("remove_namespace", &[&nqn, "nsid:=2"]).expect("nsid:=2");
    t.rpc("set_port_fault", &["port:=1", "refuse_connects:=false", "delay_us:=0"]).expect("typed port fault");
    // A number sent as a string is converted by the target, which knows the parameter's type.
    t.rpc("add_namespace", &[&nqn, "backend=null", "size=1M", "nsid=3"]).expect("nsid=3");
    t.rpc("remove_namespace", &[&nqn, "nsid=3"]).expect("nsid=3 converts");
    // A value that does not convert names the parameter, its type and the value.
    let e = t.rpc("remove_namespace", &[&nqn, "nsid=one"]).unwrap_err();
    assert!(e.contains("remove_namespace: nsid: expected an integer") && e.contains("got \"one\""), "{e}");
    assert!(!e.contains("invalid type"), "no serde jargon: {e}");
    // No params at all: an empty object.
    let v: serde_json::Value = serde_json::from_str(&t.rpc("get_target", &[]).unwrap()).unwrap();
    assert_eq!(v["ports"].as_array().unwrap().len(), 2, "{v}");
    // A mistyped argument is refused before anything is sent.
    let e = t.rpc("set_ana_state", &["port"]).unwrap_err();
    assert!(e.contains("expected key=value"), "{e}");
}

/// The README's `qpath rpc` lines (those for the target's default socket) run as written
/// against the embedded default target, in order, and again on a fresh target with every
/// number and boolean written the other way (`key=1` as `key:=1` and back); the file paths
/// of the file-namespace and save_config examples are replaced by files of this test.
#[test]
fn the_readme_rpc_examples_work() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let lines: Vec<&str> = readme
        .lines()
        .filter(|l| l.starts_with("qpath rpc ") && !l.contains("--socket"))
        .map(|l| l.split_once("  #").map_or(l, |(cmd, _)| cmd).trim())
        .collect();
    assert!(lines.len() >= 4, "README's qpath rpc examples: {lines:?}");
    let dir = Dir::new("rpc-readme");
    let image = dir.path("vol2.img");
    std::fs::write(&image, vec![0u8; 1 << 20]).unwrap();
    let saved = dir.path("saved.toml");
    let mut flipped = 0;
    for (run, name) in ["as-written", "flipped"].iter().enumerate() {
        let t = TargetProcess::start_default(&dir, name, &[]);
        for line in &lines {
            let words: Vec<String> = line
                .split_whitespace()
                .skip(2)
                .map(|w| {
                    let w = w
                        .replace("/var/lib/qpath/vol2.img", image.to_str().unwrap())
                        .replace("/etc/qpath/target.toml", saved.to_str().unwrap());
                    if run == 0 {
                        return w;
                    }
                    let typed = |v: &str| v.parse::<i64>().is_ok() || v == "true" || v == "false";
                    match (w.split_once(":="), w.split_once('=')) {
                        (Some((k, v)), _) if typed(v) => {
                            flipped += 1;
                            format!("{k}={v}")
                        }
                        (None, Some((k, v))) if typed(v) => {
                            flipped += 1;
                            format!("{k}:={v}")
                        }
                        _ => w,
                    }
                })
                .collect();
            let words: Vec<&str> = words.iter().map(String::as_str).collect();
            let (method, params) = words.split_first().unwrap();
            if let Err(e) = t.rpc(method, params) {
                panic!("README ({name}): `{}` failed:\n{e}", words.join(" "));
            }
        }
        let text = std::fs::read_to_string(&saved).expect("save_config wrote the file");
        assert!(text.contains("nqn.2026-11.io.qpath:default"), "{text}");
        std::fs::remove_file(&saved).unwrap();
    }
    assert!(flipped >= 4, "the README's numbers were written both ways ({flipped})");
}

/// This process's effective uid, as /proc says it.
fn my_uid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(2).unwrap().parse().unwrap()
}

#[test]
fn the_target_lists_and_describes_its_methods() {
    let dir = Dir::new("rpc-methods");
    let t = TargetProcess::start_default(&dir, "t", &[]);
    let list = t.rpc("--list", &[]).expect("--list");
    let line = |name: &str| list.lines().find(|l| l.split_whitespace().next() == Some(name)).map(str::to_string);
    let qos = line("set_qos").unwrap_or_else(|| panic!("set_qos in --list:\n{list}"));
    assert!(qos.contains("config") && qos.contains("provisioned limits"), "{qos}");
    let add = line("add_subsystem").unwrap();
    assert!(add.contains("allow_any_host defaults to false"), "{add}");
    assert!(line("get_target").is_some() && line("rpc_get_methods").is_some(), "{list}");
    assert_eq!(t.rpc("help", &[]).unwrap(), list, "`qpath rpc help` is --list");

    let help = t.rpc("set_qos", &["--help"]).expect("set_qos --help");
    let row = |name: &str| help.lines().find(|l| l.split_whitespace().next() == Some(name)).map(str::to_string);
    let iops = row("iops").unwrap_or_else(|| panic!("iops in set_qos --help:\n{help}"));
    assert!(iops.contains("integer") && iops.contains("default 0") && iops.contains("no limit"), "{iops}");
    assert!(row("nqn").unwrap().contains("required"), "{help}");
    assert!(help.contains("changes the configuration"), "{help}");
    assert_eq!(t.rpc("help", &["set_qos"]).unwrap(), help, "`qpath rpc help METHOD` is METHOD --help");
    let auth = t.rpc("set_host_auth", &["-h"]).unwrap();
    assert!(row_of(&auth, "dhchap_key").contains("secret"), "{auth}");
    let e = t.rpc("set_qso", &["--help"]).unwrap_err();
    assert!(e.contains("did you mean \"set_qos\"") && e.contains("--list"), "{e}");

    // Nobody on the socket: said plainly, with what to do.
    let (ok, _, err) = qpath(&["rpc", "--socket", dir.path("none.sock").to_str().unwrap(), "--list"], CALL_WITHIN);
    assert!(!ok);
    assert!(err.contains("no qpath target answers on") && err.contains("--socket"), "{err}");
    let (ok, _, err) =
        qpath(&["rpc", "--socket", dir.path("none.sock").to_str().unwrap(), "stats", "--help"], CALL_WITHIN);
    assert!(!ok && err.contains("no qpath target answers on"), "{err}");
    // Without a method, --help is the command's own help, target or not.
    let (ok, out, _) = qpath(&["rpc", "--socket", dir.path("none.sock").to_str().unwrap(), "--help"], CALL_WITHIN);
    assert!(ok && out.contains("key:=JSON") && out.contains("--list"), "{out}");
}

fn row_of(help: &str, name: &str) -> String {
    help.lines().find(|l| l.split_whitespace().next() == Some(name)).unwrap_or_default().to_string()
}

#[test]
fn unknown_parameters_are_refused_with_the_methods_parameters() {
    let dir = Dir::new("rpc-unknown");
    let t = TargetProcess::start_default(&dir, "t", &[]);
    let nqn = format!("nqn={NQN}");
    let e = t.rpc("set_qos", &[&nqn, "nsid=1", "iops_limit=100"]).unwrap_err();
    assert!(e.contains("unknown parameter \"iops_limit\" (did you mean \"iops\"?)"), "{e}");
    assert!(e.contains("set_qos takes nqn, nsid, iops, bytes_per_sec, delay_us"), "{e}");
    assert!(e.contains("qpath rpc set_qos --help"), "{e}");
    // Nothing was changed.
    let subs: serde_json::Value = serde_json::from_str(&t.rpc("list_subsystems", &[]).unwrap()).unwrap();
    assert_eq!(subs[0]["namespaces"][0]["qos"]["iops"], 0, "{subs}");
    // A field of a nested table, named by its path.
    let e = t
        .rpc(
            "add_subsystem",
            &["nqn=nqn.2026-11.io.qpath:x", r#"namespace:=[{"backend": "ram", "size": "1M", "blocksize": 4096}]"#],
        )
        .unwrap_err();
    assert!(e.contains("\"namespace[0].blocksize\" (did you mean \"block_size\"?)"), "{e}");
}

#[test]
fn changes_are_audited_with_the_callers_uid_and_no_secret() {
    let dir = Dir::new("rpc-audit");
    let t = TargetProcess::start_default(&dir, "t", &[]);
    let nqn = format!("nqn={NQN}");
    t.rpc("set_qos", &[&nqn, "nsid=1", "iops=5000"]).expect("set_qos");
    let key = nvme::auth::Secret::generate(Some(nvme::auth::HashId::Sha256), 32).unwrap().to_string();
    let host = "host=nqn.2014-08.org.nvmexpress:uuid:0a0a0a0a-0a0a-4a0a-8a0a-0a0a0a0a0a0a";
    let answer = t.rpc("set_host_auth", &[&nqn, host, &format!("dhchap_key={key}")]).expect("set_host_auth");
    let listed = t.rpc("list_subsystems", &[]).unwrap();
    // A refused call with a secret where it does not belong.
    t.rpc("set_host_auth", &[&nqn, host, &format!("dhchap_secret={key}")]).unwrap_err();
    let log = t.log_text();
    let changes: Vec<&str> = log.lines().filter(|l| l.contains("RPC change")).collect();
    assert_eq!(changes.len(), 2, "one line per change, none for reads:\n{log}");
    let uid = format!("uid={}", my_uid());
    assert!(changes.iter().all(|l| l.contains(&uid) && l.contains("pid=")), "{log}");
    assert!(changes[0].contains("method=\"set_qos\"") && changes[0].contains("\"iops\":5000"), "{log}");
    assert!(
        changes[1].contains("method=\"set_host_auth\"") && changes[1].contains("\"dhchap_key\":\"<secret>\""),
        "{log}"
    );
    let body = key.split(':').nth(2).unwrap();
    for (what, text) in [("log", &log), ("answer", &answer), ("list_subsystems", &listed)] {
        assert!(!text.contains(body), "the secret reached the {what}:\n{text}");
    }
}

#[test]
fn a_second_target_is_refused_the_socket_the_first_serves() {
    let dir = Dir::new("rpc-socket");
    let mut first = TargetProcess::start_default(&dir, "t", &[]);
    let sock = first.rpc.to_str().unwrap().to_string();
    let (a, b) = (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()));
    let second =
        ["target", "--reactors", "1", "--poll", "block", "--listen", &a, "--listen", &b, "--rpc-socket", &sock];
    let (ok, _, err) = qpath(&second, CALL_WITHIN);
    assert!(!ok, "the second target must not start");
    assert!(
        err.contains(&format!("process {}", first.pid())) && err.contains("serves it") && err.contains("--rpc-socket"),
        "{err}"
    );
    // The first keeps its socket and serves on it.
    assert!(first.rpc.exists());
    first.rpc("get_target", &[]).expect("the first target still answers");
    // A target killed with SIGKILL leaves its socket behind: stale, it is replaced.
    first.kill();
    assert!(first.rpc.exists(), "a killed target's socket stays behind");
    let third = TargetProcess::start_default(&dir, "t", &[]);
    third.rpc("get_target", &[]).expect("the stale socket was replaced");
    assert!(third.log_text().contains("replacing a stale RPC socket"), "{}", third.log_text());
}
