//! DH-HMAC-CHAP secrets in the `DHHC-1` representation (NVMe 2.x §8.13.5.8,
//! "Secret representation"), as `nvme gen-dhchap-key` prints them and Linux
//! parses them (`nvme_auth_parse_key` / `nvme_auth_extract_key`):
//!
//! ```text
//!   DHHC-1:<hh>:<base64(key || crc32(key) as little-endian u32)>:
//! ```
//!
//! `hh` is the hash the key is transformed with before use (00 = none, 01 =
//! SHA-256, 02 = SHA-384, 03 = SHA-512); the key is 32, 48 or 64 bytes; the CRC
//! is IEEE CRC-32 (zlib's `crc32`, Linux `~crc32(~0, ...)`). Any key length goes
//! with any hash: the spec does not tie them and Linux accepts every pairing
//! ("nvme-auth: allow mixing of secret and hash lengths"); only `nvme
//! gen-dhchap-key` insists on matching lengths when it makes one.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use super::{CryptoError, HashId, dhchap, fill_random};

/// A parsed DH-HMAC-CHAP secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    transform: Option<HashId>,
    key: Vec<u8>,
}

/// Why a `DHHC-1` string was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// Not `DHHC-1:<two digits>:<base64>:`.
    #[error("not a DHHC-1 secret (expected DHHC-1:<hh>:<base64>:)")]
    Format,
    /// The transform hash is not 00..03.
    #[error("unknown key transform hash {0:02} (00 none, 01 SHA-256, 02 SHA-384, 03 SHA-512)")]
    Hash(u8),
    /// The key is not valid base64.
    #[error("the key is not valid base64")]
    Base64,
    /// Decoded length is not 36, 52 or 68 (key + CRC).
    #[error("decoded key is {0} bytes; a 32, 48 or 64 byte key plus its 4-byte CRC is required")]
    Length(usize),
    /// The CRC-32 does not match the key.
    #[error("the key's CRC-32 does not match (mistyped secret?)")]
    Crc,
}

impl Secret {
    /// A secret from raw key bytes (32, 48 or 64 of them).
    pub fn new(transform: Option<HashId>, key: &[u8]) -> Result<Secret, SecretError> {
        if !matches!(key.len(), 32 | 48 | 64) {
            return Err(SecretError::Length(key.len() + 4));
        }
        Ok(Secret { transform, key: key.to_vec() })
    }

    /// A random secret of `len` bytes (32, 48 or 64), as `nvme gen-dhchap-key` makes.
    pub fn generate(transform: Option<HashId>, len: usize) -> Result<Secret, CryptoError> {
        if !matches!(len, 32 | 48 | 64) {
            return Err(CryptoError::Length);
        }
        let mut key = vec![0u8; len];
        fill_random(&mut key)?;
        Ok(Secret { transform, key })
    }

    /// Parses `DHHC-1:<hh>:<base64>:` (the trailing colon is optional, surrounding
    /// white space is ignored).
    pub fn parse(s: &str) -> Result<Secret, SecretError> {
        let s = s.trim();
        let rest = s.strip_prefix("DHHC-1:").ok_or(SecretError::Format)?;
        let b = rest.as_bytes();
        // Linux reads the key at a fixed offset of 10: the hash id is exactly two digits.
        if b.len() < 3 || !b[0].is_ascii_digit() || !b[1].is_ascii_digit() || b[2] != b':' {
            return Err(SecretError::Format);
        }
        let id = (b[0] - b'0') * 10 + (b[1] - b'0');
        let transform = match id {
            0 => None,
            _ => Some(HashId::from_id(id).ok_or(SecretError::Hash(id))?),
        };
        let body = &rest[3..];
        let body = body.strip_suffix(':').unwrap_or(body);
        if body.is_empty() || body.contains(':') || body.len() > 128 {
            return Err(SecretError::Format);
        }
        let raw = STANDARD.decode(body).map_err(|_| SecretError::Base64)?;
        if !matches!(raw.len(), 36 | 52 | 68) {
            return Err(SecretError::Length(raw.len()));
        }
        let (key, crc) = raw.split_at(raw.len() - 4);
        if crc32fast::hash(key) != u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]) {
            return Err(SecretError::Crc);
        }
        Ok(Secret { transform, key: key.to_vec() })
    }

    /// The hash the key is transformed with (`None`: used as is).
    pub fn transform(&self) -> Option<HashId> {
        self.transform
    }

    /// The key length in bytes.
    pub fn len(&self) -> usize {
        self.key.len()
    }

    /// Never true (a secret has 32 bytes or more); for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        self.key.is_empty()
    }

    /// The key to compute responses with for `nqn` (the host's NQN for the host
    /// key, the subsystem's for the controller key): NVMe 2.x §8.13.5.7,
    /// `HMAC(key, NQN || "NVMe-over-Fabrics")` with the transform hash, or the key
    /// itself for transform 00 (Linux `nvme_auth_transform_key`).
    pub fn transformed(&self, nqn: &str) -> Vec<u8> {
        match self.transform {
            None => self.key.clone(),
            Some(h) => dhchap::hmac(h, &self.key, &[nqn.as_bytes(), b"NVMe-over-Fabrics"]),
        }
    }
}

impl std::fmt::Display for Secret {
    /// The `DHHC-1:<hh>:<base64>:` form.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut raw = self.key.clone();
        raw.extend_from_slice(&crc32fast::hash(&self.key).to_le_bytes());
        write!(f, "DHHC-1:{:02}:{}:", self.transform.map_or(0, HashId::id), STANDARD.encode(raw))
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Secrets stay out of logs.
        f.debug_struct("Secret").field("transform", &self.transform).field("len", &self.key.len()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The example secret of the NVMe specification (quoted in the Linux patch
    // "nvme-auth: allow mixing of secret and hash lengths"), valid with every hash id.
    const SPEC_EXAMPLE: &str = "ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n";

    #[test]
    fn spec_example_parses_with_every_hash() {
        for id in 0..=3u8 {
            let s = Secret::parse(&format!("DHHC-1:{id:02}:{SPEC_EXAMPLE}:")).unwrap();
            assert_eq!(s.len(), 32);
            assert_eq!(s.transform().map_or(0, HashId::id), id);
            assert_eq!(s.to_string(), format!("DHHC-1:{id:02}:{SPEC_EXAMPLE}:"));
        }
    }

    #[test]
    fn generated_by_nvme_cli_parse() {
        // `nvme gen-dhchap-key -m 1` output quoted in a public test script (Dell PowerStore
        // notes), and -m 2 / -m 3 output of nvme-cli 2.3 in the vmlab guest (tests/vm-auth).
        for (s, id, len) in [
            ("DHHC-1:01:C7XNT6VDFTFfbGtrSimOlLFg7BAdH+UwUgkLTuSA5gcd+7/H:", 1, 32),
            ("DHHC-1:01:97vgjyw8YRnwFPn0LYjeGW5/ClRhS5YuVnwTNIwUNHUWmp6v:", 1, 32),
            ("DHHC-1:02:XqSOg6pikAALbqrPrXykml8Om0mJeA4JPI0E0SW7kRi5lARYF9nHcnPgprQ9XUTo5XbVXQ==:", 2, 48),
            (
                "DHHC-1:03:vey5bH9du4pFEVcBb299RRaTT80xavOKMvbVyR1n/DQvg43bChuVK1bpnIPreyvma10imOPnfSLkVTlyddwHl9OFZnc=:",
                3,
                64,
            ),
        ] {
            let k = Secret::parse(s).unwrap();
            assert_eq!(k.transform().map(HashId::id), Some(id));
            assert_eq!(k.len(), len);
            assert_eq!(k.to_string(), s);
        }
    }

    #[test]
    fn bad_secrets_are_refused() {
        let ok = format!("DHHC-1:01:{SPEC_EXAMPLE}:");
        assert!(Secret::parse(&ok).is_ok());
        assert!(Secret::parse(&format!("DHHC-1:01:{SPEC_EXAMPLE}")).is_ok(), "trailing colon is optional");
        assert_eq!(Secret::parse(&format!("DHHC-2:01:{SPEC_EXAMPLE}:")), Err(SecretError::Format));
        assert_eq!(Secret::parse(&format!("DHHC-1:1:{SPEC_EXAMPLE}:")), Err(SecretError::Format));
        assert_eq!(Secret::parse(&format!("DHHC-1:04:{SPEC_EXAMPLE}:")), Err(SecretError::Hash(4)));
        assert_eq!(Secret::parse("DHHC-1:01:!!!!:"), Err(SecretError::Base64));
        assert_eq!(Secret::parse("DHHC-1:01:AAAA:"), Err(SecretError::Length(3)));
        // One flipped character: the CRC catches it.
        let bad = format!("DHHC-1:01:{}:", SPEC_EXAMPLE.replacen('i', "j", 1));
        assert_eq!(Secret::parse(&bad), Err(SecretError::Crc));
        assert_eq!(Secret::parse(""), Err(SecretError::Format));
        assert!(!format!("{:?}", Secret::parse(&ok).unwrap()).contains(SPEC_EXAMPLE));
    }

    #[test]
    fn generate_round_trips() {
        for (h, len) in [(None, 32), (Some(HashId::Sha256), 32), (Some(HashId::Sha384), 48), (Some(HashId::Sha512), 64)]
        {
            let s = Secret::generate(h, len).unwrap();
            assert_eq!(Secret::parse(&s.to_string()).unwrap(), s);
        }
    }
}
