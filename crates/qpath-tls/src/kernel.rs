//! Kernel TLS (the `tls` upper-layer protocol, `TCP_ULP`): where the kernel offers it, a
//! connection could hand its traffic keys to the kernel after the handshake and keep
//! zero-copy sends. qpath detects it at start-up and says which path its connections use;
//! today every connection protects its records in user space ([`crate::record`]), which is
//! also the only path on kernels built without it.

/// Where a connection's records are sealed and opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordPath {
    /// In this process, on the thread that owns the connection (AES-GCM through OpenSSL).
    User,
}

impl RecordPath {
    /// The name `list_queues` and statistics show.
    pub fn name(self) -> &'static str {
        match self {
            RecordPath::User => "tls1.3-user",
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
pub fn describe() -> String {
    if ktls_available() {
        "kernel TLS is available; qpath still protects records in user space (the kernel path is not implemented)"
            .to_string()
    } else {
        "kernel TLS is not available (no \"tls\" TCP ULP); records are protected in user space".to_string()
    }
}
