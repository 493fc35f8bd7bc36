//! Which fault families a run draws (`qpath sim --faults`): all of them by default. A
//! family left out is never injected; every other choice of the seed stays drawn the same
//! way, so a run with fewer faults is still one schedule per (seed, families), and a
//! failure found with `--faults` replays with the same `--faults`.

/// One family of faults (its discriminant is its bit in [`Faults`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Connection resets.
    Reset,
    /// Silent stalls of a link direction (it stops delivering without closing).
    Stall,
    /// Target crashes and restarts (RAM lost, the file kept to its durable state).
    Crash,
    /// ANA state changes of a port.
    Ana,
    /// Periods of a slow disk.
    SlowDisk,
    /// Bit flips on links whose digests cover every byte.
    BitFlip,
    /// Reservation preemption by another host.
    Reservation,
    /// Namespace resizes.
    Resize,
    /// Outages of a port (every connection through it silent, then reset).
    Outage,
    /// Controller faults: an admin link silent toward the host, both ports out at once.
    Controller,
    /// Namespace removal (given back, or another namespace put under its NSID).
    Namespace,
    /// DH-HMAC-CHAP key rotation with re-authentication.
    KeyRotation,
}

/// Each family's name on the command line, in the order of [`Fault`].
pub const NAMES: [(&str, Fault); 12] = [
    ("reset", Fault::Reset),
    ("stall", Fault::Stall),
    ("crash", Fault::Crash),
    ("ana", Fault::Ana),
    ("slow-disk", Fault::SlowDisk),
    ("bit-flip", Fault::BitFlip),
    ("reservation", Fault::Reservation),
    ("resize", Fault::Resize),
    ("outage", Fault::Outage),
    ("controller", Fault::Controller),
    ("namespace", Fault::Namespace),
    ("key-rotation", Fault::KeyRotation),
];

/// A set of fault families.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Faults(u16);

impl Default for Faults {
    fn default() -> Faults {
        Faults::ALL
    }
}

impl Faults {
    /// Every family.
    pub const ALL: Faults = Faults((1 << NAMES.len()) - 1);
    /// None: the workload alone.
    pub const NONE: Faults = Faults(0);

    fn bit(f: Fault) -> u16 {
        1 << f as u16
    }

    /// Whether family `f` is drawn.
    pub fn has(self, f: Fault) -> bool {
        self.0 & Faults::bit(f) != 0
    }

    /// From the command line: `all`, `none`, a comma-separated list of families (only
    /// those), or a list of families each with a leading `-` (all but those).
    pub fn parse(s: &str) -> Result<Faults, String> {
        let words: Vec<&str> = s.split(',').map(str::trim).filter(|w| !w.is_empty()).collect();
        if words.is_empty() {
            return Err(format!("--faults {s:?}: no family named ({})", Faults::known()));
        }
        if words == ["all"] {
            return Ok(Faults::ALL);
        }
        if words == ["none"] {
            return Ok(Faults::NONE);
        }
        let minus = words[0].starts_with('-');
        let mut set = if minus { Faults::ALL } else { Faults::NONE };
        for w in words {
            let (off, name) = match w.strip_prefix('-') {
                Some(n) => (true, n),
                None => (false, w),
            };
            if off != minus {
                return Err(format!(
                    "--faults {s:?}: list the families to draw (reset,crash) or those to leave out (-crash,-ns), not both"
                ));
            }
            let Some(&(_, f)) = NAMES.iter().find(|(n, _)| *n == name) else {
                return Err(format!("--faults {s:?}: {name:?} is not a fault family ({})", Faults::known()));
            };
            set.0 = if off { set.0 & !Faults::bit(f) } else { set.0 | Faults::bit(f) };
        }
        Ok(set)
    }

    fn known() -> String {
        let names: Vec<&str> = NAMES.iter().map(|(n, _)| *n).collect();
        format!("all, none, or of: {}", names.join(", "))
    }

    /// The set as `parse` reads it back (`all`, `none`, or the families drawn).
    pub fn to_arg(self) -> String {
        match self {
            Faults::ALL => "all".to_string(),
            Faults::NONE => "none".to_string(),
            _ => NAMES.iter().filter(|(_, f)| self.has(*f)).map(|(n, _)| *n).collect::<Vec<_>>().join(","),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_chosen_by_name_in_or_out_and_read_back() {
        assert_eq!(Faults::parse("all"), Ok(Faults::ALL));
        assert_eq!(Faults::parse("none"), Ok(Faults::NONE));
        let only = Faults::parse("reset, crash").unwrap();
        assert!(only.has(Fault::Reset) && only.has(Fault::Crash) && !only.has(Fault::Namespace));
        assert_eq!(only.to_arg(), "reset,crash");
        let but = Faults::parse("-crash,-namespace").unwrap();
        assert!(!but.has(Fault::Crash) && !but.has(Fault::Namespace) && but.has(Fault::Reset));
        assert_eq!(Faults::parse(&but.to_arg()), Ok(but));
        for (i, (name, f)) in NAMES.into_iter().enumerate() {
            assert_eq!(f as usize, i, "{name} is in the enum's order");
            assert!(Faults::parse(name).unwrap().has(f), "{name}");
        }
        let e = Faults::parse("reset,crahs").unwrap_err();
        assert!(e.contains("\"crahs\" is not a fault family") && e.contains("namespace"), "{e}");
        assert!(Faults::parse("reset,-crash").unwrap_err().contains("not both"));
        assert!(Faults::parse("").is_err());
    }
}
