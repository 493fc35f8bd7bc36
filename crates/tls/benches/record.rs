//! What the record layer costs per record on this CPU: sealing and opening one TLS 1.3
//! record (AES-128-GCM through OpenSSL) of the sizes NVMe/TCP sends: a 72-byte command
//! capsule, a 4 KiB read's C2HData PDU and a full 16 KiB record (a 128 KiB read is eight).
//!
//! ```sh
//! cargo bench -p qpath-tls --bench record
//! ```

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tls::record::{Dir, HEADER_LEN, Keys, Sealer, Suite, content, open};

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

criterion_group!(benches, seal_open);
criterion_main!(benches);
