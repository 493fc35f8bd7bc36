//! What one TLS record costs in CPU time (the calling thread's, from the scheduler's
//! runtime count, which other work on a shared machine inflates far less than wall time): sealing and opening
//! AES-128-GCM records of the sizes NVMe/TCP sends, and a 4 KiB read's data sealed out of
//! a RAM namespace (random 4 KiB blocks of a 256 MiB shared region). Prints the best of
//! five runs of each. To compare two commits, build this at each and run them
//! alternately on one CPU:
//!
//! ```sh
//! cargo build --release -p qpath-tls --example record_cpu
//! taskset -c 1 target/release/examples/record_cpu
//! ```

use std::time::Duration;

use tls::record::{Dir, HEADER_LEN, Keys, OVERHEAD, Sealer, Suite, content, open};
use uring::{RegionOptions, SharedRegion};

const SECRET: [u8; 32] = [7; 32];
const RUNS: usize = 5;

fn cpu() -> Duration {
    uring::thread_cpu_clock().expect("clock_gettime(CLOCK_THREAD_CPUTIME_ID)")
}

/// The best per-call CPU time, in ns, of `RUNS` runs of `iters` calls of `f`.
fn best_ns(iters: u32, mut f: impl FnMut(u32)) -> u128 {
    (0..RUNS)
        .map(|_| {
            let t = cpu();
            for i in 0..iters {
                f(i);
            }
            (cpu() - t).as_nanos() / u128::from(iters)
        })
        .min()
        .unwrap_or(0)
}

fn main() {
    println!("AES-128-GCM, CPU time per record (best of {RUNS}):");
    for len in [72usize, 4096 + 24, 16383] {
        let plain = vec![0x5au8; len];
        let mut out = vec![0u8; HEADER_LEN + len + 1 + 16];
        let iters = u32::try_from(40_000_000 / (len + 200)).unwrap_or(1);
        let mut keys = Keys::new(Suite::Aes128GcmSha256, Dir::Seal, &SECRET).expect("keys");
        let seal = best_ns(iters, |_| {
            let mut s = Sealer::begin(&mut keys, &mut out, len).expect("begin");
            s.copy(&plain).expect("copy");
            std::hint::black_box(s.finish(content::APPLICATION_DATA).expect("finish"));
        });
        let mut sealer = Keys::new(Suite::Aes128GcmSha256, Dir::Seal, &SECRET).expect("keys");
        let mut opener = Keys::new(Suite::Aes128GcmSha256, Dir::Open, &SECRET).expect("keys");
        let mut dst = vec![0u8; len + 1];
        let both = best_ns(iters, |_| {
            let mut s = Sealer::begin(&mut sealer, &mut out, len).expect("begin");
            s.copy(&plain).expect("copy");
            s.finish(content::APPLICATION_DATA).expect("finish");
            std::hint::black_box(open(&mut opener, &mut out, Some(&mut dst)).expect("open"));
        });
        println!("  {len:>6} B: seal {seal} ns, open {} ns (seal + open, less seal)", both.saturating_sub(seal));
    }
    const REGION: usize = 256 << 20;
    const BLOCK: usize = 4096;
    let region =
        SharedRegion::with_options(REGION, RegionOptions { populate: true, huge_pages: false }).expect("region");
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let blocks = u64::try_from(REGION / BLOCK).unwrap_or(1);
    let offsets: Vec<usize> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            usize::try_from(x % blocks).unwrap_or(0) * BLOCK
        })
        .collect();
    let mut out = vec![0u8; BLOCK + OVERHEAD];
    let mut keys = Keys::new(Suite::Aes128GcmSha256, Dir::Seal, &SECRET).expect("keys");
    let region_seal = best_ns(20_000, |i| {
        let at = offsets[i as usize % offsets.len()];
        let mut s = Sealer::begin(&mut keys, &mut out, BLOCK).expect("begin");
        s.from_region(&region, at, BLOCK).expect("region");
        std::hint::black_box(s.finish(content::APPLICATION_DATA).expect("finish"));
    });
    println!("  4 KiB out of a 256 MiB RAM region, random blocks: seal {region_seal} ns");
}
