//! The NVMe/TCP PDU decoder on arbitrary bytes, for both receivers, with and
//! without digests: it must never panic, and whatever it accepts must be
//! self-consistent (the layout fits inside PLEN).

#![no_main]

use libfuzzer_sys::fuzz_target;
use nvme::tcp::{Decoded, Decoder, DecoderConfig, Digests, Role};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, bytes)) = data.split_first() else { return };
    let receiver = if sel & 1 == 0 { Role::Controller } else { Role::Host };
    let cfg = DecoderConfig {
        receiver,
        digests: Digests { header: sel & 2 != 0, data: sel & 4 != 0 },
        established: sel & 8 != 0,
        data_align: 4 << ((sel >> 4) & 3),
        max_in_capsule: 8192,
        max_data_pdu: 1 << 20,
    };
    let dec = Decoder::new(cfg);
    let mut rest = bytes;
    // Walk the stream PDU by PDU, as a connection would (bounded by the input).
    for _ in 0..64 {
        match dec.decode_header(rest) {
            Ok(Decoded::NeedMore(n)) => {
                assert!(n > rest.len() || n <= 255 + 8, "NeedMore asks for a sane amount");
                return;
            }
            Ok(Decoded::Pdu(info)) => {
                let l = info.layout;
                assert!(l.data_offset <= l.plen || l.data_len == 0);
                assert!(l.data_offset + l.data_len <= l.plen.max(l.data_offset));
                if l.plen > rest.len() || l.plen == 0 {
                    return;
                }
                rest = &rest[l.plen..];
            }
            Err(_) => return,
        }
    }
});
