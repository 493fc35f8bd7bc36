//! The NBD server's protocol ends on arbitrary client bytes: the negotiation
//! (`blockdev::nbd::handshake`) and, once a client reaches transmission, the request framer
//! and checks (`blockdev::nbd::request`). Neither may panic; every byte is consumed or left
//! for the next phase; nothing grows without bound; every checked request stays inside the
//! export and its limits.

#![no_main]

use qpath_blockdev::nbd::handshake::{Export, Handshake, OPTION_DATA_MAX, Outcome};
use qpath_blockdev::nbd::request::{Command, Frame, Framer, Limits, PAYLOAD_HARD_MAX, check};
use qpath_blockdev::nbd::wire::flags;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, bytes)) = data.split_first() else { return };
    let export = Export {
        name: "qpath".into(),
        description: "fuzz".into(),
        size: 1 << 30,
        flags: flags::HAS_FLAGS
            | flags::SEND_FLUSH
            | flags::SEND_FUA
            | flags::SEND_DF
            | if sel & 1 != 0 { flags::SEND_TRIM } else { 0 }
            | if sel & 2 != 0 { flags::SEND_WRITE_ZEROES } else { 0 }
            | if sel & 4 != 0 { flags::READ_ONLY } else { 0 },
        block_min: 512 << (sel >> 6),
        block_preferred: 4096,
        payload_max: PAYLOAD_HARD_MAX,
    };
    let mut hs = Handshake::new(export.clone());
    // Feed in pieces whose sizes come from the input, as a socket would deliver them.
    let piece = 1 + usize::from(sel >> 3 & 7) * 37;
    let mut rest = bytes;
    let mut out_total = 0usize;
    while !rest.is_empty() && matches!(hs.outcome(), Outcome::Negotiating) {
        let n = piece.min(rest.len());
        let used = hs.feed(&rest[..n]);
        assert!(used <= n, "the handshake consumed more than it was given");
        out_total += hs.output().len();
        hs.output().clear();
        assert!(out_total <= 18 + 64 * (OPTION_DATA_MAX + 64) * 6, "replies stay bounded");
        rest = &rest[used..];
        if used < n {
            assert!(!matches!(hs.outcome(), Outcome::Negotiating), "bytes left only after the negotiation ended");
            break;
        }
    }
    let Outcome::Transmission(neg) = hs.outcome().clone() else { return };
    let lim = Limits {
        size: export.size,
        block_min: export.block_min,
        payload_max: export.payload_max,
        flags: export.flags,
        structured: neg.structured,
    };
    let mut framer = Framer::new();
    let mut payload_expected = 0u64;
    let mut payload_seen = 0u64;
    for _ in 0..10_000 {
        if rest.is_empty() {
            break;
        }
        match framer.next(rest) {
            Ok((n, frame)) => {
                assert!(n <= rest.len());
                match frame {
                    Frame::NeedMore => assert_eq!(n, rest.len()),
                    Frame::Header(r) => {
                        assert_eq!(payload_seen, payload_expected, "a header only after the previous payload");
                        payload_expected += u64::from(r.payload_len());
                        assert!(r.payload_len() <= PAYLOAD_HARD_MAX);
                        if let Ok(c) = check(&r, &lim) {
                            let bs = u64::from(lim.block_min);
                            match c {
                                Command::Read | Command::Write { .. } | Command::Trim { .. } | Command::WriteZeroes { .. } => {
                                    assert!(r.offset + u64::from(r.length) <= lim.size);
                                    assert!(r.offset % bs == 0 && u64::from(r.length) % bs == 0 && r.length > 0);
                                    if matches!(c, Command::Read | Command::Write { .. }) {
                                        assert!(r.length <= lim.payload_max);
                                    }
                                    if !matches!(c, Command::Read) {
                                        assert!(lim.flags & flags::READ_ONLY == 0);
                                    }
                                }
                                Command::Flush | Command::Disconnect | Command::Nothing => {}
                            }
                        }
                    }
                    Frame::Payload(p) => {
                        assert!(!p.is_empty() && p.len() == n);
                        payload_seen += p.len() as u64;
                        assert!(payload_seen <= payload_expected);
                    }
                }
                rest = &rest[n..];
            }
            Err(_) => return,
        }
    }
});
