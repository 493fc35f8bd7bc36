//! The handshake's calls into OpenSSL's C API (with `kernel/sys.rs`, the crate's only
//! `unsafe` code): TLS 1.3 external PSKs carried in an `SSL_SESSION`, through OpenSSL's
//! session PSK callbacks.
//!
//! Why not the `openssl` crate's PSK callbacks: they are OpenSSL's "legacy" ones
//! (`SSL_CTX_set_psk_client_callback`), which in TLS 1.3 make every PSK a SHA-256 one
//! (OpenSSL builds its session with `TLS_AES_128_GCM_SHA256`), so a key of hash 02 could
//! not be used. The session callbacks take a session whose cipher suite names the PSK's
//! hash: `TLS_AES_128_GCM_SHA256` or `TLS_AES_256_GCM_SHA384`. Neither the callbacks nor the
//! session setters are declared by `openssl-sys`; they are declared here, as OpenSSL 1.1.1+
//! documents them (`SSL_CTX_set_psk_use_session_callback(3)`,
//! `SSL_CTX_set_psk_find_session_callback(3)`, `SSL_SESSION_set1_master_key(3)`,
//! `SSL_SESSION_set_cipher(3)`, `SSL_SESSION_set_protocol_version(3)`, `SSL_CIPHER_find(3)`),
//! and resolved from the libssl `openssl-sys` links.
//!
//! ```text
//!   client  use_session(ssl, md, &id, &idlen, &sess)    once per ClientHello: identity + session
//!   server  find_session(ssl, identity, len, &sess)     once per offered identity: session or none
//!   session SSL_SESSION_new; set1_master_key(TLS PSK); set_cipher(0x1301 | 0x1302); TLS 1.3
//! ```
//!
//! What to offer and whom to accept is decided in `handshake.rs`, in safe code; the
//! callbacks here only move pointers across.

use std::ffi::{c_int, c_uchar, c_uint};
use std::mem::ManuallyDrop;

use foreign_types::{ForeignType, ForeignTypeRef};
use openssl::error::ErrorStack;
use openssl::ssl::{SslContextBuilder, SslRef, SslSession};
use openssl_sys::{EVP_MD, SSL, SSL_CIPHER, SSL_CTX, SSL_SESSION};

use crate::record::Suite;

/// `SSL_psk_use_session_cb_func`.
type UseSessionCb = unsafe extern "C" fn(
    ssl: *mut SSL,
    md: *const EVP_MD,
    id: *mut *const c_uchar,
    idlen: *mut usize,
    sess: *mut *mut SSL_SESSION,
) -> c_int;

/// `SSL_psk_find_session_cb_func`.
type FindSessionCb = unsafe extern "C" fn(
    ssl: *mut SSL,
    identity: *const c_uchar,
    identity_len: usize,
    sess: *mut *mut SSL_SESSION,
) -> c_int;

// SAFETY: these are OpenSSL 1.1.1+'s declarations in <openssl/ssl.h>, with C types spelled as
// `openssl-sys` spells them (`size_t` is `usize`); the symbols are in the libssl that
// `openssl-sys` links (OpenSSL 1.1.1 or 3.x: TLS 1.3 needs either).
unsafe extern "C" {
    fn SSL_CTX_set_psk_use_session_callback(ctx: *mut SSL_CTX, cb: Option<UseSessionCb>);
    fn SSL_CTX_set_psk_find_session_callback(ctx: *mut SSL_CTX, cb: Option<FindSessionCb>);
    fn SSL_SESSION_new() -> *mut SSL_SESSION;
    fn SSL_SESSION_set1_master_key(sess: *mut SSL_SESSION, key: *const c_uchar, len: usize) -> c_int;
    fn SSL_SESSION_set_cipher(sess: *mut SSL_SESSION, cipher: *const SSL_CIPHER) -> c_int;
    fn SSL_SESSION_set_protocol_version(sess: *mut SSL_SESSION, version: c_int) -> c_int;
    fn SSL_CIPHER_find(ssl: *mut SSL, ptr: *const c_uchar) -> *const SSL_CIPHER;
    #[cfg(test)]
    fn SSL_SESSION_get0_cipher(sess: *const SSL_SESSION) -> *const SSL_CIPHER;
}

/// The two-byte id of a session's cipher suite (tests of [`psk_session`]).
#[cfg(test)]
pub(super) fn cipher_id(session: &openssl::ssl::SslSessionRef) -> Option<[u8; 2]> {
    // SAFETY: a valid session; the cipher returned is static or NULL.
    let c = unsafe { SSL_SESSION_get0_cipher(session.as_ptr()) };
    // SAFETY: a non-NULL cipher of the library.
    (!c.is_null()).then(|| unsafe { openssl_sys::SSL_CIPHER_get_protocol_id(c) }.to_be_bytes())
}

/// The pre_shared_key extension's type (RFC 8446 §4.2).
const EXT_PRE_SHARED_KEY: c_uint = 41;

/// A TLS 1.3 session that carries `psk` as an external PSK for `suite` (RFC 8446 §4.2.11;
/// `SSL_CTX_set_psk_use_session_callback(3)`: a master key, a cipher suite, the version).
pub(super) fn psk_session(ssl: &SslRef, suite: Suite, psk: &[u8]) -> Result<SslSession, ErrorStack> {
    // SAFETY: `SSL_SESSION_new` returns a new session or NULL; ownership of a non-NULL one
    // goes to the `SslSession`, which frees it once (here on an error, else its holder).
    let session = unsafe {
        let p = SSL_SESSION_new();
        if p.is_null() {
            return Err(ErrorStack::get());
        }
        SslSession::from_ptr(p)
    };
    // SAFETY: `session` is a valid session; OpenSSL copies the `psk.len()` bytes it reads.
    if unsafe { SSL_SESSION_set1_master_key(session.as_ptr(), psk.as_ptr(), psk.len()) } != 1 {
        return Err(ErrorStack::get());
    }
    let id = suite.id();
    // SAFETY: `ssl` is a valid connection; `SSL_CIPHER_find` reads the two bytes of `id` and
    // returns a static cipher of the library or NULL, and changes nothing in `ssl`.
    let cipher = unsafe { SSL_CIPHER_find(ssl.as_ptr(), id.as_ptr()) };
    if cipher.is_null() {
        return Err(ErrorStack::get());
    }
    // SAFETY: a valid session and a cipher of the library (static, never freed).
    if unsafe { SSL_SESSION_set_cipher(session.as_ptr(), cipher) } != 1 {
        return Err(ErrorStack::get());
    }
    // SAFETY: a valid session; TLS1_3_VERSION is a version OpenSSL knows.
    if unsafe { SSL_SESSION_set_protocol_version(session.as_ptr(), openssl_sys::TLS1_3_VERSION) } != 1 {
        return Err(ErrorStack::get());
    }
    Ok(session)
}

/// What a client offers for its connection: the identity's bytes and a session with the PSK.
pub(super) struct Offer {
    /// Start of the identity's bytes, which must stay where they are until the handshake
    /// ends (the connection's state holds them; OpenSSL copies them anyway).
    pub(super) identity: *const u8,
    pub(super) identity_len: usize,
    pub(super) session: SslSession,
}

/// Installs the client's callback, which offers what `super::client_offer` gives.
pub(super) fn set_client_callback(b: &mut SslContextBuilder) {
    // SAFETY: a valid context under construction; the callback is a plain function.
    unsafe { SSL_CTX_set_psk_use_session_callback(b.as_ptr(), Some(use_session)) }
}

/// Installs the server's callback, which takes what `super::server_find` finds.
pub(super) fn set_server_callback(b: &mut SslContextBuilder) {
    // SAFETY: a valid context under construction; the callback is a plain function.
    unsafe { SSL_CTX_set_psk_find_session_callback(b.as_ptr(), Some(find_session)) }
}

/// `SSL_psk_use_session_cb_func`: returns 1 with the identity and a new session whose
/// ownership passes to OpenSSL (each call makes a new one: after a HelloRetryRequest it is
/// called again), 0 to fail the handshake.
unsafe extern "C" fn use_session(
    ssl: *mut SSL,
    _md: *const EVP_MD,
    id: *mut *const c_uchar,
    idlen: *mut usize,
    sess: *mut *mut SSL_SESSION,
) -> c_int {
    // SAFETY: OpenSSL calls this with the connection it is handshaking, valid for the call.
    let ssl = unsafe { SslRef::from_ptr(ssl) };
    let Ok(Some(o)) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| super::client_offer(ssl))) else {
        return 0;
    };
    let session = ManuallyDrop::new(o.session);
    // SAFETY: OpenSSL passes writable out-pointers; the identity's bytes outlive the
    // handshake (see `Offer`), and the session's one reference goes to OpenSSL, which frees
    // it (`ManuallyDrop`: not freed here).
    unsafe {
        *id = o.identity;
        *idlen = o.identity_len;
        *sess = session.as_ptr();
    }
    1
}

/// `SSL_psk_find_session_cb_func`: returns 1 with a new session (ownership to OpenSSL) or
/// with NULL (no key for this identity).
unsafe extern "C" fn find_session(
    ssl: *mut SSL,
    identity: *const c_uchar,
    identity_len: usize,
    sess: *mut *mut SSL_SESSION,
) -> c_int {
    // SAFETY: OpenSSL passes a writable out-pointer.
    unsafe { *sess = std::ptr::null_mut() };
    // SAFETY: OpenSSL calls this with the connection it is handshaking, valid for the call.
    let ssl = unsafe { SslRef::from_ptr(ssl) };
    let bytes: &[u8] = if identity.is_null() || identity_len == 0 {
        &[]
    } else {
        // SAFETY: OpenSSL passes the identity's `identity_len` bytes from the ClientHello,
        // readable for the call; nothing here keeps them.
        unsafe { std::slice::from_raw_parts(identity, identity_len) }
    };
    let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| super::server_find(ssl, bytes)));
    if let Ok(Some(session)) = found {
        let session = ManuallyDrop::new(session);
        // SAFETY: the out-pointer is writable; the session's one reference goes to OpenSSL.
        unsafe { *sess = session.as_ptr() };
    }
    1
}

/// The identities of a ClientHello's pre_shared_key extension, in the client's order (the
/// client-hello callback's view, before the server picks its cipher suite). Bytes from the
/// wire: every length is checked against what is there.
pub(super) fn client_hello_identities(ssl: &SslRef) -> Vec<Vec<u8>> {
    let mut out: *const c_uchar = std::ptr::null();
    let mut len: usize = 0;
    // SAFETY: `ssl` is in its client-hello callback (the only caller), where OpenSSL keeps
    // the ClientHello's extensions; it writes a pointer to the extension's body and its length.
    let found = unsafe { openssl_sys::SSL_client_hello_get0_ext(ssl.as_ptr(), EXT_PRE_SHARED_KEY, &mut out, &mut len) };
    if found != 1 || out.is_null() {
        return Vec::new();
    }
    // SAFETY: OpenSSL's pointer and length of the extension's body, valid during the callback.
    let ext = unsafe { std::slice::from_raw_parts(out, len) };
    offered_identities(ext).map(<[u8]>::to_vec).collect()
}

/// The most identities a ClientHello is read for (a client offers one or two: its
/// configured key's and a retained one's).
pub(super) const IDENTITIES_MAX: usize = 16;

/// `OfferedPsks.identities[i].identity` (RFC 8446 §4.2.11): `be16 identities length ||
/// (be16 identity length || identity || be32 obfuscated_ticket_age)...`. Stops at the first
/// entry whose lengths do not fit, skips empty identities, yields at most `IDENTITIES_MAX`.
pub(super) fn offered_identities(ext: &[u8]) -> impl Iterator<Item = &[u8]> {
    let list = ext.get(..2).and_then(|b| ext.get(2..2 + usize::from(u16::from_be_bytes([b[0], b[1]])))).unwrap_or(&[]);
    let mut rest = list;
    std::iter::from_fn(move || {
        let id_len = usize::from(u16::from_be_bytes(rest.get(..2)?.try_into().ok()?));
        let id = rest.get(2..2 + id_len)?;
        rest.get(2 + id_len..2 + id_len + 4)?;
        rest = &rest[2 + id_len + 4..];
        Some(id)
    })
    .filter(|id| !id.is_empty())
    .take(IDENTITIES_MAX)
}
