//! `qpath rpc` against a running `qpath target`, as a user types it: `key=value` is a
//! string, `key:=JSON` is raw JSON, no params is an empty object, and every `qpath rpc`
//! line of the README runs as written.

mod target_process;
use target_process::{Dir, TargetProcess};

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
    // No params at all: an empty object.
    let v: serde_json::Value = serde_json::from_str(&t.rpc("get_target", &[]).unwrap()).unwrap();
    assert_eq!(v["ports"].as_array().unwrap().len(), 2, "{v}");
    // A mistyped argument is refused before anything is sent.
    let e = t.rpc("set_ana_state", &["port"]).unwrap_err();
    assert!(e.contains("expected key=value"), "{e}");
}

/// The README's `qpath rpc` lines (those for the target's default socket) run as written
/// against the embedded default target, in order; the file paths of the file-namespace and
/// save_config examples are replaced by files of this test.
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
    let t = TargetProcess::start_default(&dir, "t", &[]);
    for line in &lines {
        let words: Vec<String> = line
            .split_whitespace()
            .skip(2)
            .map(|w| {
                w.replace("/var/lib/qpath/vol2.img", image.to_str().unwrap())
                    .replace("/etc/qpath/target.toml", saved.to_str().unwrap())
            })
            .collect();
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        let (method, params) = words.split_first().unwrap();
        if let Err(e) = t.rpc(method, params) {
            panic!("README: `{line}` failed:\n{e}");
        }
    }
    let text = std::fs::read_to_string(&saved).expect("save_config wrote the file");
    assert!(text.contains("nqn.2026-11.io.qpath:default"), "{text}");
}
