//! The embedded target most tests start: the default configuration (one subsystem, one RAM
//! namespace, two ports) on ephemeral loopback ports, reactors blocking in the kernel so
//! the test's own threads get the CPUs. Also the free port for tests that start a
//! target process of their own.

#![allow(dead_code)] // each test crate uses a part

use std::net::{SocketAddr, TcpListener};

use target::config::{Config, SizeValue};
use target::reactor::{PollMode, ReactorOptions};
use target::server::Server;

/// Starts the target with `reactors` reactors and a namespace of `size` (e.g. "64M");
/// returns it and its ports' addresses in port order.
pub fn target(reactors: usize, size: &str) -> (Server, Vec<SocketAddr>) {
    let mut c = Config::embedded_default();
    c.reactor = ReactorOptions { reactors, cpus: vec![], poll: PollMode::Block, spin_us: 0 };
    for p in &mut c.ports {
        p.addr = "127.0.0.1:0".into();
    }
    c.subsystems[0].namespaces[0].size = Some(SizeValue::Text(size.into()));
    let server = c.start().expect("the embedded target starts");
    let addrs = server.state.ports().iter().map(|p| p.addr).collect();
    (server, addrs)
}

/// A loopback port nothing listens on now (the OS's pick; free until someone binds it).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port").local_addr().expect("its address").port()
}
