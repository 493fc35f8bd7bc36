//! A `qpath bench` job against a target that requires DH-HMAC-CHAP (the secret in the
//! job's URI), whose keys are rotated while it runs: the target is given a new secret,
//! then the bench's RPC socket is asked to `reauthenticate` with it. Every queue
//! re-authenticates beside the job's I/O, the job ends without an error, and the
//! target computed the steps of the connect and of the re-authentication.

mod loopback;
mod run_bounded;

use std::process::Command;
use std::time::{Duration, Instant};

use nvme::auth::{DhGroup, HashId, Secret};
use serde_json::{Value, json};
use target::config::{Config, HostAuthConfig, HostEntry, NamespaceConfig, PortConfig, SubsystemConfig};

use loopback::free_port;

const NQN: &str = "nqn.2026-11.io.qpath:bench-reauth";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:3c9d5e7f-1a2b-4c3d-8e4f-5a6b7c8d9e0f";

#[test]
fn a_running_jobs_keys_rotate_through_the_bench_rpc() {
    let dir = std::env::temp_dir().join(format!("qpath-bench-reauth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("host.sock");
    let key = Secret::generate(Some(HashId::Sha256), 32).unwrap();
    let port = free_port();
    let mut c = Config::embedded_default();
    c.ports = vec![PortConfig::io(1, format!("127.0.0.1:{port}"))];
    c.subsystems = vec![SubsystemConfig {
        allow_any_host: false,
        hosts: vec![HostEntry::Auth(HostAuthConfig {
            nqn: HOST.into(),
            dhchap_key: Some(key.to_string()),
            dhchap_ctrl_key: None,
            hash: None,
            dhgroup: Some(DhGroup::Ffdhe2048.name().into()),
            ..Default::default()
        })],
        ..SubsystemConfig::open(NQN, vec![NamespaceConfig::ram(1, "16M")])
    }];
    let server = std::sync::Arc::new(c.start().unwrap());

    let uri = format!("nvme+tcp://127.0.0.1:{port}/{NQN}/1?hostnqn={HOST}&dhchap_secret={key}");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_qpath"));
    cmd.args(["bench", "--output-format=json", "--rpc-socket"]).arg(&sock).args([
        "--",
        "--name=reauth",
        "--ioengine=qpath",
        "--rw=randrw",
        "--bs=4k",
        "--iodepth=16",
        "--size=16M",
        "--time_based",
        "--runtime=4",
        "--verify=crc32c",
        &format!("--filename={uri}"),
    ]);
    let job = std::thread::spawn(move || run_bounded::run(cmd, Duration::from_secs(120)));

    // Once the job runs (its socket answers and a controller is registered), rotate.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = target::rpc::client_call(&sock, "stats", json!({}))
            .is_ok_and(|v| v["controllers"].as_array().is_some_and(|c| !c.is_empty()));
        if ready {
            break;
        }
        assert!(Instant::now() < deadline, "the job did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let connect_steps = server.state.auth_workers.computed();
    let fresh = Secret::generate(Some(HashId::Sha256), 32).unwrap();
    let p = json!({"nqn": NQN, "host": HOST, "dhchap_key": fresh.to_string(), "dhgroup": "ffdhe2048"});
    target::rpc::call(&server, "set_host_auth", &p).unwrap();
    let v = target::rpc::client_call(&sock, "reauthenticate", json!({"dhchap_secret": fresh.to_string()})).unwrap();
    let (status, stdout, stderr) = job.join().unwrap();
    assert!(status.success(), "bench failed\nstderr:\n{stderr}");

    let r = &v.as_array().unwrap()[..];
    assert_eq!(r.len(), 1, "{v}");
    assert_eq!((&r[0]["ok"], &r[0]["failed"]), (&true.into(), &json!([])), "{v}");
    let queues = r[0]["io_queues"].as_u64().unwrap();
    assert!(queues >= 1, "{v}");
    // Two steps per queue (admin + I/O) at the connect, as many again at the re-authentication.
    assert_eq!(connect_steps, 2 * (queues + 1), "connect");
    assert_eq!(server.state.auth_workers.computed(), 4 * (queues + 1), "connect and re-authentication");
    let secret = key.to_string();
    let base64 = secret.split(':').nth(2).unwrap();
    assert!(!stdout.contains(base64) && !stderr.contains(base64), "the secret is printed:\n{stdout}\n{stderr}");
    let out: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("JSON: {e}\n{stdout}"));
    let j = &out["jobs"][0];
    assert_eq!(j["error"], 0, "{j}");
    assert!(j["read"]["total_ios"].as_u64().unwrap() > 0 && j["write"]["total_ios"].as_u64().unwrap() > 0, "{j}");
    eprintln!("re-authenticated admin + {queues} I/O queues in {} ms under the job", r[0]["ms"]);
    if let Ok(s) = std::sync::Arc::try_unwrap(server) {
        s.shutdown();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
