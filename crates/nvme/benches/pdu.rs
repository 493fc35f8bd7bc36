//! PDU encode and decode cost, measured: what each 4k read costs the two sides in codec
//! work alone (no socket). A 4k read is one CapsuleCmd (host encodes, target decodes),
//! one C2HData header with SUCCESS (target encodes, host decodes), plus the data digest
//! over the 4 KiB when it is on; a write adds R2T/H2CData when its data does not fit in
//! the capsule.
//!
//! - `encode/*`: append the header to a `Vec` that already has capacity (as the
//!   connections do: one send buffer reused), header digest off and on.
//! - `decode/*`: validate a complete header with an established decoder.
//! - `crc32c/*`: the data digest over a 4 KiB and a 128 KiB payload (the `crc32c` crate,
//!   SSE4.2 on this machine).
//!
//! Run: `CARGO_TARGET_DIR=/tmp/target-nvme cargo bench -p nvme --bench pdu`

#![allow(missing_docs, reason = "criterion's macros generate undocumented items")]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use nvme::opcode::io;
use nvme::tcp::{DataHeader, Decoded, Decoder, DecoderConfig, Digests, EncoderConfig, R2t, Role, crc32c};
use nvme::{Cid, Cqe, Nsid, SglDescriptor, Sqe};

fn read_sqe() -> Sqe {
    Sqe::rw(io::READ, Cid(7), Nsid(1), 4096, 7, SglDescriptor::transport(4096))
}

fn c2h(datal: u32) -> DataHeader {
    DataHeader { cccid: Cid(7), ttag: 0, datao: 0, datal, last: true, success: true }
}

fn encoder(header_digest: bool) -> EncoderConfig {
    EncoderConfig { digests: Digests { header: header_digest, data: false }, data_align: 4 }
}

fn decoder(receiver: Role, header_digest: bool) -> Decoder {
    Decoder::new(DecoderConfig {
        receiver,
        digests: Digests { header: header_digest, data: false },
        established: true,
        data_align: 4,
        max_in_capsule: 8192,
        max_data_pdu: 1 << 20,
    })
}

fn encode(c: &mut Criterion) {
    let mut g = c.benchmark_group("encode");
    g.throughput(Throughput::Elements(1));
    let sqe = read_sqe();
    let cqe = Cqe::success(Cid(7));
    for hdgst in [false, true] {
        let tag = if hdgst { "_hdgst" } else { "" };
        let enc = encoder(hdgst);
        let mut out = Vec::with_capacity(256);
        g.bench_function(format!("capsule_cmd{tag}"), |b| {
            b.iter(|| {
                out.clear();
                black_box(enc.capsule_cmd(&mut out, black_box(&sqe), 0));
            });
        });
        g.bench_function(format!("capsule_resp{tag}"), |b| {
            b.iter(|| {
                out.clear();
                black_box(enc.capsule_resp(&mut out, black_box(&cqe)));
            });
        });
        let d = c2h(4096);
        g.bench_function(format!("c2h_data_4k{tag}"), |b| {
            b.iter(|| {
                out.clear();
                black_box(enc.c2h_data(&mut out, black_box(&d)));
            });
        });
        let r = R2t { cccid: Cid(7), ttag: 3, r2to: 0, r2tl: 131_072 };
        g.bench_function(format!("r2t{tag}"), |b| {
            b.iter(|| {
                out.clear();
                black_box(enc.r2t(&mut out, black_box(&r)));
            });
        });
    }
    g.finish();
}

fn decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("decode");
    g.throughput(Throughput::Elements(1));
    for hdgst in [false, true] {
        let tag = if hdgst { "_hdgst" } else { "" };
        let enc = encoder(hdgst);
        let mut cmd = Vec::new();
        enc.capsule_cmd(&mut cmd, &read_sqe(), 0);
        let mut resp = Vec::new();
        enc.capsule_resp(&mut resp, &Cqe::success(Cid(7)));
        let mut data = Vec::new();
        enc.c2h_data(&mut data, &c2h(4096));
        let target = decoder(Role::Controller, hdgst);
        let host = decoder(Role::Host, hdgst);
        for (name, dec, bytes) in
            [("capsule_cmd", target, &cmd), ("capsule_resp", host, &resp), ("c2h_data_4k", host, &data)]
        {
            assert!(matches!(dec.decode_header(bytes), Ok(Decoded::Pdu(_))), "{name}{tag} decodes");
            g.bench_function(format!("{name}{tag}"), |b| b.iter(|| black_box(dec.decode_header(black_box(bytes)))));
        }
    }
    g.finish();
}

fn digest(c: &mut Criterion) {
    let mut g = c.benchmark_group("crc32c");
    for len in [4096usize, 131_072] {
        let buf: Vec<u8> = (0..len).map(|i| u8::try_from(i * 31 % 251).unwrap_or(0)).collect();
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_function(format!("{}k", len / 1024), |b| b.iter(|| black_box(crc32c(black_box(&buf)))));
    }
    g.finish();
}

criterion_group!(benches, encode, decode, digest);
criterion_main!(benches);
