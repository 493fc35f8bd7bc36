//! What the record layer costs per record on this CPU: sealing and opening one TLS 1.3
//! record (AES-128-GCM) of the sizes NVMe/TCP sends: a 72-byte command
//! capsule, a 4 KiB read's C2HData PDU and a full 16 KiB record (a 128 KiB read is eight);
//! and a 4 KiB read's data sealed out of a RAM namespace (random 4 KiB blocks of a 256 MiB
//! shared region, mostly not in the CPU's caches), gathered from the region into the record
//! against copied out of it into a buffer first (one more pass over the bytes).
//!
//! ```sh
//! cargo bench -p qpath-tls --bench record
//! ```

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tls::record::{Dir, HEADER_LEN, Keys, OVERHEAD, Sealer, Suite, content, open};
use uring::{RegionOptions, SharedRegion};

const SECRET: [u8; 32] = [7; 32];

fn seal_open(c: &mut Criterion) {
    let mut g = c.benchmark_group("record");
    for len in [72usize, 4096 + 24, 16384 - 1] {
        let plain = vec![0x5au8; len];
        g.throughput(Throughput::Bytes(len as u64));
        let mut out = vec![0u8; HEADER_LEN + len + 1 + 16];
        let mut seal = Keys::new(Suite::Aes128GcmSha256, Dir::Seal, &SECRET).unwrap();
        g.bench_function(BenchmarkId::new("seal", len), |b| {
            b.iter(|| {
                let mut s = Sealer::begin(&mut seal, &mut out, len).unwrap();
                s.copy(&plain).unwrap();
                s.finish(content::APPLICATION_DATA).unwrap()
            });
        });
        // Records sealed in sequence, opened in the same sequence.
        let mut seal = Keys::new(Suite::Aes128GcmSha256, Dir::Seal, &SECRET).unwrap();
        let mut opener = Keys::new(Suite::Aes128GcmSha256, Dir::Open, &SECRET).unwrap();
        let mut dst = vec![0u8; len + 1];
        let mut rec = out.clone();
        g.bench_function(BenchmarkId::new("open", len), |b| {
            b.iter(|| {
                let mut s = Sealer::begin(&mut seal, &mut rec, len).unwrap();
                s.copy(&plain).unwrap();
                s.finish(content::APPLICATION_DATA).unwrap();
                open(&mut opener, &mut rec, Some(&mut dst)).unwrap()
            });
        });
    }
    g.finish();
}

fn seal_from_region(c: &mut Criterion) {
    const REGION: usize = 256 << 20;
    const BLOCK: usize = 4096;
    let region = SharedRegion::with_options(REGION, RegionOptions { populate: true, huge_pages: false }).unwrap();
    // A fixed pseudo-random walk over the region's blocks (xorshift).
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let offsets: Vec<usize> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            usize::try_from(x % (REGION / BLOCK) as u64).unwrap() * BLOCK
        })
        .collect();
    let mut g = c.benchmark_group("record_region");
    g.throughput(Throughput::Bytes(BLOCK as u64));
    let mut out = vec![0u8; BLOCK + OVERHEAD];
    let mut keys = Keys::new(Suite::Aes128GcmSha256, Dir::Seal, &SECRET).unwrap();
    let mut i = 0;
    g.bench_function("seal_4k_from_region", |b| {
        b.iter(|| {
            i = (i + 1) % offsets.len();
            let mut s = Sealer::begin(&mut keys, &mut out, BLOCK).unwrap();
            s.from_region(&region, offsets[i], BLOCK).unwrap();
            s.finish(content::APPLICATION_DATA).unwrap()
        });
    });
    let mut copy = vec![0u8; BLOCK];
    g.bench_function("seal_4k_copied_out_of_region", |b| {
        b.iter(|| {
            i = (i + 1) % offsets.len();
            region.copy_from_region(offsets[i], &mut copy).unwrap();
            let mut s = Sealer::begin(&mut keys, &mut out, BLOCK).unwrap();
            s.copy(&copy).unwrap();
            s.finish(content::APPLICATION_DATA).unwrap()
        });
    });
    g.finish();
}

criterion_group!(benches, seal_open, seal_from_region);
criterion_main!(benches);
