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
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

#[cfg(test)]
mod tests {
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
