//! The target's methods: one table ([`TARGET`]) with each method's schema and the function
//! that serves it. The socket checks a request against the schema before the function runs
//! ([`super::answer`]), so every function here reads typed parameters.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use nvme::{AnaGrpId, AnaState, Nsid};
use serde_json::{Value, json};

use super::schema::{Effect, Method, Param, Type, U16, U32, U64};
use crate::config::{NamespaceConfig, SubsystemConfig, add_namespace, add_subsystem};
use crate::error::{Error, ErrorKind};
use crate::port::PortKind;
use crate::qos::QosSettings;
use crate::server::Server;
use crate::subsystem::{HostAccess, Subsystem};

/// What serves one of the target's methods: the parameters are checked and typed.
pub type Run = fn(&Server, &Value) -> Result<Value, Error>;

const NQN: Param = Param::required("nqn", Type::String, "the subsystem's NQN");
const NSID: Param = Param::required("nsid", U32, "the namespace's NSID");
const HOST: Param = Param::required("host", Type::String, "the host's NQN");
const PORT_ID: Type = Type::Integer { min: 1, max: u16::MAX as u64 };
const ANA_GROUP: Type = Type::Integer { min: 1, max: crate::port::ANA_GROUPS as u64 };

/// A namespace's fields ([`NamespaceConfig`], the config file's `[[subsystem.namespace]]`):
/// `add_namespace`'s parameters after `nqn`, and the tables of `add_subsystem`'s `namespace`.
const ADD_NAMESPACE: &[Param] = &[
    NQN,
    Param::default("nsid", U32, "0", "NSID (0: the next free one)"),
    Param::required("backend", Type::Enum(&["null", "ram", "file"]), "what holds the data"),
    Param::optional(
        "size",
        Type::Size,
        "size; required for null and ram; a file without it keeps its own size (never shrunk)",
    ),
    Param::optional("path", Type::String, "backend file: a regular file or a block device"),
    Param::default("grow", Type::Boolean, "false", "backend file: grow an existing smaller regular file to size"),
    Param::default("block_size", U32, "512", "logical block size in bytes"),
    Param::default("ana_group", ANA_GROUP, "1", "ANA group"),
    Param::default("readonly", Type::Boolean, "false", "serve it read-only (the file opened O_RDONLY)"),
    Param::optional("ptpl_file", Type::String, "where reservations persist through power loss, once a host asks"),
    Param::optional(
        "uuid",
        Type::String,
        "UUID (default: a new random one, kept by save_config: a namespace added while the target runs is a new namespace to hosts, even under an NSID another had)",
    ),
    Param::default("qos", Type::Object(QOS), "{}", "provisioned limits {iops, bytes_per_sec, delay_us}"),
    Param::default("prefault", Type::Boolean, "false", "backend ram: fault every page in at creation"),
    Param::default("huge_pages", Type::Boolean, "false", "backend ram: ask for transparent huge pages"),
    Param::optional(
        "max_size",
        Type::Size,
        "backend ram: the largest size resize_namespace may grow it to (default: the machine's memory)",
    ),
    Param::default("visible", Type::Enum(&["all", "listed"]), "\"all\"", "which hosts see it: all, or listed ones"),
    Param::default("hosts", Type::Array(&Type::String), "[]", "with visible=listed: the host NQNs that see it"),
];
const NAMESPACE_TABLE: &[Param] = ADD_NAMESPACE.split_at(1).1;

/// A namespace's provisioned limits ([`QosSettings`]): `set_qos`'s parameters after the
/// namespace, and a namespace table's `qos`.
const SET_QOS: &[Param] = &[
    NQN,
    NSID,
    Param::default("iops", U64, "0", "I/O commands per second (0: no limit)"),
    Param::default("bytes_per_sec", U64, "0", "bytes per second (0: no limit)"),
    Param::default("delay_us", U64, "0", "latency added to every I/O command, in microseconds"),
];
const QOS: &[Param] = SET_QOS.split_at(2).1;

/// A host's DH-HMAC-CHAP settings ([`crate::config::HostAuthConfig`]): `set_host_auth`'s
/// parameters after `nqn`, with the host's NQN as `host`; in `add_subsystem`'s host tables
/// the host's NQN is `nqn`.
const HOST_AUTH: &[Param] = &[
    Param::required("nqn", Type::String, "the host's NQN"),
    Param::optional("dhchap_key", Type::String, "the host's secret, DHHC-1:hh:base64: (no key: none)").secret(),
    Param::optional("dhchap_ctrl_key", Type::String, "the controller's secret (bidirectional authentication)").secret(),
    Param::optional("dhchap_key_file", Type::String, "a file holding the host's secret (saved as the file's name)"),
    Param::optional("dhchap_ctrl_key_file", Type::String, "a file holding the controller's secret"),
    Param::optional("hash", Type::String, "preferred hash: sha256 (default), sha384, sha512"),
    Param::optional("dhgroup", Type::String, "required DH group: null (default), ffdhe2048 ... ffdhe8192"),
    Param::optional("tls_key", Type::String, "the host's TLS PSK, NVMeTLSkey-1:hh:base64: (for TLS ports)").secret(),
    Param::optional("tls_key_file", Type::String, "a file holding the host's TLS PSK (saved as the file's name)"),
];
const SET_HOST_TLS_KEY: &[Param] = &[NQN, HOST, HOST_AUTH[7], HOST_AUTH[8]];
const TLS_MODE: Type = Type::Enum(&["none", "required", "allowed"]);
const SET_HOST_AUTH: &[Param] =
    &[NQN, HOST, HOST_AUTH[1], HOST_AUTH[2], HOST_AUTH[3], HOST_AUTH[4], HOST_AUTH[5], HOST_AUTH[6]];

const ADD_SUBSYSTEM: &[Param] = &[
    Param::required("nqn", Type::String, "the new subsystem's NQN"),
    Param::optional("serial", Type::String, "serial number (default: derived from the NQN)"),
    Param::default("model", Type::String, "\"qpath\"", "model number"),
    Param::default(
        "allow_any_host",
        Type::Boolean,
        "false",
        "let any host connect; false (the default) admits only the hosts listed",
    ),
    Param::default(
        "hosts",
        Type::Array(&Type::OneOf(&[Type::String, Type::Object(HOST_AUTH)])),
        "[]",
        "allowed hosts: NQNs, or tables {nqn, dhchap_key, ...} for hosts that authenticate",
    ),
    Param::default("ports", Type::Array(&PORT_ID), "[]", "ids of the ports it is served on (none: every I/O port)"),
    Param::optional("max_io_queues", U16, "I/O queues per controller (default: the target's)"),
    Param::optional("queue_size", U16, "entries per queue, CAP.MQES + 1 (default: the target's)"),
    Param::default(
        "namespace",
        Type::Array(&Type::Object(NAMESPACE_TABLE)),
        "[]",
        "its namespaces: tables of add_namespace's parameters without nqn",
    ),
];

/// The running limits ([`crate::limits::LimitSettings`]).
const SET_LIMITS: &[Param] = &[
    Param::optional("max_connections_per_port", U64, "most connections at once on one port"),
    Param::optional("max_connections_per_host", U64, "most connections at once from one host address"),
    Param::optional("max_connections_per_hostnqn", U64, "most queues at once connected with one host NQN"),
    Param::optional("connect_timeout_ms", U64, "ICReq and Connect must be done this long after the TCP accept"),
    Param::optional("pdu_timeout_ms", U64, "a started PDU must be whole, and an R2T answered, within this long"),
    Param::optional("max_buffer_bytes_per_connection", U64, "data buffer bytes one connection may hold"),
    Param::optional(
        "rx_budget_pdus",
        U32,
        "fairness: PDUs one connection parses per reactor turn while others on the reactor have work (0: no limit)",
    ),
    Param::optional(
        "tx_batch_bytes",
        U64,
        "fairness: most bytes in one send batch while others on the reactor have work (0: no limit)",
    ),
    Param::optional("tx_deadline_us", U64, "fairness: a turn stops parsing input this long after it began (0: never)"),
];

const REFERRAL: &[Param] = &[
    Param::required("address", Type::String, "IP address of the other discovery service (or subsystem)"),
    Param::default("port", U16, "8009", "its TCP port"),
    Param::optional("subnqn", Type::String, "the NQN there (default: the discovery NQN)"),
];

const NS_HOST: &[Param] = &[NQN, NSID, HOST];
const NQN_NSID: &[Param] = &[NQN, NSID];

macro_rules! method {
    ($name:literal, $effect:ident, $params:expr, $run:expr, $summary:literal, $result:literal) => {
        Method { name: $name, summary: $summary, effect: Effect::$effect, params: $params, result: $result, run: $run }
    };
}

/// The target's methods, in the order `rpc_get_methods` lists them.
pub static TARGET: &[Method<Run>] = &[
    method!(
        "get_target",
        Reads,
        &[],
        get_target,
        "The target's reactors, ports, subsystem NQNs, referrals and options",
        "{reactors, ports: [{id, addr, kind}], subsystems: [nqn], referrals, options}"
    ),
    method!(
        "list_ports",
        Reads,
        &[],
        list_ports,
        "Each port: its address, kind, injected faults and its ANA groups that are not optimized",
        "[{id, addr, kind, delay_us, refuse_connects, ana: [{group, state}]}]"
    ),
    method!(
        "list_subsystems",
        Reads,
        &[],
        list_subsystems,
        "Each subsystem with its hosts, namespaces and controllers (each key as its fingerprint, never the key)",
        "[{nqn, serial, model, allow_any_host, hosts, auth_hosts, host_keys, namespaces, controllers}]"
    ),
    method!(
        "add_subsystem",
        Configures,
        ADD_SUBSYSTEM,
        add_subsystem_,
        "Adds a subsystem as the config file's subsystem table gives it, all or nothing; allow_any_host \
         defaults to false: only listed hosts may connect",
        "{nqn, allow_any_host, hosts, warning (when no host may connect)}"
    ),
    method!(
        "remove_subsystem",
        Configures,
        &[NQN],
        remove_subsystem,
        "Removes a subsystem; its controllers fail",
        "{}"
    ),
    method!(
        "add_namespace",
        Configures,
        ADD_NAMESPACE,
        add_namespace_,
        "Adds a namespace; an existing file is never shrunk, grown only with grow, locked while served",
        "{nsid}"
    ),
    method!(
        "remove_namespace",
        Configures,
        NQN_NSID,
        remove_namespace,
        "Removes a namespace; hosts hear it is gone",
        "{}"
    ),
    method!(
        "resize_namespace",
        Configures,
        &[NQN, NSID, Param::required("size", Type::Size, "the new size, a multiple of the block size")],
        resize_namespace,
        "Changes a namespace's size while hosts use it (RAM up to max_size; shrinking refused while data \
         lies past the new end; block devices refused)",
        "{nsid, size, previous_size}"
    ),
    method!(
        "ns_add_host",
        Configures,
        NS_HOST,
        ns_add_host,
        "Lets a host see a namespace that is visible to listed hosts (its controllers see it appear)",
        "{changed}"
    ),
    method!(
        "ns_remove_host",
        Configures,
        NS_HOST,
        ns_remove_host,
        "Hides a namespace that is visible to listed hosts from a host (its controllers see it go)",
        "{changed}"
    ),
    method!(
        "add_host",
        Configures,
        &[NQN, HOST],
        add_host,
        "Allows a host to connect to a subsystem",
        "{controllers_failed}"
    ),
    method!(
        "remove_host",
        Configures,
        &[NQN, HOST],
        remove_host,
        "Removes a host from a subsystem's list and its keys; its controllers fail at once",
        "{controllers_failed}"
    ),
    method!(
        "set_allow_any_host",
        Configures,
        &[NQN, Param::required("allow", Type::Boolean, "true: any host; false: only the listed hosts")],
        set_allow_any_host,
        "Lets any host connect to a subsystem, or only its listed hosts (the others' controllers fail)",
        "{controllers_failed}"
    ),
    method!(
        "set_host_auth",
        Configures,
        SET_HOST_AUTH,
        set_host_auth,
        "Allows a host and sets its DH-HMAC-CHAP keys (no key: clears them); keys are never answered or logged",
        "{}"
    ),
    method!(
        "set_ana_state",
        Configures,
        &[
            Param::required("port", PORT_ID, "the port's id"),
            Param::required("group", ANA_GROUP, "the ANA group"),
            Param::required(
                "state",
                Type::Enum(&[
                    "optimized|opt",
                    "non-optimized|non_optimized|nonopt",
                    "inaccessible",
                    "persistent-loss|persistent_loss",
                    "change",
                ]),
                "the new ANA state",
            ),
        ],
        set_ana_state,
        "Sets the ANA state of a group on a port; hosts hear of the change",
        "{changed}"
    ),
    method!(
        "set_qos",
        Configures,
        SET_QOS,
        set_qos,
        "Sets a namespace's provisioned limits (a limit left out is 0: none)",
        "{iops, bytes_per_sec, delay_us}"
    ),
    method!(
        "get_reservation",
        Reads,
        NQN_NSID,
        get_reservation,
        "A namespace's reservation and registrants, as the target holds them",
        "{generation, rtype, registrants: [{hostid, rkey, holds}]}"
    ),
    method!(
        "clear_reservation",
        Acts,
        NQN_NSID,
        clear_reservation,
        "Drops every registration and the reservation of a namespace; the registrants hear they were preempted",
        "{cleared_registrations}"
    ),
    method!(
        "add_port",
        Configures,
        &[
            Param::required("id", PORT_ID, "the new port's id"),
            Param::required("addr", Type::String, "IP:PORT to listen on (port 0: a free one)"),
            Param::default("kind", Type::Enum(&["io", "discovery"]), "\"io\"", "I/O and discovery, or discovery only"),
            Param::default("tls", TLS_MODE, "\"none\"", "TLS 1.3: none, required, or allowed (both)"),
            Param::default(
                "tls_offload",
                Type::Enum(&["auto", "off"]),
                "\"auto\"",
                "kernel TLS for its TLS connections where the kernel offers it, or off (records in user space)"
            ),
        ],
        add_port,
        "Listens on a new port",
        "{addr}"
    ),
    method!(
        "set_port_tls",
        Configures,
        &[
            Param::required("id", PORT_ID, "the port's id"),
            Param::required("tls", TLS_MODE, "none, required or allowed")
        ],
        set_port_tls,
        "Sets whether a port speaks TLS 1.3; connections accepted from now on follow it, open ones keep theirs",
        "{}"
    ),
    method!(
        "set_host_tls_key",
        Configures,
        SET_HOST_TLS_KEY,
        set_host_tls_key,
        "Allows a host and sets (adds or rotates) its TLS PSK in a subsystem (no key: removes it); the key is never answered or logged",
        "{fingerprint}"
    ),
    method!(
        "remove_port",
        Configures,
        &[Param::required("id", PORT_ID, "the port's id")],
        remove_port,
        "Closes a port, its listener and connections; discovery controllers on other ports hear of it",
        "{}"
    ),
    method!(
        "add_referral",
        Configures,
        REFERRAL,
        add_referral,
        "Lists another discovery service (or a subsystem elsewhere) in every port's discovery log",
        "{}"
    ),
    method!("remove_referral", Configures, REFERRAL, remove_referral, "Removes a referral", "{}"),
    method!(
        "set_port_fault",
        Acts,
        &[
            Param::required("port", PORT_ID, "the port's id"),
            Param::optional(
                "delay_us",
                U64,
                "latency added to every I/O command on the port, in microseconds (needs fault injection built in)",
            ),
            Param::optional("refuse_connects", Type::Boolean, "refuse new connections"),
            Param::default("drop_connections", Type::Boolean, "false", "close every connection of the port now"),
            Param::optional(
                "stall_opcode",
                Type::Integer { min: -1, max: 255 },
                "never answer I/O commands with this opcode, -1: answer them again (needs fault injection built in)",
            ),
        ],
        set_port_fault,
        "Injects faults on a port, for failover tests (not saved)",
        "{}"
    ),
    method!(
        "get_limits",
        Reads,
        &[],
        get_limits,
        "The limits in force, connections refused by reason, and timeouts",
        "{limits, refused, timeouts}"
    ),
    method!(
        "set_limits",
        Configures,
        SET_LIMITS,
        set_limits,
        "Changes connection limits, timeouts and fairness budgets while the target runs",
        "{limits, refused, timeouts}"
    ),
    method!(
        "save_config",
        Acts,
        &[Param::optional("path", Type::String, "the file to write (default: the file the target started from)")],
        save_config,
        "Writes the running configuration as the TOML --config reads, atomically (the previous file kept as \
         FILE.bak; mode 0600 with secrets inline)",
        "{path, bytes, mode, inline_secrets, backup}"
    ),
    method!(
        "list_controllers",
        Reads,
        &[],
        list_controllers,
        "Every controller, discovery ones too: subsystem, host, port, state, queues",
        "[{cntlid, subnqn, hostnqn, port, state, kato_ms, num_io_queues, io_queues}]"
    ),
    method!("list_queues", Reads, &[], list_queues, "Every queue with its counters", "[{port, peer, reactor, stats}]"),
    method!(
        "stats",
        Reads,
        &[],
        stats,
        "Per-queue counters and latency percentiles; per-port, per-namespace, reactor, auth and reservation totals",
        "{side, queues, ports, namespaces, reactors, auth, reservations}"
    ),
];

/// The value of parameter `key` (checked and typed by the schema: a failure here is a
/// parameter the table and the function disagree on).
fn param<T: serde::de::DeserializeOwned>(p: &Value, key: &str) -> Result<T, Error> {
    let v = p.get(key).cloned().ok_or_else(|| Error::new(ErrorKind::Config, format!("missing parameter {key:?}")))?;
    serde_json::from_value(v).map_err(|e| Error::new(ErrorKind::Config, format!("parameter {key:?}: {e}")))
}

fn opt<T: serde::de::DeserializeOwned>(p: &Value, key: &str) -> Result<Option<T>, Error> {
    match p.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(_) => param(p, key).map(Some),
    }
}

/// A whole table (`add_subsystem`, `add_namespace`, `set_limits`) read as its config type.
fn table<T: serde::de::DeserializeOwned>(method: &str, p: Value) -> Result<T, Error> {
    serde_json::from_value(p).map_err(|e| Error::new(ErrorKind::Config, format!("{method}: {e}")))
}

fn subsystem(server: &Server, p: &Value) -> Result<Arc<Subsystem>, Error> {
    let nqn: String = param(p, "nqn")?;
    server.state.subsystem(&nqn).ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no subsystem {nqn}")))
}

fn get_target(server: &Server, _: &Value) -> Result<Value, Error> {
    let st = &server.state;
    Ok(json!({
        "reactors": server.reactors(),
        "ports": st.ports().iter().map(|p| json!({"id": p.id, "addr": p.addr.to_string(), "kind": p.kind})).collect::<Vec<_>>(),
        "subsystems": st.subsystems().iter().map(|s| s.nqn.clone()).collect::<Vec<_>>(),
        "referrals": st.referrals(),
        "options": st.opts,
    }))
}

fn list_ports(server: &Server, _: &Value) -> Result<Value, Error> {
    Ok(json!(
        server
            .state
            .ports()
            .iter()
            .map(|p| json!({
                "id": p.id, "addr": p.addr.to_string(), "kind": p.kind,
                "delay_us": p.faults.delay_us.load(Ordering::Relaxed),
                "refuse_connects": p.faults.refuse_connects.load(Ordering::Relaxed),
                "ana": (1..=crate::port::ANA_GROUPS).filter_map(|g| {
                    let s = p.ana_state(AnaGrpId(g));
                    (s != AnaState::Optimized).then(|| json!({"group": g, "state": s.linux_name()}))
                }).collect::<Vec<_>>(),
            }))
            .collect::<Vec<_>>()
    ))
}

fn list_subsystems(server: &Server, _: &Value) -> Result<Value, Error> {
    Ok(json!(
        server
            .state
            .subsystems()
            .iter()
            .map(|s| {
                let (ns, _) = s.namespaces();
                let a = s.access();
                json!({
                    "nqn": s.nqn, "serial": s.serial, "model": s.model,
                    "allow_any_host": a.allow_any, "hosts": a.hosts, "auth_hosts": s.auth_hosts(), "host_keys": s.host_keys(),
                    "tls_keys": s.host_tls_keys().iter().map(|(h, k)| json!({
                        "host": h, "fingerprint": k.key.fingerprint(), "hash": k.key.hash().name(),
                        "key_file": k.file.as_ref().map(|f| f.display().to_string()),
                    })).collect::<Vec<_>>(),
                    "namespaces": ns.iter().map(|n| json!({
                        "nsid": n.nsid.0, "backend": format!("{:?}", n.backend), "size": n.size_bytes(),
                        "block_size": n.block_size(), "ana_group": n.anagrpid.0,
                        "uuid": nvme::nqn::format_uuid(&n.uuid), "qos": n.qos.get(),
                        "visible": match n.visibility() {
                            crate::namespace::Visibility::All => json!("all"),
                            crate::namespace::Visibility::Listed(h) => json!({"listed": h}),
                        },
                    })).collect::<Vec<_>>(),
                    "controllers": s.controllers().iter().map(|c| c.cntlid.0).collect::<Vec<_>>(),
                })
            })
            .collect::<Vec<_>>()
    ))
}

fn add_subsystem_(server: &Server, p: &Value) -> Result<Value, Error> {
    let mut cfg: SubsystemConfig = table("add_subsystem", p.clone())?;
    for n in &mut cfg.namespaces {
        new_namespace_uuid(n)?;
    }
    let s = add_subsystem(&server.state, &cfg)?;
    let a = s.access();
    let mut answer = json!({"nqn": s.nqn, "allow_any_host": a.allow_any, "hosts": a.hosts});
    if !a.allow_any && a.hosts.is_empty() {
        // The default subsystem is open; one added here is not unless asked: say so.
        let warning = "no host may connect: allow_any_host is false (the default) and no hosts are listed; \
                       add_host or set_allow_any_host allow=true lets hosts in";
        tracing::warn!(nqn = %s.nqn, "subsystem added closed: {warning}");
        answer["warning"] = json!(warning);
    }
    Ok(answer)
}

fn remove_subsystem(server: &Server, p: &Value) -> Result<Value, Error> {
    server.state.remove_subsystem(&param::<String>(p, "nqn")?)?;
    Ok(json!({}))
}

fn add_namespace_(server: &Server, p: &Value) -> Result<Value, Error> {
    let s = subsystem(server, p)?;
    let mut q = p.clone();
    if let Some(o) = q.as_object_mut() {
        o.remove("nqn");
    }
    let mut cfg: NamespaceConfig = table("add_namespace", q)?;
    new_namespace_uuid(&mut cfg)?;
    let nsid = add_namespace(&s, &cfg)?;
    Ok(json!({"nsid": nsid.0}))
}

/// A namespace added while the target runs is a new namespace, even under an NSID (or a
/// subsystem NQN) another one had: without a UUID of its own it gets a random one (Linux
/// nvmet makes a new UUID for each namespace too), so hosts do not take it for the one
/// removed. `save_config` and `--persist` keep the UUID, so it stays across restarts.
fn new_namespace_uuid(n: &mut NamespaceConfig) -> Result<(), Error> {
    if n.uuid.is_none() {
        n.uuid = Some(nvme::nqn::format_uuid(&random_uuid()?));
    }
    Ok(())
}

/// A random (version 4, RFC 9562 §5.4) UUID.
fn random_uuid() -> Result<[u8; 16], Error> {
    let mut u = [0u8; 16];
    nvme::auth::fill_random(&mut u).map_err(|e| {
        Error::new(ErrorKind::Backend, format!("a UUID for the namespace: the system's random source: {e}"))
    })?;
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    Ok(u)
}

fn remove_namespace(server: &Server, p: &Value) -> Result<Value, Error> {
    subsystem(server, p)?.remove_namespace(Nsid(param(p, "nsid")?))?;
    Ok(json!({}))
}

fn resize_namespace(server: &Server, p: &Value) -> Result<Value, Error> {
    let s = subsystem(server, p)?;
    let nsid: u32 = param(p, "nsid")?;
    let size = param::<crate::config::SizeValue>(p, "size")?.bytes()?;
    let (previous, size) = s.resize_namespace(Nsid(nsid), size)?;
    Ok(json!({"nsid": nsid, "size": size, "previous_size": previous}))
}

fn ns_host(server: &Server, p: &Value, add: bool) -> Result<Value, Error> {
    let s = subsystem(server, p)?;
    let nsid: u32 = param(p, "nsid")?;
    let host: String = param(p, "host")?;
    let changed = s.set_ns_host(Nsid(nsid), &host, add)?;
    Ok(json!({"changed": changed}))
}

fn ns_add_host(server: &Server, p: &Value) -> Result<Value, Error> {
    ns_host(server, p, true)
}

fn ns_remove_host(server: &Server, p: &Value) -> Result<Value, Error> {
    ns_host(server, p, false)
}

fn host_list(server: &Server, p: &Value, add: bool) -> Result<Value, Error> {
    let s = subsystem(server, p)?;
    let host: String = param(p, "host")?;
    let mut a: HostAccess = s.access();
    a.hosts.retain(|h| *h != host);
    if add {
        a.hosts.push(host);
    } else {
        // A removed host keeps no DH-HMAC-CHAP keys either.
        s.set_host_auth(&host, None);
        s.set_host_tls_key(&host, None);
    }
    let failed = server.state.set_host_access(&s, a);
    Ok(json!({"controllers_failed": failed}))
}

fn add_host(server: &Server, p: &Value) -> Result<Value, Error> {
    host_list(server, p, true)
}

fn remove_host(server: &Server, p: &Value) -> Result<Value, Error> {
    host_list(server, p, false)
}

fn set_allow_any_host(server: &Server, p: &Value) -> Result<Value, Error> {
    let s = subsystem(server, p)?;
    let mut a: HostAccess = s.access();
    a.allow_any = param(p, "allow")?;
    let failed = server.state.set_host_access(&s, a);
    Ok(json!({"controllers_failed": failed}))
}

fn set_host_auth(server: &Server, p: &Value) -> Result<Value, Error> {
    // Allows the host and sets (or, without dhchap_key, clears) its DH-HMAC-CHAP keys.
    let s = subsystem(server, p)?;
    let host: String = param(p, "host")?;
    let cfg = crate::config::HostAuthConfig {
        nqn: host.clone(),
        dhchap_key: opt(p, "dhchap_key")?,
        dhchap_ctrl_key: opt(p, "dhchap_ctrl_key")?,
        hash: opt(p, "hash")?,
        dhgroup: opt(p, "dhgroup")?,
        dhchap_key_file: opt(p, "dhchap_key_file")?,
        dhchap_ctrl_key_file: opt(p, "dhchap_ctrl_key_file")?,
        tls_key: None,
        tls_key_file: None,
    };
    let auth = cfg.to_host_auth()?;
    let mut a: HostAccess = s.access();
    if !a.hosts.contains(&host) {
        a.hosts.push(host.clone());
        server.state.set_host_access(&s, a);
    }
    s.set_host_auth(&host, auth);
    Ok(json!({}))
}

fn set_ana_state(server: &Server, p: &Value) -> Result<Value, Error> {
    let state: String = param(p, "state")?;
    let st = AnaState::parse(&state).ok_or_else(|| Error::new(ErrorKind::Config, format!("ANA state {state:?}")))?;
    let changed = server.state.set_ana_state(param(p, "port")?, AnaGrpId(param(p, "group")?), st)?;
    Ok(json!({"changed": changed}))
}

fn namespace_of(s: &Subsystem, nsid: u32) -> Result<Arc<crate::namespace::Namespace>, Error> {
    let (map, _) = s.namespaces();
    map.get(Nsid(nsid)).cloned().ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no NSID {nsid}")))
}

fn set_qos(server: &Server, p: &Value) -> Result<Value, Error> {
    let s = subsystem(server, p)?;
    let ns = namespace_of(&s, param(p, "nsid")?)?;
    let q = QosSettings {
        iops: opt(p, "iops")?.unwrap_or(0),
        bytes_per_sec: opt(p, "bytes_per_sec")?.unwrap_or(0),
        delay_us: opt(p, "delay_us")?.unwrap_or(0),
    };
    ns.qos.set(q);
    Ok(json!(q))
}

fn get_reservation(server: &Server, p: &Value) -> Result<Value, Error> {
    let s = subsystem(server, p)?;
    let ns = namespace_of(&s, param(p, "nsid")?)?;
    Ok(json!(ns.resv.snapshot()))
}

fn clear_reservation(server: &Server, p: &Value) -> Result<Value, Error> {
    let s = subsystem(server, p)?;
    let nsid: u32 = param(p, "nsid")?;
    let ns = namespace_of(&s, nsid)?;
    let n = ns
        .resv
        .clear()
        .map_err(|s| Error::new(ErrorKind::Io, format!("the cleared state could not be persisted ({s})")))?;
    tracing::warn!(nqn = %s.nqn, nsid, registrations = n, "reservation cleared by the operator");
    // The registrants' hosts hear that their reservation was preempted.
    crate::controller::notify_reservation(&s, Nsid(nsid), &ns.resv.take_notices());
    Ok(json!({"cleared_registrations": n}))
}

fn add_port(server: &Server, p: &Value) -> Result<Value, Error> {
    let kind: PortKind = opt(p, "kind")?.unwrap_or(PortKind::Io);
    let addr = crate::server::parse_addr(&param::<String>(p, "addr")?)?;
    let tls: crate::tls::TlsMode = opt(p, "tls")?.unwrap_or_default();
    let offload: crate::tls::TlsOffload = opt(p, "tls_offload")?.unwrap_or_default();
    let bound = server.add_port_secure(param(p, "id")?, addr, kind, tls, offload)?;
    Ok(json!({"addr": bound.to_string()}))
}

fn set_port_tls(server: &Server, p: &Value) -> Result<Value, Error> {
    let id: u16 = param(p, "id")?;
    let tls: crate::tls::TlsMode = param(p, "tls")?;
    let port = server.state.port(id).ok_or_else(|| Error::new(ErrorKind::NotFound, format!("port {id}")))?;
    port.tls.set(tls);
    server.state.discovery_changed();
    Ok(json!({}))
}

fn set_host_tls_key(server: &Server, p: &Value) -> Result<Value, Error> {
    // Allows the host and sets (or, without a key, removes) its TLS PSK.
    let s = subsystem(server, p)?;
    let host: String = param(p, "host")?;
    let cfg = crate::config::HostAuthConfig {
        nqn: host.clone(),
        tls_key: opt(p, "tls_key")?,
        tls_key_file: opt(p, "tls_key_file")?,
        ..Default::default()
    };
    let key = cfg.to_tls_key()?;
    let fingerprint = key.as_ref().map(|k| k.key.fingerprint());
    let mut a: HostAccess = s.access();
    if key.is_some() && !a.hosts.contains(&host) {
        a.hosts.push(host.clone());
        server.state.set_host_access(&s, a);
    }
    s.set_host_tls_key(&host, key);
    Ok(json!({"fingerprint": fingerprint}))
}

fn remove_port(server: &Server, p: &Value) -> Result<Value, Error> {
    server.remove_port(param(p, "id")?)?;
    Ok(json!({}))
}

fn referral(p: &Value) -> Result<crate::registry::Referral, Error> {
    crate::config::ReferralConfig {
        address: param(p, "address")?,
        port: opt(p, "port")?.unwrap_or(crate::registry::DISCOVERY_TRSVCID),
        subnqn: opt(p, "subnqn")?,
    }
    .to_referral()
}

fn add_referral(server: &Server, p: &Value) -> Result<Value, Error> {
    server.state.add_referral(referral(p)?)?;
    Ok(json!({}))
}

fn remove_referral(server: &Server, p: &Value) -> Result<Value, Error> {
    server.state.remove_referral(&referral(p)?)?;
    Ok(json!({}))
}

fn set_port_fault(server: &Server, p: &Value) -> Result<Value, Error> {
    let id: u16 = param(p, "port")?;
    let port = server.state.port(id).ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no port {id}")))?;
    let delay_us = opt::<u64>(p, "delay_us")?;
    let stall_opcode = opt::<i64>(p, "stall_opcode")?.map(|o| u64::try_from(o + 1).unwrap_or(0));
    // Checked before anything changes: a refused call changes nothing.
    for (name, value) in [("delay_us", delay_us), ("stall_opcode", stall_opcode)] {
        if value.is_some_and(|v| v != 0) && !crate::port::PortFaults::PER_COMMAND {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "port {id}: {name}: this target was built without per-command fault injection \
                     (the fault-injection feature); drop_connections and refuse_connects work"
                ),
            ));
        }
    }
    if let Some(d) = delay_us {
        port.faults.delay_us.store(d, Ordering::Relaxed);
    }
    if let Some(r) = opt::<bool>(p, "refuse_connects")? {
        port.faults.refuse_connects.store(r, Ordering::Relaxed);
    }
    if opt::<bool>(p, "drop_connections")?.unwrap_or(false) {
        port.faults.drop_generation.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(v) = stall_opcode {
        port.faults.stall_opcode.store(v, Ordering::Relaxed);
    }
    Ok(json!({}))
}

fn limits_json(st: &crate::registry::TargetState) -> Value {
    let refused: serde_json::Map<String, Value> =
        st.limits.refused().iter().map(|(r, n)| (r.name().to_string(), json!(n))).collect();
    json!({"limits": st.limits.get(), "refused": refused, "timeouts": st.limits.timeouts()})
}

fn get_limits(server: &Server, _: &Value) -> Result<Value, Error> {
    Ok(limits_json(&server.state))
}

fn set_limits(server: &Server, p: &Value) -> Result<Value, Error> {
    let s: crate::limits::LimitSettings = table("set_limits", p.clone())?;
    server.state.limits.set(&s).map_err(|e| Error::new(ErrorKind::Config, format!("set_limits: {e}")))?;
    Ok(limits_json(&server.state))
}

fn save_config(server: &Server, p: &Value) -> Result<Value, Error> {
    let path: Option<PathBuf> = opt(p, "path")?;
    Ok(json!(crate::persist::save(server, path.as_deref())?))
}

fn list_controllers(server: &Server, _: &Value) -> Result<Value, Error> {
    let st = &server.state;
    let mut all: Vec<_> = st.subsystems().iter().flat_map(|s| s.controllers()).map(|c| c.info()).collect();
    all.extend(st.discovery.controllers().iter().map(|c| c.info()));
    Ok(json!(all))
}

fn list_queues(server: &Server, _: &Value) -> Result<Value, Error> {
    Ok(json!(server.state.queues()))
}

fn stats(server: &Server, _: &Value) -> Result<Value, Error> {
    Ok(crate::metrics::stats_json(&server.state))
}

#[cfg(test)]
mod tests {
    use super::super::schema::Need;
    use super::*;

    fn names(params: &[Param]) -> Vec<&'static str> {
        let mut v: Vec<_> = params.iter().map(|p| p.name).collect();
        v.sort_unstable();
        v
    }

    /// The keys a config type serializes: its fields, as the TOML and RPC spell them.
    fn fields<T: serde::Serialize>(v: &T) -> Vec<String> {
        let mut v: Vec<String> = serde_json::to_value(v).unwrap().as_object().unwrap().keys().cloned().collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn the_tables_match_the_config_types_they_are_read_as() {
        // A field added to a config type without its parameter here would be refused as
        // unknown; a parameter here that the type lacks would fail in serde.
        let ns = NamespaceConfig::ram(1, "1M");
        assert_eq!(names(NAMESPACE_TABLE), fields(&ns));
        assert_eq!(names(&ADD_NAMESPACE[1..]), fields(&ns), "add_namespace = nqn + a namespace table");
        assert_eq!(names(ADD_SUBSYSTEM), fields(&SubsystemConfig::open("n", vec![])));
        assert_eq!(names(HOST_AUTH), fields(&crate::config::HostAuthConfig::default()));
        assert_eq!(names(SET_LIMITS), fields(&crate::limits::LimitSettings::default()));
        assert_eq!(names(QOS), fields(&QosSettings::default()));
        let r = crate::config::ReferralConfig { address: "10.0.0.1".into(), port: 8009, subnqn: None };
        assert_eq!(names(REFERRAL), fields(&r));
        assert_eq!(names(&SET_HOST_AUTH[2..]), names(&HOST_AUTH[1..7]));
        assert_eq!(names(&SET_HOST_TLS_KEY[2..]), names(&HOST_AUTH[7..]));
    }

    #[test]
    fn every_method_is_named_once_with_its_schema_and_changes_as_persist_saves() {
        let mut seen = std::collections::HashSet::new();
        for m in TARGET {
            assert!(seen.insert(m.name), "{} twice", m.name);
            assert!(!m.summary.is_empty() && !m.result.is_empty(), "{}", m.name);
            assert!(!m.summary.ends_with('.'), "{}: a one-line description has no final stop", m.name);
            let mut params = std::collections::HashSet::new();
            for p in m.params {
                assert!(params.insert(p.name), "{}: {} twice", m.name, p.name);
                assert!(!p.about.is_empty(), "{}.{}", m.name, p.name);
                if let Need::Default(d) = p.need {
                    let v: Value =
                        serde_json::from_str(d).unwrap_or_else(|e| panic!("{}.{}: {d}: {e}", m.name, p.name));
                    // The default passes the parameter's own check.
                    let check = Method { params: std::slice::from_ref(p), ..TARGET[0] };
                    check.check(&json!({p.name: v})).unwrap_or_else(|e| panic!("{}.{}: {e}", m.name, p.name));
                    assert!(!p.secret, "{}.{}: a secret has no default", m.name, p.name);
                }
            }
        }
        assert!(!seen.contains(super::super::schema::GET_METHODS), "every socket answers it; not in a table");
        // The keys, inline, are secrets; their files are not.
        let secret: Vec<_> = TARGET
            .iter()
            .flat_map(|m| m.params.iter().map(move |p| (m.name, p)))
            .filter(|(_, p)| p.secret)
            .map(|(m, p)| format!("{m}.{}", p.name))
            .collect();
        assert_eq!(secret, ["set_host_auth.dhchap_key", "set_host_auth.dhchap_ctrl_key", "set_host_tls_key.tls_key"]);
    }
}
