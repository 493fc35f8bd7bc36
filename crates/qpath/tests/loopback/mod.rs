//! The embedded target most tests start: the default configuration (one subsystem, one RAM
//! namespace, two ports) on ephemeral loopback ports, reactors blocking in the kernel so
//! the test's own threads get the CPUs. Also the free port for tests that start a
//! target process of their own.

#![allow(dead_code)] // each test crate uses a part

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use host::context::{Context, DeviceId, Op};
use nvme::Status;
use uring::{IoBuf, Wait};

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

/// Submits one 4 KiB I/O of `op` at `offset` on `dev` (a read or a write with a buffer
/// filled with `byte`) and waits up to 10 s for its completion: its status and the data
/// its buffer came back with. A refusal at submission is the error.
pub fn io_4k(
    ctx: &mut Context,
    dev: DeviceId,
    op: Op,
    offset: u64,
    byte: u8,
) -> Result<(Status, Vec<u8>), host::Error> {
    let mut b = IoBuf::new(4096);
    b.set_len(4096);
    b.fill(byte);
    let buf = matches!(op, Op::Read | Op::Write).then_some(b);
    ctx.submit(dev, op, offset, 4096, buf, 7).map_err(|(e, _)| e)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "I/O timed out");
        ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(5)) }).unwrap();
        if let Some(c) = ctx.completions().next() {
            return Ok((c.status, c.buf.map(|b| b.to_vec()).unwrap_or_default()));
        }
    }
}
