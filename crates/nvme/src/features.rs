//! Features (NVMe 2.0 §5.27.1) and asynchronous events (§5.2).

/// Feature identifiers.
pub mod fid {
    /// Arbitration.
    pub const ARBITRATION: u8 = 0x01;
    /// Power Management.
    pub const POWER_MGMT: u8 = 0x02;
    /// Temperature Threshold.
    pub const TEMP_THRESHOLD: u8 = 0x04;
    /// Error Recovery.
    pub const ERROR_RECOVERY: u8 = 0x05;
    /// Volatile Write Cache.
    pub const VOLATILE_WC: u8 = 0x06;
    /// Number of Queues.
    pub const NUM_QUEUES: u8 = 0x07;
    /// Interrupt Coalescing.
    pub const IRQ_COALESCE: u8 = 0x08;
    /// Write Atomicity Normal.
    pub const WRITE_ATOMIC: u8 = 0x0a;
    /// Asynchronous Event Configuration.
    pub const ASYNC_EVENT: u8 = 0x0b;
    /// Autonomous Power State Transition.
    pub const APST: u8 = 0x0c;
    /// Keep Alive Timer.
    pub const KATO: u8 = 0x0f;
    /// Host Behavior Support.
    pub const HOST_BEHAVIOR: u8 = 0x16;
    /// Host Identifier.
    pub const HOST_ID: u8 = 0x81;
    /// Reservation Notification Mask (namespace: bit 1 Registration Preempted, bit 2
    /// Reservation Released, bit 3 Reservation Preempted notifications masked).
    pub const RESV_MASK: u8 = 0x82;
    /// Reservation Persistence (namespace: PTPL, bit 0).
    pub const RESV_PERSISTENCE: u8 = 0x83;
    /// Namespace Write Protection Config (namespace specific; NVMe Base 2.0 §5.27.1.28).
    pub const WRITE_PROTECT: u8 = 0x84;
}

/// Get Features Select field (CDW10 bits 10:8).
pub mod sel {
    /// Current value.
    pub const CURRENT: u8 = 0;
    /// Default value.
    pub const DEFAULT: u8 = 1;
    /// Saved value.
    pub const SAVED: u8 = 2;
    /// Supported capabilities (DW0: bit 0 saveable, bit 1 namespace specific, bit 2 changeable).
    pub const SUPPORTED_CAPABILITIES: u8 = 3;
}

/// Supported capabilities bits returned for [`sel::SUPPORTED_CAPABILITIES`].
pub mod capabilities {
    /// The feature is saveable.
    pub const SAVEABLE: u32 = 1 << 0;
    /// The feature is namespace specific.
    pub const NS_SPECIFIC: u32 = 1 << 1;
    /// The feature is changeable.
    pub const CHANGEABLE: u32 = 1 << 2;
}

/// Number of Queues value (CDW11 and DW0): NSQR/NSQA in bits 15:0 and
/// NCQR/NCQA in bits 31:16, both 0's based.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NumQueues {
    /// I/O submission queues (1's based here).
    pub nsq: u32,
    /// I/O completion queues (1's based here).
    pub ncq: u32,
}

impl NumQueues {
    /// Decodes a dword; 0xFFFF (65536 queues) is invalid per spec and left to the caller.
    pub fn from_dw(v: u32) -> NumQueues {
        NumQueues { nsq: (v & 0xffff) + 1, ncq: (v >> 16) + 1 }
    }
    /// Encodes to a dword (values clamped to 1..=65535).
    pub fn to_dw(self) -> u32 {
        let n = |x: u32| x.clamp(1, 0xffff) - 1;
        n(self.nsq) | (n(self.ncq) << 16)
    }
}

/// Asynchronous event types (completion DW0 bits 2:0).
pub mod aer_type {
    /// Error status.
    pub const ERROR: u8 = 0;
    /// SMART / health status.
    pub const SMART: u8 = 1;
    /// Notice.
    pub const NOTICE: u8 = 2;
    /// I/O command specific status.
    pub const IO_CMD_SPECIFIC: u8 = 6;
    /// Vendor specific.
    pub const VENDOR: u8 = 7;
}

/// Notice event information values (completion DW0 bits 15:8).
pub mod aer_notice {
    /// Namespace Attribute Changed.
    pub const NS_ATTR_CHANGED: u8 = 0x00;
    /// Firmware Activation Starting.
    pub const FW_ACTIVATION: u8 = 0x01;
    /// Telemetry Log Changed.
    pub const TELEMETRY: u8 = 0x02;
    /// Asymmetric Namespace Access Change.
    pub const ANA_CHANGE: u8 = 0x03;
    /// Discovery Log Page Change.
    pub const DISCOVERY_CHANGE: u8 = 0xf0;
}

/// I/O Command Set specific event information values (completion DW0 bits 15:8 when the
/// type is [`aer_type::IO_CMD_SPECIFIC`]).
pub mod aer_io {
    /// Reservation Log Page Available.
    pub const RESERVATION_LOG: u8 = 0x00;
}

/// An asynchronous event as carried in an AER completion's DW0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncEvent {
    /// Event type.
    pub event_type: u8,
    /// Event information.
    pub info: u8,
    /// Log page to read to clear the event.
    pub log_page: u8,
}

impl AsyncEvent {
    /// Namespace attribute changed: read the Changed Namespace List.
    pub const NS_CHANGED: AsyncEvent = AsyncEvent {
        event_type: aer_type::NOTICE,
        info: aer_notice::NS_ATTR_CHANGED,
        log_page: crate::log::lid::CHANGED_NS,
    };
    /// ANA change: read the ANA log.
    pub const ANA_CHANGE: AsyncEvent =
        AsyncEvent { event_type: aer_type::NOTICE, info: aer_notice::ANA_CHANGE, log_page: crate::log::lid::ANA };
    /// Discovery log changed: read the discovery log.
    pub const DISCOVERY_CHANGE: AsyncEvent = AsyncEvent {
        event_type: aer_type::NOTICE,
        info: aer_notice::DISCOVERY_CHANGE,
        log_page: crate::log::lid::DISCOVERY,
    };

    /// A Reservation Notification log page is waiting: read LID 80h.
    pub const RESERVATION_LOG: AsyncEvent = AsyncEvent {
        event_type: aer_type::IO_CMD_SPECIFIC,
        info: aer_io::RESERVATION_LOG,
        log_page: crate::log::lid::RESERVATION,
    };

    /// Completion DW0.
    pub fn to_dw0(self) -> u32 {
        u32::from(self.event_type & 7) | (u32::from(self.info) << 8) | (u32::from(self.log_page) << 16)
    }

    /// Decodes completion DW0.
    pub fn from_dw0(v: u32) -> AsyncEvent {
        AsyncEvent { event_type: (v & 7) as u8, info: ((v >> 8) & 0xff) as u8, log_page: ((v >> 16) & 0xff) as u8 }
    }

    /// The Asynchronous Event Configuration bit that enables this notice, if any
    /// (Set Features 0Bh CDW11: bit 8 NS attr, bit 11 ANA change, bit 31 discovery).
    pub fn config_bit(self) -> Option<u32> {
        if self.event_type != aer_type::NOTICE {
            return None;
        }
        match self.info {
            aer_notice::NS_ATTR_CHANGED => Some(1 << 8),
            aer_notice::FW_ACTIVATION => Some(1 << 9),
            aer_notice::ANA_CHANGE => Some(1 << 11),
            aer_notice::DISCOVERY_CHANGE => Some(1 << 31),
            _ => None,
        }
    }

    /// Whether no Asynchronous Event Configuration bit gates the event: Error status
    /// events, and I/O Command Set specific events (the Asynchronous Event Configuration
    /// feature, FID 0Bh, has no bit for them; Reservation Log Page Available is filtered per
    /// namespace by the Reservation Notification Mask, FID 82h, before it is raised).
    pub fn always_reported(self) -> bool {
        matches!(self.event_type, aer_type::ERROR | aer_type::IO_CMD_SPECIFIC)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn num_queues() {
        let q = NumQueues { nsq: 4, ncq: 4 };
        assert_eq!(q.to_dw(), 0x0003_0003);
        assert_eq!(NumQueues::from_dw(0x0003_0003), q);
    }

    #[test]
    fn aen_dw0() {
        // Linux: NVME_AER_NOTICE_ANA = 0x03, type notice = 2, LID 0x0c -> 0x000c0302.
        assert_eq!(AsyncEvent::ANA_CHANGE.to_dw0(), 0x000c_0302);
        assert_eq!(AsyncEvent::from_dw0(0x000c_0302), AsyncEvent::ANA_CHANGE);
        assert_eq!(AsyncEvent::NS_CHANGED.config_bit(), Some(1 << 8));
        // Linux: NVME_AER_CSS = 6, NVME_AEN_RESV_LOG_PAGE_AVAILABLE = 0, LID 0x80.
        assert_eq!(AsyncEvent::RESERVATION_LOG.to_dw0(), 0x0080_0006);
        assert!(AsyncEvent::RESERVATION_LOG.always_reported() && AsyncEvent::RESERVATION_LOG.config_bit().is_none());
        assert!(!AsyncEvent::ANA_CHANGE.always_reported());
    }
}

/// The namespace write protection states of Set/Get Features 84h, CDW11 bits 2:0 (NVMe
/// Base 2.0 §8.12, Figure "Namespace Write Protection Config").
pub mod write_protect {
    /// No Write Protect: writes allowed.
    pub const NONE: u32 = 0;
    /// Write Protect: writes refused until a host sets No Write Protect.
    pub const PROTECT: u32 = 1;
    /// Write Protect Until Power Cycle: no Set Features lifts it.
    pub const UNTIL_POWER_CYCLE: u32 = 2;
    /// Permanent Write Protect (not offered by qpath).
    pub const PERMANENT: u32 = 3;
}
