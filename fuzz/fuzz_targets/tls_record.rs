//! The TLS record layer of the secure channel on arbitrary input: raw bytes, or records
//! sealed with the right keys (application data, alerts, handshake messages, padding-only,
//! any content type) that are then cut at any point, tampered with, and read into
//! destinations of any size. It must never panic, never hand out a byte of a record that
//! failed its check, and give exactly the content of the records that are intact.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tls::psk::Identity;
use tls::record::{self, Dir, Keys, Suite};

fn keys(dir: Dir) -> Keys {
    Keys::new(Suite::Aes128GcmSha256, dir, &[0x5a; 32]).expect("keys")
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let id = Identity::parse(b"NVMe0R01 nqn.h nqn.s").expect("identity");
    let mut ch = tls::Channel::from_keys(keys(Dir::Seal), keys(Dir::Open), id);
    let mut wire = Vec::new();
    let mut expect = Vec::new();
    let mut clean = true;
    if mode & 1 == 0 {
        wire.extend_from_slice(rest);
        clean = false;
    } else {
        // Records: [type, len, flags] + len bytes of content, sealed with the peer's keys.
        let mut peer = keys(Dir::Seal);
        let mut r = rest;
        while r.len() >= 3 {
            let (ty, len, flags) = (r[0], usize::from(r[1]), r[2]);
            let content = &r[3..(3 + len).min(r.len())];
            r = &r[(3 + len).min(r.len())..];
            let start = wire.len();
            if record::seal_bytes(&mut peer, ty, content, &mut wire).is_err() {
                return;
            }
            if flags & 0x80 != 0 && wire.len() > start {
                let at = start + usize::from(flags & 0x3f) % (wire.len() - start);
                wire[at] ^= 1 << (flags & 7);
                clean = false;
            }
            if ty == record::content::APPLICATION_DATA && clean {
                expect.extend_from_slice(content);
            } else if ty != record::content::APPLICATION_DATA {
                clean = false;
            }
        }
    }
    // Feed in pieces, read into small and large destinations.
    let step = 1 + usize::from(mode >> 1) * 97;
    let mut got = Vec::new();
    let mut dst = vec![0u8; 1 + usize::from(mode >> 4) * 1500];
    let mut off = 0;
    for _ in 0..10_000 {
        if off < wire.len() {
            off += tls::channel::feed(&mut ch, &wire[off..(off + step).min(wire.len())]);
        }
        let n = ch.read(&mut dst);
        got.extend_from_slice(&dst[..n]);
        if ch.error().is_some() || (off >= wire.len() && n == 0) {
            break;
        }
    }
    assert!(got.len() <= wire.len(), "no more plaintext than ciphertext");
    if clean {
        assert_eq!(got, expect, "intact application records read back exactly");
        assert!(ch.error().is_none(), "{:?}", ch.error());
    }
});
