//! The namespace and discovery RPCs on a running server (the methods `qpath rpc` calls):
//! what they change, and the errors bad input gets.

use std::net::TcpStream;
use std::time::Duration;

use qpath_target::config::Config;
use qpath_target::rpc::call;
use qpath_target::server::Server;
use serde_json::{Value, json};

const NQN: &str = "nqn.2026-11.io.qpath:rpcadmin";

fn server() -> Server {
    let cfg = Config::parse(&format!(
        r#"
        [reactor]
        reactors = 1
        poll = "block"
        [[port]]
        id = 1
        addr = "127.0.0.1:0"
        [[port]]
        id = 2
        addr = "127.0.0.1:0"
        [[subsystem]]
        nqn = "{NQN}"
        allow_any_host = true
        [[subsystem.namespace]]
        nsid = 1
        backend = "ram"
        size = "1M"
        max_size = "4M"
        [[subsystem.namespace]]
        nsid = 2
        backend = "null"
        size = "1G"
        visible = "listed"
        hosts = ["nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000aa"]
        [[referral]]
        address = "192.0.2.10"
        "#
    ))
    .unwrap();
    cfg.start().unwrap()
}

fn err(s: &Server, method: &str, p: Value) -> String {
    call(s, method, &p).expect_err(method).to_string()
}

#[test]
fn resize_namespace_by_rpc() {
    let s = server();
    let r = call(&s, "resize_namespace", &json!({"nqn": NQN, "nsid": 1, "size": "2M"})).unwrap();
    assert_eq!(r, json!({"nsid": 1, "size": 2 << 20, "previous_size": 1 << 20}));
    let r = call(&s, "resize_namespace", &json!({"nqn": NQN, "nsid": 1, "size": 3145728})).unwrap();
    assert_eq!(r["size"], json!(3 << 20));
    let listed = call(&s, "list_subsystems", &json!({})).unwrap();
    assert_eq!(listed[0]["namespaces"][0]["size"], json!(3 << 20));

    assert_eq!(
        err(&s, "resize_namespace", json!({"nqn": "nqn.2026-11.io.qpath:none", "nsid": 1, "size": "2M"})),
        "no subsystem nqn.2026-11.io.qpath:none"
    );
    assert!(err(&s, "resize_namespace", json!({"nqn": NQN, "nsid": 9, "size": "2M"})).contains("no NSID 9"));
    assert!(
        err(&s, "resize_namespace", json!({"nqn": NQN, "nsid": 1, "size": 0})).contains("cannot be resized to 0 bytes")
    );
    assert!(
        err(&s, "resize_namespace", json!({"nqn": NQN, "nsid": 1, "size": 1000}))
            .contains("not a multiple of the 512-byte block size")
    );
    let e = err(&s, "resize_namespace", json!({"nqn": NQN, "nsid": 1, "size": "5M"}));
    assert!(e.contains("namespace 1 of nqn.2026-11.io.qpath:rpcadmin") && e.contains("max_size, 4194304 bytes"), "{e}");
    assert!(err(&s, "resize_namespace", json!({"nqn": NQN, "nsid": 1})).contains("missing parameter \"size\""));
    assert!(err(&s, "resize_namespace", json!({"nqn": NQN, "nsid": 1, "size": "2 parsecs"})).contains(
        "resize_namespace: size: expected a size (bytes, or a number with a unit: 4096, 512M, 2G), got \"2 parsecs\""
    ));
    s.shutdown();
}

#[test]
fn namespace_hosts_by_rpc() {
    let s = server();
    let host = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000bb";
    let visible = |s: &Server| call(s, "list_subsystems", &json!({})).unwrap()[0]["namespaces"][1]["visible"].clone();
    assert_eq!(
        visible(&s),
        json!({"listed": ["nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000aa"]})
    );
    assert_eq!(
        call(&s, "ns_add_host", &json!({"nqn": NQN, "nsid": 2, "host": host})).unwrap(),
        json!({"changed": true})
    );
    assert_eq!(visible(&s)["listed"].as_array().unwrap().len(), 2);
    assert_eq!(
        call(&s, "ns_remove_host", &json!({"nqn": NQN, "nsid": 2, "host": host})).unwrap(),
        json!({"changed": true})
    );
    assert_eq!(
        call(&s, "ns_remove_host", &json!({"nqn": NQN, "nsid": 2, "host": host})).unwrap(),
        json!({"changed": false})
    );
    assert!(err(&s, "ns_add_host", json!({"nqn": NQN, "nsid": 1, "host": host})).contains("visible to every host"));
    assert!(err(&s, "ns_add_host", json!({"nqn": NQN, "nsid": 3, "host": host})).contains("no NSID 3"));
    assert!(err(&s, "ns_add_host", json!({"nqn": NQN, "nsid": 2, "host": "nqn"})).contains("host NQN"));
    s.shutdown();
}

#[test]
fn referrals_by_rpc() {
    let s = server();
    let refs = |s: &Server| call(s, "get_target", &json!({})).unwrap()["referrals"].clone();
    assert_eq!(
        refs(&s),
        json!([{"address": "192.0.2.10", "port": 8009, "subnqn": "nqn.2014-08.org.nvmexpress.discovery"}])
    );
    call(&s, "add_referral", &json!({"address": "192.0.2.11", "port": 4430})).unwrap();
    assert_eq!(refs(&s).as_array().unwrap().len(), 2);
    assert!(err(&s, "add_referral", json!({"address": "192.0.2.11", "port": 4430})).contains("exists"));
    assert!(err(&s, "add_referral", json!({"address": "host.example"})).contains("an IPv4 or IPv6 address"));
    call(&s, "remove_referral", &json!({"address": "192.0.2.10"})).unwrap();
    assert!(err(&s, "remove_referral", json!({"address": "192.0.2.10"})).contains("no referral"));
    assert_eq!(refs(&s)[0]["address"], json!("192.0.2.11"));
    s.shutdown();
}

#[test]
fn remove_port_by_rpc_closes_the_listener_and_the_id_comes_back() {
    let s = server();
    let addr = s.local_addr(1).unwrap();
    let c = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("port 1 listens");
    call(&s, "remove_port", &json!({"id": 1})).unwrap();
    assert!(TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_err(), "the listener is closed");
    assert_eq!(err(&s, "remove_port", json!({"id": 1})), "no port 1");
    assert_eq!(err(&s, "remove_port", json!({"id": 77})), "no port 77");
    let ports = call(&s, "list_ports", &json!({})).unwrap();
    assert_eq!(ports.as_array().unwrap().len(), 1);
    // The connection made before the removal is closed by the target (read sees EOF).
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 8];
    assert!(matches!(std::io::Read::read(&mut &c, &mut buf), Ok(0) | Err(_)), "closed by the target");
    let r = call(&s, "add_port", &json!({"id": 1, "addr": addr.to_string()})).unwrap();
    assert_eq!(r["addr"], json!(addr.to_string()));
    TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("port 1 listens again");
    s.shutdown();
}

#[test]
fn bad_namespace_and_referral_config_is_refused() {
    let bad = [
        (
            "visible = \"all\"\nhosts = [\"nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000aa\"]",
            "visible = \"listed\"",
        ),
        ("visible = \"some\"", "unknown variant"),
        ("visible = \"listed\"\nhosts = [\"nope\"]", "host NQN"),
        ("max_size = \"512K\"", "smaller than the RAM namespace's size"),
    ];
    for (line, want) in bad {
        let text = format!(
            "[[subsystem]]\nnqn = \"{NQN}\"\n[[subsystem.namespace]]\nbackend = \"ram\"\nsize = \"1M\"\n{line}\n"
        );
        let e = Config::parse(&text).and_then(|c| c.build_state().map(|_| ())).unwrap_err().to_string();
        assert!(e.contains(want), "{line}: {e}");
    }
    let e = Config::parse(&format!("[[subsystem]]\nnqn = \"{NQN}\"\n[[subsystem.namespace]]\nbackend = \"null\"\nsize = \"1M\"\nmax_size = \"2M\"\n"))
        .unwrap()
        .build_state()
        .unwrap_err()
        .to_string();
    assert!(e.contains("max_size is for ram namespaces"), "{e}");
    let e =
        Config::parse("[[referral]]\naddress = \"192.0.2.1\"\nsubnqn = \"bad\"\n").unwrap().build_state().unwrap_err();
    assert!(e.to_string().contains("referral subnqn"), "{e}");
    assert!(Config::parse("[[referral]]\naddress = \"192.0.2.1\"\ncolour = 1\n").is_err());
}
