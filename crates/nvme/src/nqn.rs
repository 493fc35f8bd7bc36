//! NVMe Qualified Names (NVMe 2.0 §4.5).

/// The well-known discovery subsystem NQN.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// Why a string is not a usable NQN.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NqnError {
    /// Empty.
    #[error("NQN is empty")]
    Empty,
    /// Longer than 223 bytes.
    #[error("NQN is longer than 223 bytes")]
    TooLong,
    /// Does not start with "nqn.".
    #[error("NQN does not start with \"nqn.\"")]
    BadPrefix,
    /// Contains a NUL or a non-printable character.
    #[error("NQN contains a non-printable character")]
    BadChar,
}

/// Checks an NQN as qpath accepts it: "nqn." prefix, 1..=223 printable UTF-8 bytes.
/// (The spec's date/domain syntax is not enforced: Linux does not enforce it either.)
pub fn validate(nqn: &str) -> Result<(), NqnError> {
    if nqn.is_empty() {
        return Err(NqnError::Empty);
    }
    if nqn.len() > crate::fabrics::NQN_MAX_LEN {
        return Err(NqnError::TooLong);
    }
    if !nqn.starts_with("nqn.") {
        return Err(NqnError::BadPrefix);
    }
    if nqn.chars().any(|c| c.is_control()) {
        return Err(NqnError::BadChar);
    }
    Ok(())
}

/// A host NQN in the UUID form Linux generates (`nqn.2014-08.org.nvmexpress:uuid:<uuid>`).
pub fn uuid_hostnqn(uuid: &[u8; 16]) -> String {
    format!("nqn.2014-08.org.nvmexpress:uuid:{}", format_uuid(uuid))
}

/// Formats 16 bytes as an RFC 4122 UUID string.
pub fn format_uuid(u: &[u8; 16]) -> String {
    let h = hex(u);
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// Bytes as lowercase hex digits, two per byte, no separators (Host Identifiers, NGUIDs).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// 16 bytes from a UUID or Host Identifier as written (`/etc/nvme/hostid`, nvme-cli's
/// `--hostid`, a config's `uuid`, `/etc/machine-id`): exactly 32 hex digits, dashes
/// anywhere between them ignored, nothing else.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let digits: Vec<u8> = s.bytes().filter(|&c| c != b'-').collect();
    if digits.len() != 32 || !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let mut u = [0u8; 16];
    for (b, pair) in u.iter_mut().zip(digits.chunks_exact(2)) {
        *b = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(u)
}

#[cfg(test)]
mod tests {

    #[test]
    fn uuids_parse_as_written_and_format_back() {
        let u = parse_uuid("1d9ccba0-3fba-49e8-9488-aa5d5caa7927").unwrap();
        assert_eq!(format_uuid(&u), "1d9ccba0-3fba-49e8-9488-aa5d5caa7927");
        assert_eq!(parse_uuid("1D9CCBA03FBA49E89488AA5D5CAA7927"), Some(u), "machine-id style, upper case");
        assert_eq!(hex(&u), "1d9ccba03fba49e89488aa5d5caa7927");
        assert_eq!(parse_uuid("1d9ccba0-3fba-49e8-9488-aa5d5caa792"), None, "31 digits");
        assert_eq!(parse_uuid("1d9ccba0 3fba-49e8-9488-aa5d5caa7927"), None, "a space");
        assert_eq!(parse_uuid("+d9ccba03fba49e89488aa5d5caa7927"), None, "a sign");
    }

    use super::*;

    #[test]
    fn validation() {
        assert!(validate(DISCOVERY_NQN).is_ok());
        assert_eq!(validate(""), Err(NqnError::Empty));
        assert_eq!(validate("iqn.x"), Err(NqnError::BadPrefix));
        assert_eq!(validate(&format!("nqn.{}", "a".repeat(220))), Err(NqnError::TooLong));
        assert_eq!(validate("nqn.a\0b"), Err(NqnError::BadChar));
    }

    #[test]
    fn uuid_form() {
        let u = [0x47, 0x27, 0x69, 0xfd, 0xe4, 0x98, 0x46, 0x39, 0xb7, 0x20, 0xf6, 0xb9, 0x42, 0x1b, 0xb5, 0xfc];
        assert_eq!(uuid_hostnqn(&u), "nqn.2014-08.org.nvmexpress:uuid:472769fd-e498-4639-b720-f6b9421bb5fc");
    }
}
