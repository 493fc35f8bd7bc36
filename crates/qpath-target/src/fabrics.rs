//! Fabrics commands: Connect (creating controllers and binding queues) and
//! Property Get/Set (NVMe-oF 1.1 §3.3-§3.5; Linux `fabrics-cmd.c`).

use std::sync::Arc;

use nvme::fabrics::{
    ConnectCmd, ConnectData, ConnectDataError, ConnectInvalid, PropertyCmd, connect_data_offset, connect_sqe_offset,
    prop,
};
use nvme::{Cntlid, QueueId, Sqe, Status};

use crate::auth::{self, QueueAuth};
use crate::controller::Controller;
use crate::limits::HostTicket;
use crate::port::{Port, PortKind};
use crate::registry::TargetState;
use crate::subsystem::{SubsysKind, Subsystem};

/// What a successful Connect bound the queue to.
#[derive(Clone, Debug)]
pub enum Binding {
    /// The admin queue of a new controller (NVM or discovery).
    Admin(Arc<Controller>),
    /// An I/O queue of an existing controller, with the controller's I/O
    /// generation at Connect time (the queue closes when it moves).
    Io(Arc<Controller>, QueueId, u64),
}

impl Binding {
    /// The controller.
    pub fn controller(&self) -> &Arc<Controller> {
        match self {
            Binding::Admin(c) | Binding::Io(c, _, _) => c,
        }
    }
    /// The queue id.
    pub fn qid(&self) -> QueueId {
        match self {
            Binding::Admin(_) => QueueId::ADMIN,
            Binding::Io(_, q, _) => *q,
        }
    }
}

/// A refused Connect: the status and the CQE DW0 (IATTR/IPO for invalid parameters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectError {
    /// Status.
    pub status: Status,
    /// DW0.
    pub dw0: u32,
}

impl ConnectError {
    fn invalid(at: ConnectInvalid) -> ConnectError {
        ConnectError { status: Status::CONNECT_INVALID_PARAMETERS, dw0: at.dw0() }
    }
}

/// A successful Connect.
#[derive(Debug)]
pub struct Connected {
    /// The binding.
    pub binding: Binding,
    /// Queue entries (SQSIZE + 1).
    pub entries: u16,
    /// The host disabled SQ flow control (no SQHD needed; C2HData SUCCESS allowed).
    pub sqflow_disabled: bool,
    /// The host has DH-HMAC-CHAP keys here: the queue must authenticate (ATR) before use.
    pub auth: Option<QueueAuth>,
    /// The queue's place under `max_connections_per_hostnqn` (the connection keeps it).
    pub host_ticket: HostTicket,
}

/// Handles a Connect command arriving on `port` with its 1024 bytes of data; `tls` is the
/// PSK identity of the TLS channel the queue runs in, if it does.
pub fn connect(
    target: &TargetState,
    port: &Arc<Port>,
    sqe: &Sqe,
    data: &[u8],
    tls: Option<&tls::psk::Identity>,
) -> Result<Connected, ConnectError> {
    let cmd = ConnectCmd::from_sqe(sqe);
    if cmd.recfmt != 0 {
        return Err(ConnectError { status: Status::CONNECT_INCOMPATIBLE_FORMAT, dw0: 0 });
    }
    let d = ConnectData::decode(data).map_err(|e| match e {
        ConnectDataError::TooShort => ConnectError { status: Status::DATA_SGL_LENGTH_INVALID, dw0: 0 },
        ConnectDataError::BadNqn { offset } => ConnectError::invalid(ConnectInvalid::data(offset)),
    })?;
    let subsys = target
        .subsystem(&d.subnqn)
        .filter(|s| match s.kind {
            SubsysKind::Discovery => true,
            SubsysKind::Nvm => port.kind == PortKind::Io && s.on_port(port.id),
        })
        .ok_or_else(|| {
            tracing::debug!(subnqn = %d.subnqn, port = port.id, "connect to unknown subsystem");
            ConnectError::invalid(ConnectInvalid::data(connect_data_offset::SUBNQN))
        })?;
    if !subsys.allows_host(&d.hostnqn) {
        tracing::info!(subnqn = %d.subnqn, hostnqn = %d.hostnqn, "connect from a host not allowed");
        return Err(ConnectError {
            status: Status::CONNECT_INVALID_HOST,
            dw0: ConnectInvalid::data(connect_data_offset::HOSTNQN).dw0(),
        });
    }
    let entries = u32::from(cmd.sqsize) + 1;
    let max_entries = u32::from(subsys.limits.max_queue_entries);
    // SQSIZE is 0's based and must describe at least 2 entries (NVMe 2.0 §3.3.1.1).
    if cmd.sqsize == 0 || entries > max_entries {
        return Err(ConnectError::invalid(ConnectInvalid::sqe(connect_sqe_offset::SQSIZE)));
    }
    let entries = u16::try_from(entries).unwrap_or(u16::MAX);
    let host_ticket = target.limits.admit_host(&d.hostnqn).map_err(|why| {
        tracing::warn!(hostnqn = %d.hostnqn, limit = why.name(), "connect refused: connection limit reached");
        ConnectError { status: Status::CONNECT_CONTROLLER_BUSY, dw0: 0 }
    })?;
    let now = target.now_ms();
    let admitted = Admitted { target, port, subsys: &subsys, cmd: &cmd, data: &d, tls, now };
    if cmd.qid.is_admin() {
        admitted.admin_queue(entries, host_ticket)
    } else {
        admitted.io_queue(entries, host_ticket)
    }
}

/// A Connect whose format, subsystem, host and queue size were accepted: what is left
/// depends on the queue it makes.
struct Admitted<'a> {
    target: &'a TargetState,
    port: &'a Arc<Port>,
    subsys: &'a Arc<Subsystem>,
    cmd: &'a ConnectCmd,
    data: &'a ConnectData,
    tls: Option<&'a tls::psk::Identity>,
    now: u64,
}

impl Admitted<'_> {
    /// An admin queue: a new controller (dynamic controller model).
    fn admin_queue(&self, entries: u16, host_ticket: HostTicket) -> Result<Connected, ConnectError> {
        let (d, cmd, subsys, port, now) = (self.data, self.cmd, self.subsys, self.port, self.now);
        if d.cntlid != Cntlid::DYNAMIC {
            return Err(ConnectError::invalid(ConnectInvalid::data(connect_data_offset::CNTLID)));
        }
        let kato = cmd.kato_ms;
        let ctrl = subsys
            .register_controller(|id| {
                Arc::new(Controller::new(
                    id,
                    Arc::clone(subsys),
                    Arc::clone(port),
                    d.hostnqn.clone(),
                    d.hostid,
                    kato,
                    now,
                ))
            })
            .ok_or(ConnectError { status: Status::CONNECT_CONTROLLER_BUSY, dw0: 0 })?;
        if kato != 0 {
            ctrl.set_kato_ms(kato, now);
        }
        tracing::info!(
            cntlid = ctrl.cntlid.0, subnqn = %subsys.nqn, hostnqn = %d.hostnqn, port = port.id, kato_ms = kato,
            "controller created"
        );
        let auth = queue_auth(self.target, port, subsys, &d.hostnqn, true, self.tls);
        Ok(Connected {
            binding: Binding::Admin(ctrl),
            entries,
            sqflow_disabled: cmd.sqflow_disabled(),
            auth,
            host_ticket,
        })
    }

    /// An I/O queue of an existing, ready controller of the same host on the same port.
    fn io_queue(&self, entries: u16, host_ticket: HostTicket) -> Result<Connected, ConnectError> {
        let (d, cmd, subsys, port) = (self.data, self.cmd, self.subsys, self.port);
        let ctrl = subsys
            .controller(d.cntlid)
            .filter(|c| c.port.id == port.id)
            .ok_or_else(|| ConnectError::invalid(ConnectInvalid::data(connect_data_offset::CNTLID)))?;
        if ctrl.hostnqn != d.hostnqn {
            return Err(ConnectError::invalid(ConnectInvalid::data(connect_data_offset::HOSTNQN)));
        }
        if !ctrl.is_ready() {
            return Err(ConnectError { status: Status::COMMAND_SEQUENCE_ERROR, dw0: 0 });
        }
        let generation = ctrl.io_generation();
        if !ctrl.attach_io_queue(cmd.qid) {
            return Err(ConnectError::invalid(ConnectInvalid::sqe(connect_sqe_offset::QID)));
        }
        ctrl.touch(self.now);
        // Every I/O queue authenticates too (as Linux does without secure channel concatenation).
        let auth = queue_auth(self.target, port, subsys, &d.hostnqn, false, self.tls);
        Ok(Connected {
            binding: Binding::Io(Arc::clone(&ctrl), cmd.qid, generation),
            entries,
            sqflow_disabled: cmd.sqflow_disabled(),
            auth,
            host_ticket,
        })
    }
}

/// The authentication a new queue of `hostnqn` owes, if the host has DH-HMAC-CHAP keys in
/// `subsys`: none yet inside a TLS channel keyed with the PSK secure channel concatenation
/// generated for this host and subsystem (the channel proves the host, as in Linux nvmet);
/// a full transaction otherwise, inside a TLS channel with a configured PSK too.
fn queue_auth(
    target: &TargetState,
    port: &Port,
    subsys: &Arc<crate::subsystem::Subsystem>,
    hostnqn: &str,
    admin: bool,
    tls: Option<&tls::psk::Identity>,
) -> Option<QueueAuth> {
    let channel = auth::Channel { admin, tls: tls.is_some(), port_tls: port.tls.get() != crate::tls::TlsMode::None };
    let keys = subsys.host_auth(hostnqn);
    let now = target.now_ns();
    if tls.is_some_and(|id| id.generated && id.subnqn == subsys.nqn) {
        // The handshake found the identity's generated PSK (`crate::tls`), and the Connect
        // names the identity's host and subsystem (`tls_connect_check`).
        auth::on_connect_generated(keys, hostnqn, &subsys.nqn, channel, now)
    } else {
        auth::on_connect(keys, hostnqn, &subsys.nqn, channel, now)
    }
}

/// Property Get: (status, value).
pub fn property_get(ctrl: &Controller, sqe: &Sqe) -> (Status, u64) {
    let p = PropertyCmd::from_sqe(sqe);
    let (value, size8) = match p.offset {
        prop::CAP => (ctrl.cap(), true),
        prop::VS => (u64::from(ctrl.vs()), false),
        prop::CC => (u64::from(ctrl.cc()), false),
        prop::CSTS => (u64::from(ctrl.csts()), false),
        _ => return (Status::INVALID_FIELD, 0),
    };
    if p.size8 != size8 {
        return (Status::INVALID_FIELD, 0);
    }
    (Status::SUCCESS, value)
}

/// Property Set: only CC is writable.
pub fn property_set(ctrl: &Controller, sqe: &Sqe) -> Status {
    let p = PropertyCmd::from_sqe(sqe);
    if p.offset != prop::CC || p.size8 {
        return Status::INVALID_FIELD;
    }
    let v = u32::try_from(p.value & 0xffff_ffff).unwrap_or(0);
    match ctrl.set_cc(v) {
        Ok(()) => Status::SUCCESS,
        Err(s) => s,
    }
}
