//! Kernel TLS (the `tls` upper-layer protocol, `TCP_ULP`): after the handshake a connection
//! hands its traffic keys to the kernel, which then seals and opens the records itself, and
//! the NVMe/TCP queue sends and receives plain PDUs through the same io_uring path as a
//! plaintext connection (no user-space crypto; sends straight from a namespace's memory stay
//! possible). Linux `Documentation/networking/tls.rst`, `include/uapi/linux/tls.h`.
//!
//! ```text
//!   handshake (OpenSSL, user space) ─► Channel open ─► records at a boundary both ways,
//!   no send or receive in flight ─► Handover { tx, rx: tls12_crypto_info_aes_gcm_* }
//!   ─► setsockopt(SOL_TCP, TCP_ULP, "tls") ─► setsockopt(SOL_TLS, TLS_TX) ─► (TLS_RX)
//!   ENOENT (no "tls" ULP) / EINVAL (a cipher the kernel lacks): the records stay in user space
//! ```
//!
//! Records that reached user space before the handover (the first application records
//! that came with the peer's Finished) are opened there first: the handover waits until
//! every byte received is opened, and the kernel's receive sequence number starts after
//! them. The kernel parses what is still in the socket's queue from that record on.
//!
//! Not handed over: a control record arriving on a kernel-TLS socket (an alert, a KeyUpdate,
//! a session ticket) makes a plain receive fail with EIO; the connection then closes (NVMe
//! peers send none during a connection's life but close_notify or a fatal alert).

use std::os::fd::{AsRawFd, BorrowedFd};

use zeroize::Zeroizing;

use crate::record::{Keys, Suite};

#[allow(unsafe_code)]
mod sys;

/// Where a connection's records are sealed and opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordPath {
    /// In this process, on the thread that owns the connection (AES-GCM through OpenSSL).
    User,
    /// In the kernel (`TCP_ULP` "tls"): the connection sends and receives plain PDUs.
    Kernel,
}

impl RecordPath {
    /// The name `list_queues` and statistics show.
    pub fn name(self) -> &'static str {
        match self {
            RecordPath::User => "tls1.3-user",
            RecordPath::Kernel => "tls1.3-kernel",
        }
    }
}

/// Whether a connection may hand its records to the kernel (`tls_offload`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Offload {
    /// Where the kernel takes the keys (else user space, said once in the log).
    #[default]
    Auto,
    /// Always in user space.
    Off,
}

impl Offload {
    /// From its configuration name (`auto` or `off`).
    pub fn parse(s: &str) -> Option<Offload> {
        match s {
            "auto" => Some(Offload::Auto),
            "off" => Some(Offload::Off),
            _ => None,
        }
    }

    /// Its configuration name.
    pub fn name(self) -> &'static str {
        match self {
            Offload::Auto => "auto",
            Offload::Off => "off",
        }
    }
}

/// Whether this kernel offers kernel TLS now: `tls` among the available TCP upper-layer
/// protocols (`/proc/sys/net/ipv4/tcp_available_ulp`; it appears once the module is loaded).
pub fn ktls_available() -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp")
        .is_ok_and(|s| s.split_whitespace().any(|u| u == "tls"))
}

/// One line for the start-up log: what the kernel offers and what qpath uses.
pub fn describe(offload: Offload) -> String {
    match (offload, ktls_available()) {
        (Offload::Off, _) => {
            "kernel TLS is turned off (tls_offload = \"off\"): records are protected in user space".to_string()
        }
        (Offload::Auto, true) => {
            "kernel TLS is available: TLS connections hand their records to the kernel after the handshake \
             (unless tls_offload is \"off\")"
                .to_string()
        }
        (Offload::Auto, false) => "kernel TLS is not available (no \"tls\" TCP ULP; `modprobe tls` loads it): \
             records are protected in user space"
            .to_string(),
    }
}

// include/uapi/linux/tls.h. The libc crate has the constants and the structures; the
// structures are built here as bytes (no transmute), checked against libc's layout.
const TLS_1_3_VERSION: u16 = libc::TLS_1_3_VERSION;
const CIPHER_AES_GCM_128: u16 = libc::TLS_CIPHER_AES_GCM_128;
const CIPHER_AES_GCM_256: u16 = libc::TLS_CIPHER_AES_GCM_256;
/// `struct tls_crypto_info`: version, cipher_type (host order).
const INFO_LEN: usize = 4;
/// Bytes of `iv` (the 12-byte IV's last 8), `salt` (its first 4) and `rec_seq` (big-endian).
const IV_LEN: usize = 8;
const SALT_LEN: usize = 4;
const SEQ_LEN: usize = 8;
/// The largest structure: `tls12_crypto_info_aes_gcm_256`.
const CRYPTO_INFO_MAX: usize = INFO_LEN + IV_LEN + 32 + SALT_LEN + SEQ_LEN;
const _: () = assert!(size_of::<libc::tls12_crypto_info_aes_gcm_128>() == INFO_LEN + IV_LEN + 16 + SALT_LEN + SEQ_LEN);
const _: () = assert!(size_of::<libc::tls12_crypto_info_aes_gcm_256>() == CRYPTO_INFO_MAX);

/// One direction's `struct tls12_crypto_info_aes_gcm_128` or `_256`, as the kernel reads it
/// from `setsockopt(SOL_TLS, TLS_TX | TLS_RX)`. Holds key material: wiped when dropped,
/// never printed.
pub struct CryptoInfo {
    bytes: Zeroizing<[u8; CRYPTO_INFO_MAX]>,
    len: usize,
}

impl std::fmt::Debug for CryptoInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CryptoInfo").field("len", &self.len).finish_non_exhaustive()
    }
}

impl CryptoInfo {
    /// The structure for `keys` as they stand: their key, their IV split into salt (first 4
    /// bytes) and iv (last 8), and the sequence number of the next record they would protect
    /// (Linux `tls.rst`: `rec_seq` is the next record's; TLS 1.3 builds the nonce as
    /// RFC 8446 §5.3 does, from salt || iv).
    pub fn new(keys: &Keys) -> CryptoInfo {
        let (key, iv) = keys.key_and_iv();
        let cipher = match keys.suite() {
            Suite::Aes128GcmSha256 => CIPHER_AES_GCM_128,
            Suite::Aes256GcmSha384 => CIPHER_AES_GCM_256,
        };
        let mut bytes = Zeroizing::new([0u8; CRYPTO_INFO_MAX]);
        bytes[..2].copy_from_slice(&TLS_1_3_VERSION.to_ne_bytes());
        bytes[2..4].copy_from_slice(&cipher.to_ne_bytes());
        let mut at = INFO_LEN;
        let seq = keys.seq().to_be_bytes();
        for part in [&iv[SALT_LEN..], &key[..], &iv[..SALT_LEN], &seq[..]] {
            bytes[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        debug_assert_eq!(at, INFO_LEN + IV_LEN + key.len() + SALT_LEN + SEQ_LEN, "the structure's fields");
        CryptoInfo { bytes, len: at }
    }

    /// The structure's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// What the kernel needs to take a connection's records over: both directions' structures.
#[derive(Debug)]
pub struct Handover {
    /// The keys of the records this end sends (`TLS_TX`).
    pub tx: CryptoInfo,
    /// The keys of the records this end receives (`TLS_RX`).
    pub rx: CryptoInfo,
}

/// Why the kernel did not take a connection's records.
#[derive(Debug)]
pub enum InstallError {
    /// Nothing was changed on the socket (the kernel has no `tls` ULP, or refused the
    /// cipher): the records stay in user space.
    NotTaken(std::io::Error),
    /// The kernel took the sending keys but refused the receiving ones: the socket can
    /// serve neither path any more and the connection must close.
    Half(std::io::Error),
}

impl InstallError {
    /// Whether the socket was left as it was (user-space records still work).
    pub fn untouched(&self) -> bool {
        matches!(self, InstallError::NotTaken(_))
    }

    /// Whether the kernel simply has no kernel TLS (ENOENT on the ULP).
    pub fn no_ulp(&self) -> bool {
        matches!(self, InstallError::NotTaken(e) if e.raw_os_error() == Some(libc::ENOENT))
    }
}

impl std::fmt::Display for InstallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InstallError::NotTaken(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                write!(f, "the kernel has no \"tls\" TCP ULP (`modprobe tls` loads it)")
            }
            InstallError::NotTaken(e) => write!(f, "the kernel refused the TLS keys: {e}"),
            InstallError::Half(e) => {
                write!(f, "the kernel took the sending keys but refused the receiving ones: {e}")
            }
        }
    }
}

/// Whether a receive on a kernel-TLS socket failed because a TLS control record arrived
/// (an alert, a KeyUpdate): Linux hands those only to a `recvmsg` that asks for the record
/// type (`TLS_GET_RECORD_TYPE`), and fails a plain receive with EIO (`tls.rst`).
pub fn control_record(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::EIO)
}

/// Hands `h` to the kernel on the connected TCP socket `fd`: the `tls` ULP, then the sending
/// keys, then the receiving ones. The caller has no send or receive in flight on `fd` and
/// every byte received so far opened (a [`crate::Channel::kernel_handover`] guarantees the
/// latter).
pub fn install(fd: BorrowedFd<'_>, h: &Handover) -> Result<(), InstallError> {
    let fd = fd.as_raw_fd();
    // An unknown ULP fails with ENOENT and changes nothing. A ULP set without keys leaves
    // the socket as it was (TLS_BASE both ways: plain TCP, Linux net/tls/tls_main.c), so a
    // refused TX key is a fallback too.
    sys::setsockopt(fd, libc::SOL_TCP, libc::TCP_ULP, b"tls").map_err(InstallError::NotTaken)?;
    sys::setsockopt(fd, libc::SOL_TLS, libc::TLS_TX, h.tx.as_bytes()).map_err(InstallError::NotTaken)?;
    sys::setsockopt(fd, libc::SOL_TLS, libc::TLS_RX, h.rx.as_bytes()).map_err(InstallError::Half)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::mem::offset_of;

    use libc::{tls12_crypto_info_aes_gcm_128 as Gcm128, tls12_crypto_info_aes_gcm_256 as Gcm256};
    use openssl::symm::{Cipher, decrypt_aead};

    use super::*;
    use crate::record::{self, Dir, content};

    /// The pieces of a structure, read at libc's offsets: (version, cipher, iv, key, salt, seq).
    fn fields(b: &[u8], suite: Suite) -> (u16, u16, Vec<u8>, Vec<u8>, Vec<u8>, u64) {
        let (iv, key, salt, seq, size) = match suite {
            Suite::Aes128GcmSha256 => (
                offset_of!(Gcm128, iv),
                offset_of!(Gcm128, key),
                offset_of!(Gcm128, salt),
                offset_of!(Gcm128, rec_seq),
                size_of::<Gcm128>(),
            ),
            Suite::Aes256GcmSha384 => (
                offset_of!(Gcm256, iv),
                offset_of!(Gcm256, key),
                offset_of!(Gcm256, salt),
                offset_of!(Gcm256, rec_seq),
                size_of::<Gcm256>(),
            ),
        };
        assert_eq!(b.len(), size, "the structure's whole size");
        let version = u16::from_ne_bytes([b[0], b[1]]);
        let cipher = u16::from_ne_bytes([b[2], b[3]]);
        (
            version,
            cipher,
            b[iv..key].to_vec(),
            b[key..salt].to_vec(),
            b[salt..seq].to_vec(),
            u64::from_be_bytes(b[seq..seq + 8].try_into().unwrap()),
        )
    }

    /// The kernel's view of the keys opens what the user-space record layer sealed with the
    /// same traffic secret, at the sequence number the structure names: key, salt, iv and
    /// rec_seq are the ones RFC 8446 §7.3 and §5.3 make of the secret.
    #[test]
    fn crypto_info_opens_user_space_records_at_its_sequence() {
        for (suite, secret_len, cipher, cipher_id) in [
            (Suite::Aes128GcmSha256, 32, Cipher::aes_128_gcm(), libc::TLS_CIPHER_AES_GCM_128),
            (Suite::Aes256GcmSha384, 48, Cipher::aes_256_gcm(), libc::TLS_CIPHER_AES_GCM_256),
        ] {
            let secret: Vec<u8> = (0..secret_len).map(|i: u8| i.wrapping_mul(7).wrapping_add(3)).collect();
            let mut seal = Keys::new(suite, Dir::Seal, &secret).unwrap();
            // Three records go out from user space first (as the Finished's companions do).
            let mut wire = Vec::new();
            for i in 0..3u8 {
                record::seal_bytes(&mut seal, content::APPLICATION_DATA, &[i; 10], &mut wire).unwrap();
            }
            let info = CryptoInfo::new(&seal);
            let (version, cid, iv, key, salt, seq) = fields(info.as_bytes(), suite);
            assert_eq!(version, 0x0304, "TLS_1_3_VERSION");
            assert_eq!(cid, cipher_id);
            assert_eq!(seq, 3, "the next record's sequence number");
            // The next record, sealed by the user-space layer, opened with the structure's
            // fields alone, as the kernel does.
            let mut rec = Vec::new();
            record::seal_bytes(&mut seal, content::APPLICATION_DATA, b"first kernel record", &mut rec).unwrap();
            let mut nonce = salt.clone();
            nonce.extend_from_slice(&iv);
            for (n, s) in nonce[4..].iter_mut().zip(seq.to_be_bytes()) {
                *n ^= s;
            }
            let (aad, body) = rec.split_at(record::HEADER_LEN);
            let (ct, tag) = body.split_at(body.len() - record::TAG_LEN);
            let plain = decrypt_aead(cipher, &key, Some(&nonce), aad, ct, tag).expect("the kernel's keys open it");
            assert_eq!(&plain[..plain.len() - 1], b"first kernel record");
            assert_eq!(plain[plain.len() - 1], content::APPLICATION_DATA);
            // Salt and iv are the IV's first 4 and last 8 bytes, the key the suite's length.
            let (k, full_iv) = seal.key_and_iv();
            assert_eq!(key, *k);
            assert_eq!((salt.as_slice(), iv.as_slice()), (&full_iv[..4], &full_iv[4..]));
        }
    }

    #[test]
    fn record_paths_and_offload_modes_have_their_names() {
        assert_eq!(RecordPath::User.name(), "tls1.3-user");
        assert_eq!(RecordPath::Kernel.name(), "tls1.3-kernel");
        for o in [Offload::Auto, Offload::Off] {
            assert_eq!(Offload::parse(o.name()), Some(o));
        }
        assert_eq!(Offload::parse("on"), None);
        assert!(describe(Offload::Off).contains("turned off"));
    }

    /// On a TCP connection the kernel takes the keys where it has the `tls` ULP and refuses
    /// with ENOENT, leaving the socket as it was, where it has not.
    #[test]
    fn install_on_tcp_takes_the_keys_or_says_no_ulp() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_s, _) = l.accept().unwrap();
        let secret = [6u8; 32];
        let k = |d| Keys::new(Suite::Aes128GcmSha256, d, &secret).unwrap();
        let h = Handover { tx: CryptoInfo::new(&k(Dir::Seal)), rx: CryptoInfo::new(&k(Dir::Open)) };
        match install(std::os::fd::AsFd::as_fd(&c), &h) {
            Ok(()) => assert!(ktls_available(), "installed: the ULP is listed"),
            Err(e) => {
                assert!(e.no_ulp() && !ktls_available(), "{e}");
                println!("SKIP: the kernel path itself (no \"tls\" TCP ULP here): {e}");
            }
        }
    }

    /// On a socket that is not TCP the ULP is refused and nothing else is tried; the error
    /// leaves the socket untouched (the connection would keep its user-space records).
    #[test]
    fn install_on_a_socket_without_the_ulp_is_a_fallback() {
        let secret = [5u8; 32];
        let k = |d| Keys::new(Suite::Aes128GcmSha256, d, &secret).unwrap();
        let h = Handover { tx: CryptoInfo::new(&k(Dir::Seal)), rx: CryptoInfo::new(&k(Dir::Open)) };
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let e = install(std::os::fd::AsFd::as_fd(&a), &h).unwrap_err();
        assert!(e.untouched(), "{e}");
        let text = format!("{e} {e:?} {h:?}");
        assert!(!text.contains("05050505"), "no key material in text");
    }
}
