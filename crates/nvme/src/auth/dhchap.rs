//! The DH-HMAC-CHAP computations (NVMe 2.x §8.3.4.5.5, §8.13.5), byte for byte
//! as Linux computes them (`drivers/nvme/host/auth.c`
//! `nvme_auth_dhchap_setup_{host,ctrl}_response`, `drivers/nvme/target/auth.c`
//! `nvmet_auth_{host,ctrl}_hash`, `drivers/nvme/common/auth.c`):
//!
//! ```text
//!   Ca   = C1, or HMAC(H(Ks), C1) with a DH group (augmented challenge)
//!   R1   = HMAC(Kh', Ca || le32 S1 || le16 T || SC_C || "HostHost"   || NQNh || 0x00 || NQNc)
//!   R2   = HMAC(Kc', Ca || le32 S2 || le16 T || 0x00 || "Controller" || NQNc || 0x00 || NQNh)
//!   Kh'  = HMAC(Kh, NQNh || "NVMe-over-Fabrics")  (the transformed host key, see [`super::Secret`])
//!   Kc'  = HMAC(Kc, NQNc || "NVMe-over-Fabrics")
//! ```
//!
//! H and HMAC use the hash the transaction negotiated; the key transform uses
//! the hash named in the secret. Comparisons are constant-time.

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256, Sha384, Sha512};
use subtle::ConstantTimeEq;

use super::HashId;

macro_rules! hmac_with {
    ($d:ty, $key:expr, $parts:expr) => {{
        let mut m = <Hmac<$d> as KeyInit>::new_from_slice($key)
            .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
        for p in $parts {
            m.update(p);
        }
        m.finalize().into_bytes().to_vec()
    }};
}

/// HMAC over the concatenation of `parts`.
pub fn hmac(hash: HashId, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    match hash {
        HashId::Sha256 => hmac_with!(Sha256, key, parts),
        HashId::Sha384 => hmac_with!(Sha384, key, parts),
        HashId::Sha512 => hmac_with!(Sha512, key, parts),
    }
}

/// The plain hash H.
pub fn digest(hash: HashId, data: &[u8]) -> Vec<u8> {
    match hash {
        HashId::Sha256 => Sha256::digest(data).to_vec(),
        HashId::Sha384 => Sha384::digest(data).to_vec(),
        HashId::Sha512 => Sha512::digest(data).to_vec(),
    }
}

/// The challenge a response is computed over: C itself without a DH group,
/// else the augmented challenge `HMAC(H(Ks), C)` (Linux `nvme_auth_augmented_challenge`).
pub fn challenge(hash: HashId, session_key: Option<&[u8]>, c: &[u8]) -> Vec<u8> {
    match session_key {
        None => c.to_vec(),
        Some(ks) => hmac(hash, &digest(hash, ks), &[c]),
    }
}

/// Which side a response authenticates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The host's response R1 (to the controller's challenge C1).
    Host,
    /// The controller's response R2 (to the host's challenge C2).
    Controller,
}

/// The inputs of one response.
#[derive(Clone, Copy, Debug)]
pub struct ResponseInput<'a> {
    /// The negotiated hash.
    pub hash: HashId,
    /// The transformed key of the side that answers (Kh' or Kc').
    pub key: &'a [u8],
    /// The (augmented) challenge, from [`challenge`].
    pub challenge: &'a [u8],
    /// S1 (host response) or S2 (controller response).
    pub seqnum: u32,
    /// Transaction id.
    pub tid: u16,
    /// Host NQN.
    pub hostnqn: &'a str,
    /// Subsystem NQN.
    pub subnqn: &'a str,
}

/// R1 or R2 of a transaction without secure channel concatenation (SC_C 00h).
pub fn response(role: Role, i: &ResponseInput<'_>) -> Vec<u8> {
    response_sc(role, i, super::sc_c::NOSC)
}

/// R1 or R2 with the transaction's SC_C: the host's response R1 covers the SC_C the host
/// negotiated, so the request for a new TLS PSK cannot be stripped on the way (NVMe Base
/// 2.1 §8.3.4.5.5; Linux `nvmet_auth_host_hash` and the host's
/// `nvme_auth_dhchap_setup_host_response` put `sc_c` there). The controller's R2 keeps 00h
/// (Linux `nvmet_auth_ctrl_hash`).
pub fn response_sc(role: Role, i: &ResponseInput<'_>, sc_c: u8) -> Vec<u8> {
    let sc_c = match role {
        Role::Host => sc_c,
        Role::Controller => super::sc_c::NOSC,
    };
    let seq = i.seqnum.to_le_bytes();
    let tid = i.tid.to_le_bytes();
    let (label, first, second): (&[u8], &str, &str) = match role {
        Role::Host => (b"HostHost", i.hostnqn, i.subnqn),
        Role::Controller => (b"Controller", i.subnqn, i.hostnqn),
    };
    hmac(i.hash, i.key, &[i.challenge, &seq, &tid, &[sc_c], label, first.as_bytes(), &[0], second.as_bytes()])
}

/// Constant-time equality of two responses.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

/// The generated PSK of secure channel concatenation, `HMAC(Ks, C1 || C2)` (NVMe 2.x
/// §8.13.5.9; Linux `nvme_auth_generate_psk`): the TLS channel that follows the
/// transaction is keyed from it.
pub fn generated_psk(hash: HashId, session_key: &[u8], c1: &[u8], c2: &[u8]) -> Vec<u8> {
    hmac(hash, session_key, &[c1, c2])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Linux `drivers/nvme/common/tests/auth_kunit.c` (`test_nvme_auth_derive_tls_psk_*`):
    /// skey[i] = 'A' + i, c1[i] = i, c2[i] = 0xff - i, each hash-length long.
    #[test]
    fn linux_kunit_generated_psk_vectors() {
        let vec = |h: HashId| {
            let n = h.len();
            let n = u8::try_from(n).unwrap();
            let ks: Vec<u8> = (0..n).map(|i| b'A' + i).collect();
            let c1: Vec<u8> = (0..n).collect();
            let c2: Vec<u8> = (0..n).map(|i| 0xff - i).collect();
            generated_psk(h, &ks, &c1, &c2)
        };
        assert_eq!(
            vec(HashId::Sha256),
            [
                0x17, 0x33, 0xc5, 0x9f, 0xa7, 0xf4, 0x8f, 0xcf, 0x37, 0xf5, 0xf2, 0x6f, 0xc4, 0xff, 0x02, 0x68, 0xad,
                0x4f, 0x78, 0xe0, 0x30, 0xf4, 0xf3, 0xb0, 0xbf, 0xd1, 0xd4, 0x7e, 0x7b, 0xb1, 0x44, 0x7a,
            ]
        );
        assert_eq!(
            vec(HashId::Sha384),
            [
                0xf1, 0x4b, 0x2d, 0xd3, 0x23, 0x4c, 0x45, 0x96, 0x94, 0xd3, 0xbc, 0x63, 0xf8, 0x96, 0x8b, 0xd6, 0xb3,
                0x7c, 0x2c, 0x6d, 0xe8, 0x49, 0xe2, 0x2e, 0x11, 0x87, 0x49, 0x00, 0x1c, 0xe4, 0xbb, 0xe8, 0x64, 0x0b,
                0x9e, 0x3a, 0x74, 0x8c, 0xb1, 0x1c, 0xe4, 0xb1, 0xd7, 0x1d, 0x35, 0x9c, 0xce, 0x39,
            ]
        );
        assert_eq!(
            vec(HashId::Sha512),
            [
                0x9c, 0x9f, 0x08, 0x9a, 0x61, 0x8b, 0x47, 0xd2, 0xd7, 0x5f, 0x4b, 0x6c, 0x28, 0x07, 0x04, 0x24, 0x48,
                0x7b, 0x44, 0x5d, 0xd9, 0x6e, 0x70, 0xc4, 0xc0, 0x9b, 0x55, 0xe8, 0xb6, 0x00, 0x01, 0x52, 0xa3, 0x36,
                0x3c, 0x34, 0x54, 0x04, 0x3f, 0x38, 0xf0, 0xb8, 0x50, 0x36, 0xde, 0xd4, 0x06, 0x55, 0x35, 0x0a, 0xa8,
                0x7b, 0x8b, 0x6a, 0x28, 0x2b, 0x5c, 0x1a, 0xca, 0xe1, 0x62, 0x33, 0xdd, 0x5b,
            ]
        );
    }

    #[test]
    fn response_layout() {
        // The message layout, spelled out byte by byte, against `response`.
        let key = [7u8; 32];
        let c = [9u8; 32];
        let i = ResponseInput {
            hash: HashId::Sha256,
            key: &key,
            challenge: &c,
            seqnum: 0x0102_0304,
            tid: 0x0506,
            hostnqn: "nqn.h",
            subnqn: "nqn.s",
        };
        let mut m = c.to_vec();
        m.extend_from_slice(&[4, 3, 2, 1, 6, 5, 0]);
        m.extend_from_slice(b"HostHostnqn.h\0nqn.s");
        assert_eq!(response(Role::Host, &i), hmac(HashId::Sha256, &key, &[&m]));
        let mut m = c.to_vec();
        m.extend_from_slice(&[4, 3, 2, 1, 6, 5, 0]);
        m.extend_from_slice(b"Controllernqn.s\0nqn.h");
        assert_eq!(response(Role::Controller, &i), hmac(HashId::Sha256, &key, &[&m]));
        assert!(ct_eq(&[1, 2], &[1, 2]) && !ct_eq(&[1, 2], &[1, 3]) && !ct_eq(&[1], &[1, 2]));
    }

    /// R1 of a concatenating transaction (SC_C 02h, NEWTLSPSK) against a value computed
    /// apart from this code, with Python's `hmac` over the bytes the spec lists:
    /// `hmac.new(b"\x07"*32, b"\x09"*32 + bytes([4,3,2,1,6,5,2]) + b"HostHostnqn.h\0nqn.s", sha256)`.
    #[test]
    fn host_response_covers_sc_c() {
        let key = [7u8; 32];
        let c = [9u8; 32];
        let i = ResponseInput {
            hash: HashId::Sha256,
            key: &key,
            challenge: &c,
            seqnum: 0x0102_0304,
            tid: 0x0506,
            hostnqn: "nqn.h",
            subnqn: "nqn.s",
        };
        let r1 = response_sc(Role::Host, &i, super::super::sc_c::NEWTLSPSK);
        let hex: String = r1.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "0378e58a80eeb6ffefabf019a9255829f8db6923b8a5e430a950486043519ad2");
        assert_ne!(r1, response(Role::Host, &i), "SC_C changes R1");
        // The controller's response does not take SC_C.
        assert_eq!(response_sc(Role::Controller, &i, 3), response(Role::Controller, &i));
    }

    #[test]
    fn rfc4231_hmac_sha256_case2() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        let out = hmac(HashId::Sha256, b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        assert_eq!(out[..8], [0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e]);
    }
}
