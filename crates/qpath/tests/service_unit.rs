//! The systemd units the package installs (`packaging/qpath-target.service`,
//! `packaging/qpath-host.service`), checked by
//! systemd's own tools: `systemd-analyze verify` accepts it (with its ExecStart pointed at
//! the binary under test and its Documentation= at the pages `qpath man` writes), every
//! option its command line uses exists, and `systemd-analyze security` rates its sandbox.
//! Skips with a reason where systemd-analyze is missing (scripts/install-deps.sh installs
//! systemd where it can). What the unit does when systemd runs it is shown by
//! tests/package/run.sh, which boots a Debian container.

mod target_process;
use target_process::{CALL_WITHIN, Dir, qpath, run};

const UNIT: &str = include_str!("../../../packaging/qpath-target.service");
const HOST_UNIT: &str = include_str!("../../../packaging/qpath-host.service");

fn systemd_analyze() -> Option<std::process::Command> {
    let ok = std::process::Command::new("systemd-analyze").arg("--version").output().is_ok_and(|o| o.status.success());
    ok.then(|| std::process::Command::new("systemd-analyze"))
}

/// The unit with its binary at `bin` instead of /usr/bin/qpath.
fn unit_for(bin: &str) -> String {
    assert!(UNIT.contains("ExecStart=/usr/bin/qpath target "), "the unit starts /usr/bin/qpath target");
    UNIT.replace("/usr/bin/qpath", bin)
}

/// The value of `Key=` in the unit (the last one).
fn setting<'a>(key: &str) -> &'a str {
    setting_in(UNIT, key)
}

/// The value of `Key=` in `unit` (the last one).
fn setting_in<'a>(unit: &'a str, key: &str) -> &'a str {
    unit.lines()
        .filter_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .next_back()
        .unwrap_or_else(|| panic!("the unit has no {key}="))
}

#[test]
fn systemd_analyze_verify_accepts_the_unit() {
    let Some(verify) = systemd_analyze() else {
        println!("SKIP: systemd-analyze is not installed (apt-get install systemd)");
        return;
    };
    verify_unit(verify, "service-unit-verify", "qpath-target.service", &unit_for(env!("CARGO_BIN_EXE_qpath")));
}

/// `systemd-analyze verify` of `text` as unit `name`, in a directory of its own with the
/// manual pages the package ships (the unit's Documentation=man:... must find its page):
/// no refusal and no complaint about the unit (verify prints problems it does not fail on,
/// unknown settings, bad paths, as warnings).
fn verify_unit(mut verify: std::process::Command, dir: &str, name: &str, text: &str) {
    let dir = Dir::new(dir);
    let unit = dir.path(name);
    std::fs::write(&unit, text).unwrap();
    let man = dir.path("man");
    let (ok, _, err) = qpath(&["man", man.join("man1").to_str().unwrap()], CALL_WITHIN);
    assert!(ok, "qpath man: {err}");
    verify.env("MANPATH", &man).arg("verify").arg("--man=yes").arg(&unit);
    let (ok, out, err) = run(verify, CALL_WITHIN);
    assert!(ok, "systemd-analyze verify refused the unit:\n{out}{err}");
    let complaints: Vec<&str> = err.lines().chain(out.lines()).filter(|l| l.contains(name)).collect();
    assert!(complaints.is_empty(), "systemd-analyze verify complained:\n{}", complaints.join("\n"));
}

#[test]
fn the_command_line_of_the_unit_is_one_qpath_target_accepts() {
    let exec = setting("ExecStart");
    let args: Vec<&str> = exec.split_whitespace().skip(1).filter(|a| !a.starts_with('$')).collect();
    assert_eq!(args[0], "target");
    let dir = Dir::new("service-unit-args");
    // The same options, on a configuration of this test's (the real one is /etc's), checked.
    let cfg = dir.path("target.toml");
    std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/../../packaging/target.toml"), &cfg).unwrap();
    let sock = dir.path("qpath.sock");
    let mut a: Vec<String> = Vec::new();
    let mut it = args.iter();
    while let Some(&x) = it.next() {
        match x {
            "--config" => {
                it.next();
                a.extend(["--config".into(), cfg.display().to_string()]);
            }
            "--rpc-socket" => {
                assert!(it.next().is_some_and(|p| p.starts_with("/run/qpath/")), "the socket is in RuntimeDirectory=");
                a.extend(["--rpc-socket".into(), sock.display().to_string()]);
            }
            other => a.push(other.to_string()),
        }
    }
    a.push("--check".into());
    let refs: Vec<&str> = a.iter().map(String::as_str).collect();
    let (ok, out, err) = qpath(&refs, CALL_WITHIN);
    assert!(ok, "qpath {refs:?}:\n{out}{err}");
    assert!(out.contains("configuration OK"), "{out}");
    assert_eq!(setting("RuntimeDirectory"), "qpath");
    assert_eq!(setting("Type"), "notify", "READY=1 is sent (see service_notify.rs)");
}

#[test]
fn systemd_analyze_security_rates_the_sandbox_ok() {
    let Some(security) = systemd_analyze() else {
        println!("SKIP: systemd-analyze is not installed (apt-get install systemd)");
        return;
    };
    // Exposure from 0 (everything locked) to 10 (nothing), given to --threshold in tenths:
    // the unit rates 2.3 ("OK" in systemd's words; root, the host's network and /dev are
    // what it keeps, see the unit's comments). Above it, a setting was dropped.
    rate_unit(security, "service-unit-security", "qpath-target.service", UNIT, 23);
}

/// `systemd-analyze security` of `text` as unit `name`: an exposure of at most
/// `tenths` / 10.
fn rate_unit(mut security: std::process::Command, dir: &str, name: &str, text: &str, tenths: u32) {
    let dir = Dir::new(dir);
    let unit = dir.path(name);
    std::fs::write(&unit, text).unwrap();
    security.arg("security").arg("--offline=yes").arg(format!("--threshold={tenths}")).arg("--no-pager").arg(&unit);
    let (ok, out, err) = run(security, CALL_WITHIN);
    let overall = out.lines().find(|l| l.contains("Overall exposure level")).unwrap_or("no overall exposure level");
    println!("{overall}");
    let limit = f64::from(tenths) / 10.0;
    assert!(ok, "systemd-analyze security rates {name} above {limit}:\n{out}{err}");
}

/// The system calls a `SystemCallFilter=` allow list lets through, its @groups expanded
/// by `systemd-analyze syscall-filter`.
fn allowed(analyze: &mut impl FnMut() -> std::process::Command, list: &str, into: &mut Vec<String>) {
    for name in list.split_whitespace() {
        assert!(!name.starts_with('~'), "the unit's filter is an allow list: {list}");
        if let Some(group) = name.strip_prefix('@') {
            let mut c = analyze();
            c.arg("syscall-filter").arg(format!("@{group}")).arg("--no-pager");
            let (ok, out, err) = run(c, CALL_WITHIN);
            assert!(ok, "systemd-analyze syscall-filter @{group}: {err}");
            let members: Vec<&str> = out
                .lines()
                .filter(|l| l.starts_with("    ") && !l.trim_start().starts_with('#'))
                .map(str::trim)
                .filter(|m| !m.is_empty())
                .collect();
            assert!(!members.is_empty(), "@{group} lists no system call:\n{out}");
            allowed(analyze, &members.join(" "), into);
        } else if !into.iter().any(|n| n == name) {
            into.push(name.to_string());
        }
    }
}

#[test]
fn the_system_call_filter_lets_io_uring_through() {
    if systemd_analyze().is_none() {
        println!("SKIP: systemd-analyze is not installed (apt-get install systemd)");
        return;
    }
    let mut names = Vec::new();
    allowed(&mut || systemd_analyze().unwrap(), setting("SystemCallFilter"), &mut names);
    // The reactors' rings, pinning, the authentication workers' nice value, file locks,
    // preallocation and the page-cache drop of a namespace's file.
    for needed in [
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "sched_setaffinity",
        "setpriority",
        "flock",
        "fallocate",
        "fadvise64",
        "madvise",
    ] {
        assert!(names.iter().any(|n| n == needed), "SystemCallFilter= does not allow {needed}");
    }
}

#[test]
fn systemd_analyze_verify_accepts_the_host_unit() {
    let Some(verify) = systemd_analyze() else {
        println!("SKIP: systemd-analyze is not installed (apt-get install systemd)");
        return;
    };
    let unit = HOST_UNIT.replace("/usr/bin/qpath", env!("CARGO_BIN_EXE_qpath"));
    verify_unit(verify, "service-unit-verify-host", "qpath-host.service", &unit);
}

/// The host's unit runs `qpath host` with options it accepts, on the shipped (empty)
/// host.toml, in a runtime directory of its own: not the target's /run/qpath, which
/// systemd removes whenever qpath-target stops.
#[test]
fn the_command_line_of_the_host_unit_is_one_qpath_host_accepts() {
    let exec = setting_in(HOST_UNIT, "ExecStart");
    let args: Vec<&str> = exec.split_whitespace().skip(1).filter(|a| !a.starts_with('$')).collect();
    assert_eq!(args[0], "host");
    let dir = Dir::new("service-unit-host-args");
    let cfg = dir.path("host.toml");
    std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/../../packaging/host.toml"), &cfg).unwrap();
    let runtime = setting_in(HOST_UNIT, "RuntimeDirectory");
    assert_ne!(runtime, setting("RuntimeDirectory"), "the host's runtime directory is not the target's");
    assert_eq!(setting_in(HOST_UNIT, "RuntimeDirectoryPreserve"), "yes", "state files outlive a stop");
    let mut a: Vec<String> = Vec::new();
    let mut it = args.iter();
    while let Some(&x) = it.next() {
        match x {
            "--config" => {
                it.next();
                a.extend(["--config".into(), cfg.display().to_string()]);
            }
            "--rpc-socket" | "--state-dir" => {
                let p = it.next().unwrap();
                assert!(p.starts_with(&format!("/run/{runtime}")), "{x} {p}: in RuntimeDirectory=");
                a.extend([x.to_string(), dir.path("run").display().to_string()]);
            }
            other => a.push(other.to_string()),
        }
    }
    a.push("--check".into());
    let refs: Vec<&str> = a.iter().map(String::as_str).collect();
    let (ok, out, err) = qpath(&refs, CALL_WITHIN);
    assert!(ok, "qpath {refs:?}:\n{out}{err}");
    assert!(out.contains("configuration OK, 0 device(s)"), "the shipped host.toml serves nothing: {out}");
    assert!(a.iter().any(|x| x == "--persist"));
    assert_eq!(setting_in(HOST_UNIT, "Type"), "notify", "READY=1 is sent (see cli_ublk.rs)");
    assert_eq!(setting_in(HOST_UNIT, "CapabilityBoundingSet"), "CAP_SYS_ADMIN", "ublk_drv's control commands");
    for allow in ["DeviceAllow=/dev/ublk-control rw", "DeviceAllow=char-ublk-char rw"] {
        assert!(HOST_UNIT.lines().any(|l| l == allow), "{allow}");
    }
}

#[test]
fn systemd_analyze_security_rates_the_host_sandbox_ok() {
    let Some(security) = systemd_analyze() else {
        println!("SKIP: systemd-analyze is not installed (apt-get install systemd)");
        return;
    };
    // 2.5 ("OK"): the target's 2.3 plus CAP_SYS_ADMIN, which ublk_drv needs.
    rate_unit(security, "service-unit-security-host", "qpath-host.service", HOST_UNIT, 25);
}
