//! Little-endian field access on fixed-size wire structures.
//!
//! Every NVMe structure is little-endian (NVMe 2.0 §1.4.2). The helpers here
//! never panic: reads outside the slice return 0 and writes outside it are
//! dropped, so a caller that got an offset wrong produces a wrong value in a
//! test, never a crash on the wire path. Structures are sized by the caller,
//! and their sizes are checked at compile time where they are declared.

#[inline]
pub(crate) fn get_u8(b: &[u8], off: usize) -> u8 {
    b.get(off).copied().unwrap_or(0)
}

#[inline]
pub(crate) fn get_u16(b: &[u8], off: usize) -> u16 {
    match b.get(off..off + 2) {
        Some(s) => u16::from_le_bytes([s[0], s[1]]),
        None => 0,
    }
}

#[inline]
pub(crate) fn get_u32(b: &[u8], off: usize) -> u32 {
    match b.get(off..off + 4) {
        Some(s) => u32::from_le_bytes([s[0], s[1], s[2], s[3]]),
        None => 0,
    }
}

#[inline]
pub(crate) fn get_u64(b: &[u8], off: usize) -> u64 {
    match b.get(off..off + 8) {
        Some(s) => u64::from_le_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]),
        None => 0,
    }
}

#[inline]
pub(crate) fn put_u8(b: &mut [u8], off: usize, v: u8) {
    if let Some(x) = b.get_mut(off) {
        *x = v;
    }
}

#[inline]
pub(crate) fn put_u16(b: &mut [u8], off: usize, v: u16) {
    if let Some(s) = b.get_mut(off..off + 2) {
        s.copy_from_slice(&v.to_le_bytes());
    }
}

#[inline]
pub(crate) fn put_u32(b: &mut [u8], off: usize, v: u32) {
    if let Some(s) = b.get_mut(off..off + 4) {
        s.copy_from_slice(&v.to_le_bytes());
    }
}

#[inline]
pub(crate) fn put_u64(b: &mut [u8], off: usize, v: u64) {
    if let Some(s) = b.get_mut(off..off + 8) {
        s.copy_from_slice(&v.to_le_bytes());
    }
}

/// Copies `src` into `b[off..off+len]`, truncated to `len`, padding the rest with `pad`.
pub(crate) fn put_str(b: &mut [u8], off: usize, len: usize, src: &[u8], pad: u8) {
    if let Some(dst) = b.get_mut(off..off + len) {
        let n = src.len().min(len);
        dst[..n].copy_from_slice(&src[..n]);
        dst[n..].fill(pad);
    }
}

/// Reads a fixed-size string field: stops at the first NUL and trims trailing spaces.
pub(crate) fn get_str(b: &[u8], off: usize, len: usize) -> String {
    let field = b.get(off..off + len).unwrap_or(&[]);
    let end = field.iter().position(|&c| c == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).trim_end().to_string()
}

/// A length known to fit, as u32 (checked in const contexts, saturating otherwise).
#[allow(clippy::cast_possible_truncation)]
pub(crate) const fn len_u32(v: usize) -> u32 {
    if v > u32::MAX as usize { u32::MAX } else { v as u32 }
}

/// A length known to fit, as u16 (saturating).
#[allow(clippy::cast_possible_truncation)]
pub(crate) const fn len_u16(v: usize) -> u16 {
    if v > u16::MAX as usize { u16::MAX } else { v as u16 }
}

/// A length known to fit, as u8 (saturating).
#[allow(clippy::cast_possible_truncation)]
pub(crate) const fn len_u8(v: usize) -> u8 {
    if v > u8::MAX as usize { u8::MAX } else { v as u8 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_is_harmless() {
        let mut b = [0u8; 4];
        assert_eq!(get_u64(&b, 0), 0);
        assert_eq!(get_u32(&b, 1), 0);
        put_u64(&mut b, 0, u64::MAX);
        assert_eq!(b, [0; 4]);
        put_u16(&mut b, 2, 0xabcd);
        assert_eq!(get_u16(&b, 2), 0xabcd);
    }

    #[test]
    fn strings_pad_and_trim() {
        let mut b = [0u8; 8];
        put_str(&mut b, 0, 8, b"abc", b' ');
        assert_eq!(&b, b"abc     ");
        assert_eq!(get_str(&b, 0, 8), "abc");
        put_str(&mut b, 0, 8, b"nqn", 0);
        assert_eq!(get_str(&b, 0, 8), "nqn");
    }
}
