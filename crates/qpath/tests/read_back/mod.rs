//! Reading back what a test wrote through faults: every 4 KiB block must hold the byte
//! of its last acknowledged write.

use std::time::{Duration, Instant};

use host::context::{Context, DeviceId, Op};
use uring::{IoBuf, Wait};

/// Reads blocks `0..last.len()` one at a time and checks that block `b` is filled with
/// `last[b]`; the test fails if any read fails or the whole pass takes over `timeout`.
pub fn check_last_writes(ctx: &mut Context, dev: DeviceId, last: &[u8], timeout: Duration) {
    let t = Instant::now();
    for (block, &want) in (0u64..).zip(last) {
        ctx.submit(dev, Op::Read, block * 4096, 4096, Some(IoBuf::new(4096)), block).map_err(|(e, _)| e).unwrap();
        let c = loop {
            ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(2)) }).unwrap();
            if let Some(c) = ctx.completions().next() {
                break c;
            }
            assert!(t.elapsed() < timeout, "read-back timed out");
        };
        assert!(c.status.is_success(), "read of block {block}: {}", c.status);
        assert!(c.buf.unwrap().iter().all(|&b| b == want), "block {block} does not hold its last write ({want})");
    }
}
