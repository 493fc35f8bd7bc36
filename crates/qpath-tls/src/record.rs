//! TLS 1.3 record protection (RFC 8446 §5), one direction at a time.
//!
//! ```text
//!   record     = type 23 || 0x0303 || be16 length || AEAD(inner) || tag(16)
//!   inner      = content || content type || zero padding        (at most 2^14 + 1 bytes + padding)
//!   nonce      = iv XOR be64(sequence number), left-padded to 12 bytes
//!   aad        = the 5-byte record header
//!   key, iv    = HKDF-Expand-Label(traffic secret, "key" | "iv", "", len)
//!   KeyUpdate  : secret' = HKDF-Expand-Label(secret, "traffic upd", "", hash length)
//! ```
//!
//! The AEAD is `ring`'s AES-GCM (VAES and carry-less multiply where the CPU has them,
//! AES-NI otherwise; about twice as fast per record as the system's OpenSSL 3.0 on a CPU
//! with VAES, see [`gcm`]). Each direction's key is expanded once; sealing and opening
//! allocate nothing. A record's content is gathered where its ciphertext goes (also
//! straight out of a RAM namespace's shared region, [`Sealer::from_region`]) and sealed
//! there in place; a record is opened in the receive buffer, or copied to its destination
//! first and opened there. The channel fills records to 2^14 bytes where it has that much
//! to send.

use uring::SharedRegion;
use zeroize::Zeroizing;

mod gcm;
use gcm::{Gcm, NONCE_LEN};

use crate::Error;
use crate::psk::{PskHash, hkdf_expand_label};

/// Record header bytes.
pub const HEADER_LEN: usize = 5;
/// AEAD tag bytes.
pub const TAG_LEN: usize = 16;
/// Most plaintext bytes one record carries (RFC 8446 §5.1).
pub const PLAINTEXT_MAX: usize = 16384;
/// Most bytes after the header of a protected record (RFC 8446 §5.2).
pub const CIPHERTEXT_MAX: usize = PLAINTEXT_MAX + 256;
/// Bytes a full record adds to its content: header, content type, tag.
pub const OVERHEAD: usize = HEADER_LEN + 1 + TAG_LEN;

/// TLS content types (RFC 8446 §5.1).
pub mod content {
    /// Legacy change_cipher_spec (compatibility mode, handshake only).
    pub const CHANGE_CIPHER_SPEC: u8 = 20;
    /// Alert.
    pub const ALERT: u8 = 21;
    /// Handshake.
    pub const HANDSHAKE: u8 = 22;
    /// Application data (and the outer type of every protected record).
    pub const APPLICATION_DATA: u8 = 23;
}

/// Alert descriptions this crate sends (RFC 8446 §6).
pub mod alert {
    /// close_notify.
    pub const CLOSE_NOTIFY: u8 = 0;
    /// unexpected_message.
    pub const UNEXPECTED_MESSAGE: u8 = 10;
    /// bad_record_mac.
    pub const BAD_RECORD_MAC: u8 = 20;
    /// record_overflow.
    pub const RECORD_OVERFLOW: u8 = 22;
    /// decode_error.
    pub const DECODE_ERROR: u8 = 50;
    /// internal_error.
    pub const INTERNAL_ERROR: u8 = 80;
}

/// A TLS 1.3 cipher suite NVMe/TCP uses (NVMe/TCP 1.1 §3.6.1.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suite {
    /// TLS_AES_128_GCM_SHA256 (0x1301).
    Aes128GcmSha256,
    /// TLS_AES_256_GCM_SHA384 (0x1302).
    Aes256GcmSha384,
}

impl Suite {
    /// From the two-byte suite id.
    pub fn from_id(id: [u8; 2]) -> Option<Suite> {
        match id {
            [0x13, 0x01] => Some(Suite::Aes128GcmSha256),
            [0x13, 0x02] => Some(Suite::Aes256GcmSha384),
            _ => None,
        }
    }

    /// The two-byte suite id (RFC 8446 §B.4).
    pub fn id(self) -> [u8; 2] {
        match self {
            Suite::Aes128GcmSha256 => [0x13, 0x01],
            Suite::Aes256GcmSha384 => [0x13, 0x02],
        }
    }

    /// The hash of its key schedule.
    pub fn hash(self) -> PskHash {
        match self {
            Suite::Aes128GcmSha256 => PskHash::Sha256,
            Suite::Aes256GcmSha384 => PskHash::Sha384,
        }
    }

    /// The IANA name.
    pub fn name(self) -> &'static str {
        match self {
            Suite::Aes128GcmSha256 => "TLS_AES_128_GCM_SHA256",
            Suite::Aes256GcmSha384 => "TLS_AES_256_GCM_SHA384",
        }
    }

    fn key_len(self) -> usize {
        match self {
            Suite::Aes128GcmSha256 => 16,
            Suite::Aes256GcmSha384 => 32,
        }
    }
}

/// Which way a direction's records go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// Records this end sends.
    Seal,
    /// Records this end receives.
    Open,
}

/// One direction's traffic keys and sequence number.
pub struct Keys {
    suite: Suite,
    dir: Dir,
    secret: Zeroizing<Vec<u8>>,
    iv: [u8; 12],
    seq: u64,
    gcm: Gcm,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys").field("suite", &self.suite).field("dir", &self.dir).field("seq", &self.seq).finish()
    }
}

impl Keys {
    /// Keys from a traffic secret (from the handshake, or a KeyUpdate).
    pub fn new(suite: Suite, dir: Dir, secret: &[u8]) -> Result<Keys, Error> {
        let (gcm, iv) = Keys::derive(suite, secret)?;
        Ok(Keys { suite, dir, secret: Zeroizing::new(secret.to_vec()), iv, seq: 0, gcm })
    }

    /// The AEAD key and IV of a traffic secret (RFC 8446 §7.3).
    fn derive(suite: Suite, secret: &[u8]) -> Result<(Gcm, [u8; NONCE_LEN]), Error> {
        let h = suite.hash();
        let key = hkdf_expand_label(h, secret, "key", &[], suite.key_len());
        let gcm = Gcm::new(suite, &key).map_err(|_| Error::internal("AES-GCM key of the wrong length"))?;
        let mut iv = [0u8; NONCE_LEN];
        iv.copy_from_slice(&hkdf_expand_label(h, secret, "iv", &[], NONCE_LEN));
        Ok((gcm, iv))
    }

    /// The suite.
    pub fn suite(&self) -> Suite {
        self.suite
    }

    /// Records protected with these keys so far.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The AEAD key and the 12-byte IV of these keys (derived again from the traffic
    /// secret: what the kernel needs to take the direction over, [`crate::kernel`]).
    pub(crate) fn key_and_iv(&self) -> (Zeroizing<Vec<u8>>, [u8; 12]) {
        let key = hkdf_expand_label(self.suite.hash(), &self.secret, "key", &[], self.suite.key_len());
        (key, self.iv)
    }

    /// KeyUpdate (RFC 8446 §7.2): the next traffic secret, keys and a fresh sequence.
    pub fn update(&mut self) -> Result<(), Error> {
        let h = self.suite.hash();
        let secret = hkdf_expand_label(h, &self.secret, "traffic upd", &[], h.len());
        (self.gcm, self.iv) = Keys::derive(self.suite, &secret)?;
        self.secret = secret;
        self.seq = 0;
        Ok(())
    }

    /// The nonce of the next record, which takes its sequence number.
    fn next_nonce(&mut self) -> Result<[u8; NONCE_LEN], Error> {
        // RFC 8446 §5.3: a sequence number never wraps; the connection must end before.
        if self.seq == u64::MAX {
            return Err(Error::record(alert::INTERNAL_ERROR, "record sequence number exhausted"));
        }
        let mut nonce = self.iv;
        for (n, s) in nonce[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *n ^= s;
        }
        self.seq += 1;
        Ok(nonce)
    }
}

/// The header of a protected record whose inner plaintext is `inner_len` bytes.
pub fn header(inner_len: usize) -> [u8; HEADER_LEN] {
    let len = u16::try_from(inner_len + TAG_LEN).unwrap_or(u16::MAX).to_be_bytes();
    [content::APPLICATION_DATA, 0x03, 0x03, len[0], len[1]]
}

/// Seals one record into `out` (which must hold `HEADER_LEN + inner + TAG_LEN` bytes).
/// The content is given piece by piece, by [`Sealer::copy`] or [`Sealer::from_region`], for
/// `content_len` bytes in all; [`Sealer::finish`] appends the content type, encrypts the
/// inner plaintext in place and appends the tag.
pub struct Sealer<'a> {
    keys: &'a mut Keys,
    out: &'a mut [u8],
    at: usize,
    end: usize,
    nonce: [u8; NONCE_LEN],
    header: [u8; HEADER_LEN],
}

impl<'a> Sealer<'a> {
    /// Starts a record of `content_len` content bytes at the front of `out`.
    pub fn begin(keys: &'a mut Keys, out: &'a mut [u8], content_len: usize) -> Result<Sealer<'a>, Error> {
        debug_assert!(content_len <= PLAINTEXT_MAX, "a record carries at most 2^14 bytes");
        let h = header(content_len + 1);
        let need = HEADER_LEN + content_len + 1 + TAG_LEN;
        if out.len() < need {
            return Err(Error::internal("record buffer too small"));
        }
        out[..HEADER_LEN].copy_from_slice(&h);
        let nonce = keys.next_nonce()?;
        Ok(Sealer { keys, out, at: HEADER_LEN, end: HEADER_LEN + content_len, nonce, header: h })
    }

    /// Adds `src` to the record's content.
    pub fn copy(&mut self, src: &[u8]) -> Result<(), Error> {
        let to = self.at + src.len();
        debug_assert!(to <= self.end, "more content than the record was begun with");
        self.out[self.at..to].copy_from_slice(src);
        self.at = to;
        Ok(())
    }

    /// Adds `len` bytes of `region` from `offset` to the record's content (another reactor
    /// may write them meanwhile, as it may during a plaintext send: the record then holds,
    /// per word, old or new data).
    pub fn from_region(&mut self, region: &SharedRegion, offset: usize, len: usize) -> Result<(), Error> {
        let to = self.at + len;
        debug_assert!(to <= self.end, "more content than the record was begun with");
        region.copy_for_send(offset, &mut self.out[self.at..to]).map_err(|e| Error::internal(e.to_string()))?;
        self.at = to;
        Ok(())
    }

    /// Ends the record with its content type, seals it; returns its length on the wire.
    pub fn finish(self, content_type: u8) -> Result<usize, Error> {
        debug_assert_eq!(self.at, self.end, "record content not all given");
        self.out[self.at] = content_type;
        let inner = HEADER_LEN..self.at + 1;
        let tag = self
            .keys
            .gcm
            .seal(self.nonce, &self.header, &mut self.out[inner.clone()])
            .map_err(|_| Error::internal("AES-GCM seal: a record longer than one nonce may seal"))?;
        self.out[inner.end..inner.end + TAG_LEN].copy_from_slice(&tag);
        Ok(inner.end + TAG_LEN)
    }
}

/// Seals a record of one piece of content (alerts, handshake messages, tests).
pub fn seal_bytes(keys: &mut Keys, content_type: u8, content: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
    let start = out.len();
    out.resize(start + content.len() + OVERHEAD, 0);
    let mut s = Sealer::begin(keys, &mut out[start..], content.len())?;
    s.copy(content)?;
    s.finish(content_type)?;
    Ok(())
}

/// A record's header, checked: the length of what follows it.
pub fn parse_header(h: &[u8; HEADER_LEN]) -> Result<usize, Error> {
    if h[0] != content::APPLICATION_DATA {
        return Err(Error::record(alert::UNEXPECTED_MESSAGE, "a record that is not protected application data"));
    }
    // RFC 8446 §5.1: legacy_record_version is 0x0303 for protected records.
    if h[1] != 3 || h[2] != 3 {
        return Err(Error::record(alert::DECODE_ERROR, "a record with a version other than TLS 1.2's number"));
    }
    let len = usize::from(u16::from_be_bytes([h[3], h[4]]));
    if len > CIPHERTEXT_MAX {
        return Err(Error::record(alert::RECORD_OVERFLOW, "a record longer than 2^14 + 256 bytes"));
    }
    if len < TAG_LEN + 1 {
        return Err(Error::record(alert::DECODE_ERROR, "a record too short for its tag"));
    }
    Ok(len)
}

/// Opens one record: `record` is its header and body. The inner plaintext goes to `dst`
/// when given (it must hold body length − 16 bytes), else it is decrypted in place in the
/// body. Returns the content type and the content's length (padding removed); nothing
/// in `dst` or the body is plaintext the caller may use unless this returns `Ok`.
pub fn open(keys: &mut Keys, record: &mut [u8], dst: Option<&mut [u8]>) -> Result<(u8, usize), Error> {
    let h: [u8; HEADER_LEN] = record[..HEADER_LEN].try_into().map_err(|_| Error::internal("short record"))?;
    let body_len = record.len() - HEADER_LEN;
    let ct_len = body_len - TAG_LEN;
    let nonce = keys.next_nonce()?;
    let (ct, tag) = record[HEADER_LEN..].split_at_mut(ct_len);
    let tag: [u8; TAG_LEN] = (&*tag).try_into().map_err(|_| Error::internal("short record"))?;
    let plain: &mut [u8] = match dst {
        Some(d) => {
            let d = &mut d[..ct_len];
            d.copy_from_slice(ct);
            d
        }
        None => ct,
    };
    if keys.gcm.open(nonce, &h, tag, plain).is_err() {
        return Err(Error::record(alert::BAD_RECORD_MAC, "a record failed its authentication (bad record MAC)"));
    }
    // RFC 8446 §5.4: the content type is the last non-zero byte.
    let Some(pos) = plain.iter().rposition(|&b| b != 0) else {
        return Err(Error::record(alert::UNEXPECTED_MESSAGE, "a record with no content type"));
    };
    if pos > PLAINTEXT_MAX {
        return Err(Error::record(alert::RECORD_OVERFLOW, "a record with more than 2^14 bytes of content"));
    }
    Ok((plain[pos], pos))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(suite: Suite) -> (Keys, Keys) {
        let secret = vec![0x42; suite.hash().len()];
        (Keys::new(suite, Dir::Seal, &secret).unwrap(), Keys::new(suite, Dir::Open, &secret).unwrap())
    }

    /// RFC 8448 §3 (simple 1-RTT handshake): the server's application traffic secret gives
    /// this key and IV, and its first application record (sequence 0) these bytes.
    #[test]
    fn rfc8448_server_application_keys() {
        let secret = hexv("a11af9f05531f856ad47116b45a950328204b4f44bfb6b3a4b4f1f3fcb631643");
        let k = Keys::new(Suite::Aes128GcmSha256, Dir::Seal, &secret).unwrap();
        assert_eq!(hex(&k.iv), "cf782b88dd83549aadf1e984");
        let key = hkdf_expand_label(PskHash::Sha256, &secret, "key", &[], 16);
        assert_eq!(hex(&key), "9f02283b6c9c07efc26bb9f2ac92e356");
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn hexv(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// The record layer's AES-GCM against OpenSSL's, an implementation of its own: records
    /// sealed here open there and the other way round, both suites, past sequence 0, for
    /// the sizes NVMe/TCP sends (a capsule, a 4 KiB read, a full record).
    #[test]
    fn records_agree_with_openssl_both_ways() {
        use openssl::symm::{Cipher, decrypt_aead, encrypt_aead};
        for suite in [Suite::Aes128GcmSha256, Suite::Aes256GcmSha384] {
            let cipher = match suite {
                Suite::Aes128GcmSha256 => Cipher::aes_128_gcm(),
                Suite::Aes256GcmSha384 => Cipher::aes_256_gcm(),
            };
            let secret = vec![0x42; suite.hash().len()];
            let key = hkdf_expand_label(suite.hash(), &secret, "key", &[], suite.key_len());
            let (mut s, mut o) = pair(suite);
            for (seq, len) in [(0u64, 72usize), (1, 4096 + 24), (2, PLAINTEXT_MAX)] {
                let content: Vec<u8> = (0..len).map(|i| (i * 7 + 3).to_le_bytes()[0]).collect();
                let mut nonce = s.iv;
                for (n, b) in nonce[4..].iter_mut().zip(seq.to_be_bytes()) {
                    *n ^= b;
                }
                let mut wire = Vec::new();
                seal_bytes(&mut s, content::APPLICATION_DATA, &content, &mut wire).unwrap();
                let (aad, body) = wire.split_at(HEADER_LEN);
                let (ct, tag) = body.split_at(body.len() - TAG_LEN);
                let plain = decrypt_aead(cipher, &key, Some(&nonce), aad, ct, tag).expect("OpenSSL opens our record");
                assert_eq!((&plain[..len], plain[len]), (&content[..], content::APPLICATION_DATA));

                let mut inner = content.clone();
                inner.push(content::APPLICATION_DATA);
                let h = header(inner.len());
                let mut tag = [0u8; TAG_LEN];
                let ct = encrypt_aead(cipher, &key, Some(&nonce), &h, &inner, &mut tag).unwrap();
                let mut rec = [&h[..], &ct, &tag].concat();
                let mut dst = vec![0u8; inner.len()];
                assert_eq!(open(&mut o, &mut rec, Some(&mut dst)).unwrap(), (content::APPLICATION_DATA, len));
                assert_eq!(&dst[..len], &content[..], "we open OpenSSL's record");
            }
        }
    }

    #[test]
    fn seal_then_open_both_suites_and_directly() {
        for suite in [Suite::Aes128GcmSha256, Suite::Aes256GcmSha384] {
            let (mut s, mut o) = pair(suite);
            let mut wire = Vec::new();
            seal_bytes(&mut s, content::APPLICATION_DATA, b"hello", &mut wire).unwrap();
            seal_bytes(&mut s, content::HANDSHAKE, b"second", &mut wire).unwrap();
            assert_eq!(wire.len(), 2 * OVERHEAD + 11);
            let first = HEADER_LEN + parse_header(wire[..5].try_into().unwrap()).unwrap();
            let mut dst = [0u8; 64];
            let (t, n) = open(&mut o, &mut wire[..first], Some(&mut dst)).unwrap();
            assert_eq!((t, &dst[..n]), (content::APPLICATION_DATA, &b"hello"[..]));
            let (t, n) = open(&mut o, &mut wire[first..], None).unwrap();
            assert_eq!((t, &wire[first + HEADER_LEN..first + HEADER_LEN + n]), (content::HANDSHAKE, &b"second"[..]));
        }
    }

    /// A record sealed straight from a shared region is the record sealed from the same
    /// bytes in a slice (same keys, same sequence), at unaligned offsets and lengths, and
    /// opens; a range past the region's end is refused before anything is encrypted.
    #[test]
    fn sealing_from_a_region_equals_sealing_its_bytes() {
        let region = SharedRegion::new(64 << 10).unwrap();
        let data: Vec<u8> = (0..64u32 << 10).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
        region.copy_to_region(0, &data).unwrap();
        for (off, len) in [(0usize, 4096usize), (3, 1), (4093, 8195), (1, PLAINTEXT_MAX), ((64 << 10) - 7, 7)] {
            let secret = [9u8; 32];
            let mut a = Keys::new(Suite::Aes128GcmSha256, Dir::Seal, &secret).unwrap();
            let mut b = Keys::new(Suite::Aes128GcmSha256, Dir::Seal, &secret).unwrap();
            let mut from_slice = vec![0u8; len + OVERHEAD];
            let mut s = Sealer::begin(&mut a, &mut from_slice, len).unwrap();
            s.copy(&data[off..off + len]).unwrap();
            s.finish(content::APPLICATION_DATA).unwrap();
            let mut from_region = vec![0u8; len + OVERHEAD];
            let mut s = Sealer::begin(&mut b, &mut from_region, len).unwrap();
            // In two pieces, as a batch whose record spans two region pieces gives it.
            let half = len / 2;
            s.from_region(&region, off, half).unwrap();
            s.from_region(&region, off + half, len - half).unwrap();
            s.finish(content::APPLICATION_DATA).unwrap();
            assert!(from_region == from_slice, "offset {off} length {len}");
            let mut o = Keys::new(Suite::Aes128GcmSha256, Dir::Open, &secret).unwrap();
            let mut dst = vec![0u8; len + 1];
            let (t, n) = open(&mut o, &mut from_region, Some(&mut dst)).unwrap();
            assert_eq!((t, &dst[..n]), (content::APPLICATION_DATA, &data[off..off + len]));
        }
        let mut k = Keys::new(Suite::Aes128GcmSha256, Dir::Seal, &[9u8; 32]).unwrap();
        let mut out = vec![0u8; 16 + OVERHEAD];
        let mut s = Sealer::begin(&mut k, &mut out, 16).unwrap();
        assert_eq!(s.from_region(&region, (64 << 10) - 8, 16).unwrap_err().kind(), crate::ErrorKind::Internal);
    }

    #[test]
    fn tampering_reordering_and_replay_fail() {
        let (mut s, mut o) = pair(Suite::Aes128GcmSha256);
        let mut a = Vec::new();
        seal_bytes(&mut s, content::APPLICATION_DATA, b"aaaa", &mut a).unwrap();
        let mut b = Vec::new();
        seal_bytes(&mut s, content::APPLICATION_DATA, b"bbbb", &mut b).unwrap();
        // Out of order: record 1 opened as record 0.
        let e = open(&mut o, &mut b.clone(), None).unwrap_err();
        assert_eq!(e.alert(), Some(alert::BAD_RECORD_MAC));
        // Every bit flipped in turn in a fresh copy fails (header bits are the AAD).
        for bit in 0..a.len() * 8 {
            let (_, mut o2) = pair(Suite::Aes128GcmSha256);
            let mut t = a.clone();
            t[bit / 8] ^= 1 << (bit % 8);
            assert!(open(&mut o2, &mut t, None).is_err(), "bit {bit}");
        }
    }

    #[test]
    fn headers_are_checked() {
        assert!(parse_header(&[22, 3, 3, 0, 40]).is_err(), "handshake type after the handshake");
        assert!(parse_header(&[23, 3, 1, 0, 40]).is_err());
        assert_eq!(parse_header(&[23, 3, 3, 0x41, 0x01]).unwrap_err().alert(), Some(alert::RECORD_OVERFLOW));
        assert!(parse_header(&[23, 3, 3, 0, 16]).is_err());
        assert_eq!(parse_header(&[23, 3, 3, 0x40, 0xff]).unwrap(), 0x40ff);
    }

    #[test]
    fn padding_and_empty_inner_plaintext() {
        let (mut s, mut o) = pair(Suite::Aes128GcmSha256);
        // Content "x", type 23, then three zero bytes of padding.
        let mut out = vec![0u8; HEADER_LEN + 5 + TAG_LEN];
        let h = header(5);
        out[..5].copy_from_slice(&h);
        out[HEADER_LEN..HEADER_LEN + 5].copy_from_slice(&[b'x', 23, 0, 0, 0]);
        let nonce = s.next_nonce().unwrap();
        let tag = s.gcm.seal(nonce, &h, &mut out[HEADER_LEN..HEADER_LEN + 5]).unwrap();
        out[HEADER_LEN + 5..].copy_from_slice(&tag);
        assert_eq!(open(&mut o, &mut out, None).unwrap(), (23, 1));
        // All zeros: no content type.
        let mut z = Vec::new();
        seal_bytes(&mut s, 0, &[0, 0], &mut z).unwrap();
        assert!(open(&mut o, &mut z, None).is_err());
    }

    #[test]
    fn key_update_moves_both_ends() {
        let (mut s, mut o) = pair(Suite::Aes256GcmSha384);
        s.update().unwrap();
        let mut w = Vec::new();
        seal_bytes(&mut s, content::APPLICATION_DATA, b"after", &mut w).unwrap();
        assert!(open(&mut o, &mut w.clone(), None).is_err(), "old keys cannot open");
        let (_, mut o2) = pair(Suite::Aes256GcmSha384);
        o2.update().unwrap();
        assert_eq!(open(&mut o2, &mut w, None).unwrap(), (content::APPLICATION_DATA, 5));
    }
}
