//! The DH-HMAC-CHAP message decoder and the DHHC-1 secret parser: arbitrary
//! bytes in, no panic; whatever decodes re-encodes to something that decodes
//! to the same message.

#![no_main]

use libfuzzer_sys::fuzz_target;
use nvme::auth::{Message, Secret};

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Message::decode(data) {
        assert_eq!(Message::decode(&m.encode()).as_ref(), Ok(&m), "re-encoding changes {m:?}");
    }
    if let Ok(s) = std::str::from_utf8(data)
        && let Ok(k) = Secret::parse(s)
    {
        assert_eq!(Secret::parse(&k.to_string()).as_ref(), Ok(&k));
    }
});
