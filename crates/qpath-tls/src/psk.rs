//! Pre-shared keys for the NVMe/TCP secure channel (NVMe/TCP 1.1 §3.6.1, TP 8011, TP 8018),
//! byte for byte as libnvme (`nvme gen-tls-key`, `nvme_generate_tls_key_identity`) and
//! Linux (`drivers/nvme/common/auth.c`, `keyring.c`) compute them:
//!
//! ```text
//!   configured PSK   NVMeTLSkey-1:<hh>:<base64(key || le32 crc32(key))>:     hh: 00 none, 01 SHA-256, 02 SHA-384
//!   retained PSK     HKDF-Expand-Label(HKDF-Extract(0, configured), "HostNQN", NQNh, len)    (hh 00: the configured key)
//!   PSK digest       base64(HMAC(retained, NQNh || " " || NQNs || " NVMe-over-Fabrics"))
//!   identity v0      NVMe0R<hh> <NQNh> <NQNs>                       (Linux 6.7 .. 6.13 hosts)
//!   identity v1      NVMe1R<hh> <NQNh> <NQNs> <PSK digest>         (Linux 6.14+, nvme-cli --identity=1)
//!   TLS PSK          HKDF-Expand-Label(HKDF-Extract(0, retained), "nvme-tls-psk", context, len)
//!                    context v0: the identity; v1: "<hh> <PSK digest>"
//! ```
//!
//! `<hh>` of an identity names the hash of its cipher suite: 01 TLS_AES_128_GCM_SHA256,
//! 02 TLS_AES_256_GCM_SHA384 (the configured key's own hash, or by its length when 00).
//! Older libnvme releases (and `nvme gen-tls-key --compat`) built the two HKDF labels without
//! RFC 8446's length prefixes ([`Derivation::Compat`]); a host configured that way derives
//! different TLS PSKs, so the variant is a per-key setting.
//!
//! Key material lives in [`zeroize::Zeroizing`] buffers (wiped when dropped) and no type here
//! prints it: `Debug` shows a fingerprint at most.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use nvme::auth::HashId;
use nvme::auth::dhchap::hmac;
use zeroize::Zeroizing;

use crate::Error;

/// The hash of a PSK and of the cipher suite it goes with (NVMe/TCP 1.1 §3.6.1.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PskHash {
    /// 01: SHA-256, TLS_AES_128_GCM_SHA256, 32-byte keys.
    Sha256,
    /// 02: SHA-384, TLS_AES_256_GCM_SHA384, 48-byte keys.
    Sha384,
}

impl PskHash {
    /// The two-digit identifier (01, 02).
    pub fn id(self) -> u8 {
        match self {
            PskHash::Sha256 => 1,
            PskHash::Sha384 => 2,
        }
    }

    /// From the identifier.
    pub fn from_id(id: u8) -> Option<PskHash> {
        match id {
            1 => Some(PskHash::Sha256),
            2 => Some(PskHash::Sha384),
            _ => None,
        }
    }

    /// Output length of the hash, and the length of its keys.
    pub fn len(self) -> usize {
        match self {
            PskHash::Sha256 => 32,
            PskHash::Sha384 => 48,
        }
    }

    /// Never: a hash always has an output (for clippy's `len_without_is_empty`).
    pub fn is_empty(self) -> bool {
        false
    }

    /// The hash for a key of `len` bytes (a key without transform, `00`).
    pub fn for_key_len(len: usize) -> Option<PskHash> {
        match len {
            32 => Some(PskHash::Sha256),
            48 => Some(PskHash::Sha384),
            _ => None,
        }
    }

    fn hash_id(self) -> HashId {
        match self {
            PskHash::Sha256 => HashId::Sha256,
            PskHash::Sha384 => HashId::Sha384,
        }
    }

    /// The TLS 1.3 cipher suite this hash goes with.
    pub fn suite(self) -> crate::record::Suite {
        match self {
            PskHash::Sha256 => crate::record::Suite::Aes128GcmSha256,
            PskHash::Sha384 => crate::record::Suite::Aes256GcmSha384,
        }
    }

    /// "sha256" / "sha384".
    pub fn name(self) -> &'static str {
        match self {
            PskHash::Sha256 => "sha256",
            PskHash::Sha384 => "sha384",
        }
    }
}

/// HMAC with `hash` over the concatenation of `parts`.
pub(crate) fn mac(hash: PskHash, key: &[u8], parts: &[&[u8]]) -> Zeroizing<Vec<u8>> {
    Zeroizing::new(hmac(hash.hash_id(), key, parts))
}

/// HKDF-Extract with an all-zero salt (RFC 5869 §2.2; a zero-length salt is the same).
pub(crate) fn hkdf_extract(hash: PskHash, ikm: &[u8]) -> Zeroizing<Vec<u8>> {
    mac(hash, &vec![0u8; hash.len()], &[ikm])
}

/// HKDF-Expand (RFC 5869 §2.3) of `len` bytes (at most 255 blocks).
pub(crate) fn hkdf_expand(hash: PskHash, prk: &[u8], info: &[u8], len: usize) -> Zeroizing<Vec<u8>> {
    let mut out = Zeroizing::new(Vec::with_capacity(len + hash.len()));
    let mut t = Zeroizing::new(Vec::new());
    let mut counter = 1u8;
    while out.len() < len {
        t = mac(hash, prk, &[&t, info, &[counter]]);
        out.extend_from_slice(&t);
        counter = counter.wrapping_add(1);
    }
    out.truncate(len);
    out
}

/// HKDF-Expand-Label (RFC 8446 §7.1): `info` is the `HkdfLabel` structure
/// `be16 len || u8 |"tls13 " label| || "tls13 " label || u8 |context| || context`.
pub(crate) fn hkdf_expand_label(
    hash: PskHash,
    secret: &[u8],
    label: &str,
    context: &[u8],
    len: usize,
) -> Zeroizing<Vec<u8>> {
    let full = format!("tls13 {label}");
    let mut info = Vec::with_capacity(4 + full.len() + context.len());
    info.extend_from_slice(&u16::try_from(len).unwrap_or(u16::MAX).to_be_bytes());
    info.push(u8::try_from(full.len()).unwrap_or(u8::MAX));
    info.extend_from_slice(full.as_bytes());
    info.push(u8::try_from(context.len()).unwrap_or(u8::MAX));
    info.extend_from_slice(context);
    hkdf_expand(hash, secret, &info, len)
}

/// The libnvme before 1.11 (`--compat`) form of HKDF-Expand-Label: no length bytes before
/// label and context, and the output length little-endian.
fn hkdf_expand_label_compat(
    hash: PskHash,
    secret: &[u8],
    label: &str,
    context: &[u8],
    len: usize,
) -> Zeroizing<Vec<u8>> {
    let mut info = Vec::with_capacity(8 + label.len() + context.len());
    info.extend_from_slice(&u16::try_from(len).unwrap_or(u16::MAX).to_le_bytes());
    info.extend_from_slice(b"tls13 ");
    info.extend_from_slice(label.as_bytes());
    info.extend_from_slice(context);
    hkdf_expand(hash, secret, &info, len)
}

/// Which form of the HKDF labels a key's derivations use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Derivation {
    /// RFC 8446 `HkdfLabel` (NVMe/TCP 1.1, libnvme 1.11+, Linux).
    #[default]
    Standard,
    /// The labels older libnvme built (`nvme gen-tls-key --compat`).
    Compat,
}

/// A configured PSK, as `nvme gen-tls-key` prints it (`NVMeTLSkey-1:<hh>:<base64>:`).
#[derive(Clone, PartialEq, Eq)]
pub struct ConfiguredPsk {
    transform: Option<PskHash>,
    key: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for ConfiguredPsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ConfiguredPsk({})", self.fingerprint())
    }
}

const PREFIX: &str = "NVMeTLSkey-1:";

impl ConfiguredPsk {
    /// A key from its bytes: 32 or 48 of them, matching `transform` when there is one.
    pub fn new(transform: Option<PskHash>, key: &[u8]) -> Result<ConfiguredPsk, Error> {
        match transform {
            // NVMe/TCP 1.1 §3.6.1.2: the key is as long as its hash's output.
            Some(h) if key.len() != h.len() => {
                return Err(Error::key(format!(
                    "a TLS key of hash {:02} ({}) is {} bytes, not {} (hash 01 goes with 32-byte keys, 02 with 48)",
                    h.id(),
                    h.name(),
                    h.len(),
                    key.len()
                )));
            }
            None if PskHash::for_key_len(key.len()).is_none() => {
                return Err(Error::key(format!(
                    "a TLS key is 32 bytes (hash 01 or 00) or 48 bytes (hash 02 or 00), not {}",
                    key.len()
                )));
            }
            _ => {}
        }
        Ok(ConfiguredPsk { transform, key: Zeroizing::new(key.to_vec()) })
    }

    /// A random key for `hash` (`nvme gen-tls-key --hmac=1|2`).
    pub fn generate(hash: PskHash) -> Result<ConfiguredPsk, Error> {
        let mut key = Zeroizing::new(vec![0u8; hash.len()]);
        openssl::rand::rand_bytes(&mut key).map_err(|e| Error::key(format!("no randomness for a key: {e}")))?;
        Ok(ConfiguredPsk { transform: Some(hash), key })
    }

    /// Parses the PSK interchange format `NVMeTLSkey-1:<hh>:<base64(key || crc32)>:`
    /// (white space around it is ignored, as in a key file).
    pub fn parse(text: &str) -> Result<ConfiguredPsk, Error> {
        let s = text.trim();
        let bad = |why: &str| Error::key(format!("not a TLS key in PSK interchange format: {why}"));
        let rest = s.strip_prefix(PREFIX).ok_or_else(|| bad("it does not start with NVMeTLSkey-1:"))?;
        let (hh, rest) = rest.split_once(':').ok_or_else(|| bad("no ':' after the hash"))?;
        let b64 = rest.strip_suffix(':').ok_or_else(|| bad("it does not end with ':'"))?;
        if hh.len() != 2 {
            return Err(bad("the hash is not two digits"));
        }
        let transform = match hh {
            "00" => None,
            "01" => Some(PskHash::Sha256),
            "02" => Some(PskHash::Sha384),
            _ => return Err(bad("the hash is not 00, 01 or 02")),
        };
        let raw = Zeroizing::new(STANDARD.decode(b64).map_err(|_| bad("the key is not valid base64"))?);
        if raw.len() != 36 && raw.len() != 52 {
            return Err(bad("the key is not 32 or 48 bytes with its CRC"));
        }
        let (key, crc) = raw.split_at(raw.len() - 4);
        if crc32fast::hash(key).to_le_bytes() != crc {
            return Err(bad("its CRC-32 does not match (a mistyped key?)"));
        }
        ConfiguredPsk::new(transform, key)
    }

    /// The interchange format (a secret: never log it).
    pub fn to_interchange(&self) -> Zeroizing<String> {
        let mut raw = Zeroizing::new(self.key.to_vec());
        let crc = crc32fast::hash(&self.key);
        raw.extend_from_slice(&crc.to_le_bytes());
        let hh = self.transform.map_or(0, PskHash::id);
        Zeroizing::new(format!("{PREFIX}{hh:02x}:{}:", STANDARD.encode(&*raw)))
    }

    /// The hash the key is transformed with (`None`: used as the retained key).
    pub fn transform(&self) -> Option<PskHash> {
        self.transform
    }

    /// The hash of the TLS PSKs and cipher suite derived from this key.
    pub fn hash(&self) -> PskHash {
        self.transform.or_else(|| PskHash::for_key_len(self.key.len())).unwrap_or(PskHash::Sha256)
    }

    /// A one-way fingerprint: the first 8 bytes of SHA-256 over a label and the key's
    /// interchange text, in hex. Equal keys, equal fingerprints; nothing else is learned.
    pub fn fingerprint(&self) -> String {
        let text = Zeroizing::new(format!("qpath tls key fingerprint\n{}", &*self.to_interchange()));
        let d = nvme::auth::dhchap::digest(HashId::Sha256, text.as_bytes());
        d.iter().take(8).map(|b| format!("{b:02x}")).collect()
    }

    /// The retained PSK for `hostnqn` (NVMe/TCP 1.1 §3.6.1.2).
    pub fn retained(&self, hostnqn: &str, derivation: Derivation) -> RetainedPsk {
        let hash = self.hash();
        let key = match self.transform {
            None => Zeroizing::new(self.key.to_vec()),
            Some(h) => {
                let prk = hkdf_extract(h, &self.key);
                match derivation {
                    Derivation::Standard => hkdf_expand_label(h, &prk, "HostNQN", hostnqn.as_bytes(), self.key.len()),
                    Derivation::Compat => {
                        hkdf_expand_label_compat(h, &prk, "HostNQN", hostnqn.as_bytes(), self.key.len())
                    }
                }
            }
        };
        RetainedPsk { hash, key, derivation }
    }
}

/// A retained PSK: what a host and a subsystem keep for each other, from which each
/// connection's TLS PSK is derived.
#[derive(Clone)]
pub struct RetainedPsk {
    hash: PskHash,
    key: Zeroizing<Vec<u8>>,
    derivation: Derivation,
}

impl std::fmt::Debug for RetainedPsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetainedPsk").field("hash", &self.hash).finish_non_exhaustive()
    }
}

impl RetainedPsk {
    /// A retained (or generated) PSK from its bytes, as secure channel concatenation
    /// produces one.
    pub fn from_bytes(hash: PskHash, key: &[u8]) -> RetainedPsk {
        RetainedPsk { hash, key: Zeroizing::new(key.to_vec()), derivation: Derivation::Standard }
    }

    /// The PSK a secure channel concatenation transaction generates, `HMAC(Ks, C1 || C2)`
    /// with the transaction's hash (NVMe Base 2.1 §8.3.4.5.9; Linux `nvme_auth_generate_psk`):
    /// host and controller each compute it from the DH session key `Ks` and the two
    /// challenges, so it never crosses the wire.
    pub fn generated(hash: PskHash, session_key: &[u8], c1: &[u8], c2: &[u8]) -> RetainedPsk {
        RetainedPsk { hash, key: mac(hash, session_key, &[c1, c2]), derivation: Derivation::Standard }
    }

    /// The identity of a generated PSK: `NVMe1G<hh> <hostnqn> <subnqn> <digest>` (TP 8018:
    /// always version 1; Linux `nvme_tls_psk_refresh`).
    pub fn generated_identity(&self, hostnqn: &str, subnqn: &str) -> Identity {
        Identity { generated: true, ..self.identity(IdentityVersion::V1, hostnqn, subnqn) }
    }

    /// The hash of the cipher suite.
    pub fn hash(&self) -> PskHash {
        self.hash
    }

    /// The PSK digest of the identity's version 1 (base64 of the HMAC of both NQNs;
    /// Linux `nvme_auth_generate_digest`).
    pub fn digest(&self, hostnqn: &str, subnqn: &str) -> String {
        let m = mac(self.hash, &self.key, &[hostnqn.as_bytes(), b" ", subnqn.as_bytes(), b" ", b"NVMe-over-Fabrics"]);
        STANDARD.encode(&*m)
    }

    /// The identity a host presents for this key.
    pub fn identity(&self, version: IdentityVersion, hostnqn: &str, subnqn: &str) -> Identity {
        let digest = match version {
            IdentityVersion::V0 => None,
            IdentityVersion::V1 => Some(self.digest(hostnqn, subnqn)),
        };
        Identity { hash: self.hash, hostnqn: hostnqn.to_string(), subnqn: subnqn.to_string(), digest, generated: false }
    }

    /// The TLS PSK for `identity` (TP 8018 §3.6.1.3; Linux `nvme_auth_derive_tls_psk`), or
    /// `None` when the identity does not belong to this key: another hash, or (version 1)
    /// a digest this key does not give for the identity's NQNs.
    pub fn tls_psk(&self, identity: &Identity) -> Option<TlsPsk> {
        if identity.hash != self.hash {
            return None;
        }
        let context = match &identity.digest {
            Some(d) => {
                let ours = self.digest(&identity.hostnqn, &identity.subnqn);
                if !nvme::auth::dhchap::ct_eq(ours.as_bytes(), d.as_bytes()) {
                    return None;
                }
                format!("{:02} {d}", self.hash.id())
            }
            None => identity.to_string(),
        };
        let prk = hkdf_extract(self.hash, &self.key);
        let key = match self.derivation {
            Derivation::Standard => {
                hkdf_expand_label(self.hash, &prk, "nvme-tls-psk", context.as_bytes(), self.key.len())
            }
            Derivation::Compat => {
                hkdf_expand_label_compat(self.hash, &prk, "nvme-tls-psk", context.as_bytes(), self.key.len())
            }
        };
        Some(TlsPsk { hash: self.hash, key })
    }
}

/// The key a TLS 1.3 handshake uses as its external PSK.
#[derive(Clone)]
pub struct TlsPsk {
    hash: PskHash,
    key: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for TlsPsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsPsk").field("hash", &self.hash).finish_non_exhaustive()
    }
}

impl TlsPsk {
    /// A TLS PSK from its bytes (a key the operator derived elsewhere, tests).
    pub fn from_bytes(hash: PskHash, key: &[u8]) -> TlsPsk {
        TlsPsk { hash, key: Zeroizing::new(key.to_vec()) }
    }

    /// The hash (and cipher suite).
    pub fn hash(&self) -> PskHash {
        self.hash
    }

    /// The key bytes (for the handshake only).
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.key
    }
}

/// The version of a PSK identity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IdentityVersion {
    /// `NVMe0R<hh> <hostnqn> <subnqn>`: every Linux host since 6.7.
    V0,
    /// `NVMe1R<hh> <hostnqn> <subnqn> <digest>` (NVMe/TCP 1.1), Linux 6.14+ hosts first.
    #[default]
    V1,
}

/// Longest NQN (NVMe Base 2.x §4.7: 223 bytes).
const NQN_MAX: usize = 223;

/// Longest identity a TLS handshake carries here (OpenSSL's `PSK_MAX_IDENTITY_LEN`).
pub const IDENTITY_MAX: usize = 256;

/// A TLS PSK identity (NVMe/TCP 1.1 §3.6.1.3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// Hash of the cipher suite.
    pub hash: PskHash,
    /// Host NQN.
    pub hostnqn: String,
    /// Subsystem NQN.
    pub subnqn: String,
    /// The PSK digest (version 1), base64.
    pub digest: Option<String>,
    /// `G`: a PSK generated by DH-HMAC-CHAP (secure channel concatenation); `R`: retained.
    pub generated: bool,
}

impl Identity {
    /// The identity's version.
    pub fn version(&self) -> IdentityVersion {
        if self.digest.is_some() { IdentityVersion::V1 } else { IdentityVersion::V0 }
    }

    /// Parses `NVMe<v><R|G><hh> <hostnqn> <subnqn>[ <digest>]` (bytes from the wire: checked,
    /// bounded, never trusted).
    pub fn parse(bytes: &[u8]) -> Result<Identity, Error> {
        let bad = |why: &str| Error::identity(format!("not an NVMe PSK identity: {why}"));
        if bytes.len() > IDENTITY_MAX {
            return Err(bad("longer than 256 bytes"));
        }
        let s = std::str::from_utf8(bytes).map_err(|_| bad("not UTF-8"))?;
        let head = s.get(..8).ok_or_else(|| bad("too short"))?;
        let hb = head.as_bytes();
        if &hb[..4] != b"NVMe" {
            return Err(bad("it does not start with NVMe<version><type><hash>"));
        }
        let version = match hb[4] {
            b'0' => IdentityVersion::V0,
            b'1' => IdentityVersion::V1,
            _ => return Err(bad("version is not 0 or 1")),
        };
        let generated = match hb[5] {
            b'R' => false,
            b'G' => true,
            _ => return Err(bad("type is not R or G")),
        };
        let hash = match &hb[6..8] {
            b"01" => PskHash::Sha256,
            b"02" => PskHash::Sha384,
            _ => return Err(bad("hash is not 01 or 02")),
        };
        let rest = s.get(8..).and_then(|r| r.strip_prefix(' ')).ok_or_else(|| bad("no NQNs"))?;
        let mut parts = rest.split(' ');
        let hostnqn = parts.next().filter(|p| !p.is_empty()).ok_or_else(|| bad("no host NQN"))?;
        let subnqn = parts.next().filter(|p| !p.is_empty()).ok_or_else(|| bad("no subsystem NQN"))?;
        let digest = parts.next();
        if parts.next().is_some() {
            return Err(bad("more than host NQN, subsystem NQN and digest"));
        }
        let digest = match (version, digest) {
            (IdentityVersion::V0, None) => None,
            (IdentityVersion::V1, Some(d)) if !d.is_empty() => Some(d.to_string()),
            (IdentityVersion::V0, Some(_)) => return Err(bad("version 0 carries no digest")),
            (IdentityVersion::V1, _) => return Err(bad("version 1 needs a digest")),
        };
        for nqn in [hostnqn, subnqn] {
            if nqn.len() > NQN_MAX {
                return Err(bad("an NQN is longer than 223 bytes"));
            }
        }
        Ok(Identity { hash, hostnqn: hostnqn.to_string(), subnqn: subnqn.to_string(), digest, generated })
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = match self.version() {
            IdentityVersion::V0 => 0,
            IdentityVersion::V1 => 1,
        };
        let t = if self.generated { 'G' } else { 'R' };
        write!(f, "NVMe{v}{t}{:02} {} {}", self.hash.id(), self.hostnqn, self.subnqn)?;
        if let Some(d) = &self.digest {
            write!(f, " {d}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// Linux `drivers/nvme/common/tests/auth_kunit.c`: the generated PSK of its fixed
    /// inputs, its digest for ("hostnqn", "subsysnqn") and the TLS PSK derived from it.
    #[test]
    fn linux_kunit_digest_and_tls_psk() {
        let psk256 = [
            0x17, 0x33, 0xc5, 0x9f, 0xa7, 0xf4, 0x8f, 0xcf, 0x37, 0xf5, 0xf2, 0x6f, 0xc4, 0xff, 0x02, 0x68, 0xad, 0x4f,
            0x78, 0xe0, 0x30, 0xf4, 0xf3, 0xb0, 0xbf, 0xd1, 0xd4, 0x7e, 0x7b, 0xb1, 0x44, 0x7a,
        ];
        let r = RetainedPsk::from_bytes(PskHash::Sha256, &psk256);
        assert_eq!(r.digest("hostnqn", "subsysnqn"), "OldoKuTfKddMuyCznAZojkWD7P4D9/AtzDzLimtOxqI=");
        let mut id = r.identity(IdentityVersion::V1, "hostnqn", "subsysnqn");
        id.generated = true;
        let tls = r.tls_psk(&id).expect("digest matches");
        assert_eq!(hex(tls.bytes()), "3c17da628474a04d2247c4cab47968c915388193f7c071bd9489cc3666cd7cc8");

        let psk384 = [
            0xf1, 0x4b, 0x2d, 0xd3, 0x23, 0x4c, 0x45, 0x96, 0x94, 0xd3, 0xbc, 0x63, 0xf8, 0x96, 0x8b, 0xd6, 0xb3, 0x7c,
            0x2c, 0x6d, 0xe8, 0x49, 0xe2, 0x2e, 0x11, 0x87, 0x49, 0x00, 0x1c, 0xe4, 0xbb, 0xe8, 0x64, 0x0b, 0x9e, 0x3a,
            0x74, 0x8c, 0xb1, 0x1c, 0xe4, 0xb1, 0xd7, 0x1d, 0x35, 0x9c, 0xce, 0x39,
        ];
        let r = RetainedPsk::from_bytes(PskHash::Sha384, &psk384);
        let d = r.digest("hostnqn", "subsysnqn");
        assert_eq!(d, "cffMWk8TSS7HOQebjgYEIkrPrjWPV4JE5cdPB8WhEvY4JBW5YynKyv66XscN4A9n");
        let id = r.identity(IdentityVersion::V1, "hostnqn", "subsysnqn");
        assert_eq!(
            hex(r.tls_psk(&id).expect("ours").bytes()),
            "2774753233537b3fa50eb7d16a8e43457d85f4906c005b2236616c5d80939d0898fff15bb8b77119d2be0aac423e7590"
        );
    }

    /// A generated PSK is `HMAC(Ks, C1 || C2)`, as nvme's `generated_psk` (checked there
    /// against Linux's KUnit vector), and its identity is `NVMe1G<hh>` with the digest.
    #[test]
    fn generated_psk_and_identity() {
        let (ks, c1, c2) = ([0x41u8; 256], [1u8; 32], [2u8; 32]);
        let g = RetainedPsk::generated(PskHash::Sha256, &ks, &c1, &c2);
        let want = nvme::auth::dhchap::generated_psk(HashId::Sha256, &ks, &c1, &c2);
        assert_eq!(g.key.as_slice(), &want[..]);
        let id = g.generated_identity("nqn.h", "nqn.s");
        assert_eq!(id.to_string(), format!("NVMe1G01 nqn.h nqn.s {}", g.digest("nqn.h", "nqn.s")));
        assert!(g.tls_psk(&id).is_some(), "the identity belongs to the key");
        assert_eq!(format!("{g:?}"), "RetainedPsk { hash: Sha256, .. }", "Debug shows no key");
    }

    /// RFC 5869 appendix A.1 (HKDF-SHA256), through our extract/expand.
    #[test]
    fn rfc5869_case1_expand() {
        let prk = [
            0x07, 0x77, 0x09, 0x36, 0x2c, 0x2e, 0x32, 0xdf, 0x0d, 0xdc, 0x3f, 0x0d, 0xc4, 0x7b, 0xba, 0x63, 0x90, 0xb6,
            0xc7, 0x3b, 0xb5, 0x0f, 0x9c, 0x31, 0x22, 0xec, 0x84, 0x4a, 0xd7, 0xc2, 0xb3, 0xe5,
        ];
        let info: Vec<u8> = (0xf0..=0xf9).collect();
        let okm = hkdf_expand(PskHash::Sha256, &prk, &info, 42);
        assert_eq!(hex(&okm), "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865");
    }

    #[test]
    fn interchange_round_trip_and_refusals() {
        let k = ConfiguredPsk::new(Some(PskHash::Sha256), &[0x55; 32]).unwrap();
        let text = k.to_interchange();
        assert!(text.starts_with("NVMeTLSkey-1:01:") && text.ends_with(':'), "{}", &*text);
        assert_eq!(text.len(), 65, "libnvme checks this length for hash 01");
        assert_eq!(ConfiguredPsk::parse(&format!(" {}\n", &*text)).unwrap(), k);
        let k48 = ConfiguredPsk::generate(PskHash::Sha384).unwrap();
        assert_eq!(k48.to_interchange().len(), 89);
        assert_eq!(ConfiguredPsk::parse(&k48.to_interchange()).unwrap(), k48);
        // A flipped character breaks the CRC; wrong hash/length pairs and formats are refused.
        let mut bad = text.to_string().into_bytes();
        bad[20] = if bad[20] == b'A' { b'B' } else { b'A' };
        let e = ConfiguredPsk::parse(std::str::from_utf8(&bad).unwrap()).unwrap_err().to_string();
        assert!(e.contains("CRC"), "{e}");
        for t in ["NVMeTLSkey-1:03:AAAA:", "DHHC-1:01:AAAA:", "NVMeTLSkey-1:01:!!!:", "NVMeTLSkey-1:01:AAAA"] {
            assert!(ConfiguredPsk::parse(t).is_err(), "{t}");
        }
        let k32_as_384 = format!("NVMeTLSkey-1:02:{}", &text["NVMeTLSkey-1:01:".len()..]);
        let e = ConfiguredPsk::parse(&k32_as_384).unwrap_err().to_string();
        assert!(e.contains("hash 02 (sha384) is 48 bytes, not 32"), "{e}");
        let k48 = k48.to_interchange();
        let k48_as_256 = format!("NVMeTLSkey-1:01:{}", &k48["NVMeTLSkey-1:02:".len()..]);
        let e = ConfiguredPsk::parse(&k48_as_256).unwrap_err().to_string();
        assert!(e.contains("hash 01 (sha256) is 32 bytes, not 48"), "{e}");
        assert!(!e.contains(&k48[16..40]), "no key in the error");
        assert!(!format!("{k:?}").contains(&text[16..30]), "Debug shows no key");
    }

    #[test]
    fn identities_parse_and_print() {
        let id = Identity::parse(b"NVMe0R01 nqn.h nqn.s").unwrap();
        assert_eq!((id.hash, id.version(), id.generated), (PskHash::Sha256, IdentityVersion::V0, false));
        assert_eq!(id.to_string(), "NVMe0R01 nqn.h nqn.s");
        let id = Identity::parse(b"NVMe1G02 nqn.h nqn.s abc=").unwrap();
        assert_eq!((id.hash, id.digest.as_deref(), id.generated), (PskHash::Sha384, Some("abc="), true));
        assert_eq!(id.to_string(), "NVMe1G02 nqn.h nqn.s abc=");
        for bad in [
            &b"NVMe0R01 nqn.h"[..],
            b"NVMe0R03 nqn.h nqn.s",
            b"NVMe2R01 nqn.h nqn.s",
            b"NVMe0X01 nqn.h nqn.s",
            b"NVMe1R01 nqn.h nqn.s",
            b"NVMe0R01 nqn.h nqn.s dig",
            b"NVMe1R01 nqn.h nqn.s d e",
            b"nvme0R01 nqn.h nqn.s",
            b"NVMe0R01",
            b"NVMe0R01 \xff nqn.s",
        ] {
            assert!(Identity::parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        assert!(Identity::parse(&[b'a'; 300]).is_err());
    }

    #[test]
    fn tls_psk_needs_the_right_identity() {
        let k = ConfiguredPsk::new(Some(PskHash::Sha256), &[7; 32]).unwrap();
        let r = k.retained("nqn.h", Derivation::Standard);
        let v1 = r.identity(IdentityVersion::V1, "nqn.h", "nqn.s");
        let v0 = r.identity(IdentityVersion::V0, "nqn.h", "nqn.s");
        let a = r.tls_psk(&v1).unwrap();
        let b = r.tls_psk(&v0).unwrap();
        assert_ne!(a.bytes(), b.bytes(), "the context differs by version");
        let mut forged = v1.clone();
        forged.subnqn = "nqn.other".into();
        assert!(r.tls_psk(&forged).is_none(), "a digest for other NQNs is refused");
        let mut other_hash = v0;
        other_hash.hash = PskHash::Sha384;
        assert!(r.tls_psk(&other_hash).is_none());
        // Another host NQN gives another retained key; the compat labels another one too.
        let r2 = k.retained("nqn.h2", Derivation::Standard);
        assert_ne!(r2.digest("nqn.h", "nqn.s"), r.digest("nqn.h", "nqn.s"));
        let rc = k.retained("nqn.h", Derivation::Compat);
        assert_ne!(rc.digest("nqn.h", "nqn.s"), r.digest("nqn.h", "nqn.s"));
        // Without transform the configured key is the retained key.
        let plain = ConfiguredPsk::new(None, &[9; 48]).unwrap();
        assert_eq!(plain.hash(), PskHash::Sha384);
        assert_eq!(plain.retained("x", Derivation::Standard).key.as_slice(), &[9; 48]);
    }
}
