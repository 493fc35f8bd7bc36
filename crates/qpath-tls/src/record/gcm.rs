//! [`Gcm`]: one direction's AES-GCM key, sealing and opening whole records in place.
//!
//! The cipher is `ring`'s AES-GCM, which on x86-64 picks its code by the CPU's features at
//! run time (VAES with 256-bit vectors and carry-less multiply where the CPU has them,
//! AES-NI otherwise). On a CPU with VAES it seals a 4 KiB record in about half the time of
//! the system's OpenSSL 3.0 EVP AES-GCM, which has no VAES code (`cargo bench -p qpath-tls
//! --bench record`; numbers in BENCHMARKS.md). Its interface takes a record's whole
//! content at once, in place: the caller gathers the content where the ciphertext goes
//! (a copy the cache makes cheap next to the cipher), then one call encrypts and tags it.

use ring::aead::{AES_128_GCM, AES_256_GCM, Aad, LessSafeKey, Nonce, Tag, UnboundKey};

use super::{HEADER_LEN, Suite, TAG_LEN};

/// Length of a GCM nonce (RFC 8446 §5.3: `iv_length` is 12 for both suites).
pub(crate) const NONCE_LEN: usize = 12;

/// An AES-GCM key of one suite.
pub(crate) struct Gcm {
    key: LessSafeKey,
}

/// The key's length does not fit the suite (never, for keys this crate derives).
#[derive(Debug)]
pub(crate) struct BadKey;

/// More bytes than AES-GCM seals under one nonce (about 64 GiB; never, for records of at
/// most 2^14 bytes).
#[derive(Debug)]
pub(crate) struct TooLong;

/// A record failed its authentication.
#[derive(Debug)]
pub(crate) struct BadTag;

impl Gcm {
    /// The key of `suite` (16 bytes for AES-128-GCM, 32 for AES-256-GCM).
    pub(crate) fn new(suite: Suite, key: &[u8]) -> Result<Gcm, BadKey> {
        let alg = match suite {
            Suite::Aes128GcmSha256 => &AES_128_GCM,
            Suite::Aes256GcmSha384 => &AES_256_GCM,
        };
        let key = UnboundKey::new(alg, key).map_err(|_| BadKey)?;
        Ok(Gcm { key: LessSafeKey::new(key) })
    }

    /// Encrypts `in_out` in place under `nonce` with the record header as additional
    /// data, and returns the tag.
    pub(crate) fn seal(
        &self,
        nonce: [u8; NONCE_LEN],
        header: &[u8; HEADER_LEN],
        in_out: &mut [u8],
    ) -> Result<[u8; TAG_LEN], TooLong> {
        let tag = self
            .key
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(header), in_out)
            .map_err(|_| TooLong)?;
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(tag.as_ref());
        Ok(t)
    }

    /// Decrypts `in_out` in place and checks `tag`; on a mismatch nothing in `in_out` is
    /// plaintext anyone may use.
    pub(crate) fn open(
        &self,
        nonce: [u8; NONCE_LEN],
        header: &[u8; HEADER_LEN],
        tag: [u8; TAG_LEN],
        in_out: &mut [u8],
    ) -> Result<(), BadTag> {
        self.key
            .open_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(header),
                Tag::from(tag),
                in_out,
                0..,
            )
            .map(|_| ())
            .map_err(|_| BadTag)
    }
}
