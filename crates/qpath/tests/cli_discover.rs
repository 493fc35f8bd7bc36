//! `qpath discover` and `qpath list-subsys` with no `-s` reach what `qpath target` serves
//! by default: discovery on its I/O port 4420 (nvme-cli's 8009 is only for dedicated
//! discovery controllers, which the default target has none of).
//!
//! Port 4420 of 127.0.0.1 may be taken by another target on this machine, so the target
//! here listens on 4420 of another loopback address (127.0.0.0/8 is all loopback); when
//! that is taken too the test says SKIP.

use std::net::{SocketAddr, TcpListener};

mod target_process;
use target_process::{CALL_WITHIN, Dir, TargetProcess, qpath};

#[test]
fn discover_without_a_port_reaches_the_default_target() {
    let pid = std::process::id();
    let ip = format!("127.{}.{}.{}", 100 + pid % 100, (pid / 100) % 250 + 1, 42);
    let addrs: Vec<SocketAddr> = ["4420", "4421"].iter().map(|p| format!("{ip}:{p}").parse().unwrap()).collect();
    for a in &addrs {
        if let Err(e) = TcpListener::bind(a) {
            println!("SKIP: {a} is not free ({e})");
            return;
        }
    }
    let dir = Dir::new("discover");
    let args: Vec<String> =
        ["--reactors", "1", "--poll", "block", "--listen", &addrs[0].to_string(), "--listen", &addrs[1].to_string()]
            .iter()
            .map(|s| (*s).to_string())
            .collect();
    let _t = TargetProcess::start(&dir, "t", &args, addrs);
    let (ok, out, err) = qpath(&["discover", "-a", &ip], CALL_WITHIN);
    assert!(ok, "qpath discover -a {ip} (no -s):\n{err}");
    assert!(out.contains("subnqn:  nqn.2026-11.io.qpath:default") && out.contains("trsvcid: 4420"), "{out}");
    let (ok, out, err) = qpath(&["list-subsys", "-a", &ip], CALL_WITHIN);
    assert!(ok && out.contains("nqn.2026-11.io.qpath:default"), "qpath list-subsys -a {ip}:\n{out}\n{err}");
    // The help says which port it uses and why.
    let (_, help, _) = qpath(&["discover", "--help"], CALL_WITHIN);
    assert!(help.contains("4420") && help.contains("8009"), "{help}");
}
