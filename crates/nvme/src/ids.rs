//! Identifier newtypes, so a command id is never passed where a queue id is expected.

use core::fmt;

macro_rules! id_newtype {
    ($(#[$doc:meta])* $name:ident($inner:ty)) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub $inner);

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
    };
}

id_newtype!(
    /// Command identifier (SQE CDW0 bits 31:16): unique among a queue's outstanding commands.
    Cid(u16)
);
id_newtype!(
    /// Namespace identifier. 0 is "no namespace"; 0xFFFF_FFFF is the broadcast value.
    Nsid(u32)
);
id_newtype!(
    /// Queue identifier: 0 is the admin queue, 1.. are I/O queues.
    QueueId(u16)
);
id_newtype!(
    /// Controller identifier within an NVM subsystem. 0xFFFF asks for a dynamic one at Connect.
    Cntlid(u16)
);
id_newtype!(
    /// ANA group identifier (NVMe 2.0 §8.1.1). 0 means "not in a group".
    AnaGrpId(u32)
);

impl Nsid {
    /// The broadcast NSID (all namespaces).
    pub const BROADCAST: Nsid = Nsid(0xFFFF_FFFF);
}

impl Cntlid {
    /// Connect's request for a dynamically allocated controller (NVMe-oF 1.1 §3.3).
    pub const DYNAMIC: Cntlid = Cntlid(0xFFFF);
    /// Highest controller id a dynamic controller may get (0xFFF0..=0xFFFE are reserved).
    pub const MAX_DYNAMIC: u16 = 0xFFEF;
}

impl QueueId {
    /// The admin queue.
    pub const ADMIN: QueueId = QueueId(0);

    /// Whether this is the admin queue.
    pub fn is_admin(self) -> bool {
        self.0 == 0
    }
}
