//! [`Gcm`]: one direction's AES-GCM context, and the record layer's only calls into
//! OpenSSL's C API (the crate's one module with `unsafe` code; every other access goes
//! through the `openssl` crate's safe wrappers).
//!
//! Why not the wrappers here:
//! - the nonce: `EVP_CipherInit_ex` with only an IV. The checked wrapper first asks the
//!   context for its IV length, which OpenSSL 3 answers through its parameter tables (a
//!   string-compared lookup) on every record; a [`Gcm`] is AES-GCM by construction, whose
//!   IV is the 12 bytes given.
//! - encrypting straight out of a shared region: the region's bytes may be stored to by
//!   another reactor at any time, so no Rust reference to them may exist; OpenSSL reads them
//!   through a raw pointer, as the kernel does when it sends from the region
//!   (`uring::SharedRegion::lend_for_read`). Without this the bytes were copied out of the
//!   region first (word by word) and encrypted in place: two passes instead of one.

use foreign_types::ForeignTypeRef;
use openssl::cipher::CipherRef;
use openssl::cipher_ctx::CipherCtx;
use openssl::error::ErrorStack;
use uring::SharedRegion;

/// An AES-GCM cipher context that seals or opens (fixed at construction).
pub(crate) struct Gcm {
    ctx: CipherCtx,
    /// 1 to encrypt, 0 to decrypt (`EVP_CipherInit_ex`'s `enc`).
    enc: std::ffi::c_int,
}

/// Length of a GCM nonce (RFC 8446 §5.3: `iv_length` is 12 for both suites).
pub(crate) const NONCE_LEN: usize = 12;

impl Gcm {
    /// A context for `cipher`, which must be AES-128-GCM or AES-256-GCM (the only two
    /// callers pass `Cipher::aes_128_gcm()` / `aes_256_gcm()`; checked: IV length 12 and
    /// block size 1, a stream mode).
    pub(crate) fn new(cipher: &'static CipherRef, seal: bool) -> Result<Gcm, ErrorStack> {
        assert!(
            cipher.iv_length() == NONCE_LEN && cipher.block_size() == 1,
            "an AES-GCM context is made only for an AEAD stream cipher with a 12-byte IV"
        );
        let mut ctx = CipherCtx::new()?;
        if seal {
            ctx.encrypt_init(Some(cipher), None, None)?;
        } else {
            ctx.decrypt_init(Some(cipher), None, None)?;
        }
        Ok(Gcm { ctx, enc: std::ffi::c_int::from(seal) })
    }

    /// Installs a key (its length must be the cipher's).
    pub(crate) fn set_key(&mut self, key: &[u8]) -> Result<(), ErrorStack> {
        if self.enc == 1 {
            self.ctx.encrypt_init(None, Some(key), None)
        } else {
            self.ctx.decrypt_init(None, Some(key), None)
        }
    }

    /// Starts a record: its nonce, then its additional data.
    pub(crate) fn begin(&mut self, nonce: &[u8; NONCE_LEN], aad: &[u8]) -> Result<(), ErrorStack> {
        // SAFETY: the context holds an AES-GCM cipher (the constructor's check) whose IV
        // length is 12, so OpenSSL reads exactly the 12 bytes of `nonce`; no cipher and no
        // key are passed, which keeps both.
        let rc = unsafe {
            openssl_sys::EVP_CipherInit_ex(
                self.ctx.as_ptr(),
                std::ptr::null(),
                std::ptr::null_mut(),
                std::ptr::null(),
                nonce.as_ptr(),
                self.enc,
            )
        };
        if rc != 1 {
            return Err(ErrorStack::get());
        }
        self.ctx.cipher_update(aad, None)?;
        Ok(())
    }

    /// Encrypts (decrypts) `src` into `dst`, of the same length.
    pub(crate) fn update(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), ErrorStack> {
        assert_eq!(src.len(), dst.len(), "GCM writes as many bytes as it reads");
        // SAFETY: `src` is readable and `dst` writable for their common length, and a `&`
        // and a `&mut` never overlap.
        unsafe { self.update_raw(src.as_ptr(), dst.as_mut_ptr(), src.len()) }
    }

    /// Encrypts (decrypts) `buf` in place.
    pub(crate) fn update_in_place(&mut self, buf: &mut [u8]) -> Result<(), ErrorStack> {
        let p = buf.as_mut_ptr();
        // SAFETY: `buf` is readable and writable for its length; OpenSSL's GCM allows the
        // output to be exactly the input (in place).
        unsafe { self.update_raw(p, p, buf.len()) }
    }

    /// Encrypts `dst.len()` bytes of `region` from `offset` into `dst`.
    pub(crate) fn update_from_region(
        &mut self,
        region: &SharedRegion,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), RegionError> {
        let src = region.lend_for_read(offset, dst.len()).map_err(RegionError::Region)?;
        // SAFETY: `lend_for_read` checked `offset..offset + dst.len()` against the region,
        // whose mapping outlives this call (`region` is borrowed); `dst` is a `&mut` to other
        // memory (no Rust reference to region memory can exist), so the two do not
        // overlap. Only OpenSSL reads the region's bytes, through the raw pointer.
        unsafe { self.update_raw(src, dst.as_mut_ptr(), dst.len()) }.map_err(RegionError::Cipher)
    }

    /// # Safety
    /// `src` must be readable and `dst` writable for `len` bytes; they must not overlap,
    /// unless they are equal.
    unsafe fn update_raw(&mut self, src: *const u8, dst: *mut u8, len: usize) -> Result<(), ErrorStack> {
        let Ok(inl) = std::ffi::c_int::try_from(len) else {
            panic!("a record's content is at most 2^14 bytes, not {len}");
        };
        let mut outl: std::ffi::c_int = 0;
        // SAFETY: the caller's contract for `src` and `dst`; the context holds a keyed
        // AES-GCM cipher with a nonce set, a stream mode that writes exactly `len` bytes.
        let rc = unsafe { openssl_sys::EVP_CipherUpdate(self.ctx.as_ptr(), dst, &mut outl, src, inl) };
        if rc != 1 {
            return Err(ErrorStack::get());
        }
        debug_assert_eq!(outl, inl, "GCM is a stream mode");
        Ok(())
    }

    /// Ends a sealed record: its tag.
    pub(crate) fn seal_tag(&mut self, tag: &mut [u8]) -> Result<(), ErrorStack> {
        self.ctx.cipher_final(&mut [])?;
        self.ctx.tag(tag)
    }

    /// The tag an opened record must match (before [`Gcm::open_final`]).
    pub(crate) fn set_tag(&mut self, tag: &[u8]) -> Result<(), ErrorStack> {
        self.ctx.set_tag(tag)
    }

    /// Ends an opened record: whether its tag matched.
    pub(crate) fn open_final(&mut self) -> bool {
        self.ctx.cipher_final(&mut []).is_ok()
    }
}

/// Why encrypting from a region failed.
#[derive(Debug)]
pub(crate) enum RegionError {
    /// The range is outside the region.
    Region(uring::Error),
    /// OpenSSL failed.
    Cipher(ErrorStack),
}
