//! The TLS 1.3 handshake with an external PSK, run by OpenSSL over memory: bytes from the
//! peer go in, bytes for the peer come out, and nothing blocks (sans-I/O, like the NVMe/TCP
//! state machines). Once it is done, OpenSSL is dropped: the traffic secrets (captured
//! through its key-log callback, never written anywhere) seed this crate's own record layer.
//!
//! ```text
//!   client                                         server
//!   ClientHello(psk identity, binder, key_share) ─►  lookup(identity) → TLS PSK, binder check
//!                                                ◄─  ServerHello(psk, key_share) ... Finished
//!   Finished                                     ─►
//! ```
//!
//! Only TLS 1.3, only the two NVMe cipher suites, only a PSK (no certificate: a server with
//! no PSK for the identity fails the handshake; a client refuses a server that did not use
//! the PSK), `psk_dhe_ke` preferred (RFC 8446 §4.2.9; OpenSSL's default, as Linux's tlshd),
//! no session tickets.
//!
//! The PSK travels in an `SSL_SESSION` through OpenSSL's TLS 1.3 session PSK callbacks
//! ([`session`]), for both hashes: 01 with `TLS_AES_128_GCM_SHA256`, 02 with
//! `TLS_AES_256_GCM_SHA384` (NVMe/TCP 1.1 §3.6.1.1). One path for both, because OpenSSL's
//! "legacy" PSK callbacks, the only ones its Rust wrapper has, make every TLS 1.3 PSK a
//! SHA-256 one; two paths would be two ways to get the same thing wrong. The suite follows
//! the key: a client offers only its PSK's suite (as Linux's tlshd), and a server, which
//! picks its suite before it looks at PSKs, narrows its suites, from the ClientHello
//! callback, to the one named by the `<hh>` of the first offered identity it holds a key for
//! (and whose suite the client offers), else of the first identity that parses.

#[allow(unsafe_code)]
mod session;

use std::io::{Read, Write};
use std::sync::{Arc, Mutex, OnceLock};

use openssl::ex_data::Index;
use openssl::ssl::{
    ClientHelloResponse, ErrorCode, HandshakeError, MidHandshakeSslStream, Ssl, SslContext, SslContextBuilder,
    SslMethod, SslMode, SslOptions, SslRef, SslSession, SslStream, SslVerifyMode, SslVersion,
};
use zeroize::Zeroizing;

use crate::Error;
use crate::psk::{IDENTITY_MAX, Identity, PskHash, TlsPsk};
use crate::record::{Dir, Keys, Suite};

/// Most handshake bytes a peer may send before the handshake is done.
pub const HANDSHAKE_INPUT_MAX: usize = 64 * 1024;

/// Finds the TLS PSK for an identity a client presents (the target's key store).
pub trait PskLookup: Send + Sync {
    /// The TLS PSK for `identity`, if this end holds a key for it.
    fn lookup(&self, identity: &Identity) -> Option<TlsPsk>;

    /// Why this end holds no key for `identity`, when there is more to say than that (a key
    /// for the host and subsystem of the other hash, say). Never key material.
    fn refusal(&self, _identity: &Identity) -> Option<String> {
        None
    }
}

/// Per-connection state the OpenSSL callbacks fill in.
#[derive(Default)]
struct Shared {
    /// Client: what it presents. Server: what the client presented and was found.
    identity: Option<Identity>,
    /// Client: the identity as it goes on the wire (OpenSSL points at these bytes, which
    /// stay put until the connection is dropped).
    identity_wire: Box<[u8]>,
    /// Client: its PSK.
    psk: Option<TlsPsk>,
    /// Server: where the keys are.
    lookup: Option<Arc<dyn PskLookup>>,
    /// Why the server found no key (for the log; never the key).
    refused: Option<String>,
    /// Server: the hash of the suite chosen for the ClientHello's identities.
    hash: Option<PskHash>,
    client_secret: Option<Zeroizing<Vec<u8>>>,
    server_secret: Option<Zeroizing<Vec<u8>>>,
}

fn shared_index() -> Result<Index<Ssl, Mutex<Shared>>, Error> {
    static INDEX: OnceLock<Result<Index<Ssl, Mutex<Shared>>, String>> = OnceLock::new();
    INDEX
        .get_or_init(|| Ssl::new_ex_index().map_err(|e| e.to_string()))
        .clone()
        .map_err(|e| Error::internal(format!("OpenSSL ex_data: {e}")))
}

fn with_shared<R>(ssl: &openssl::ssl::SslRef, f: impl FnOnce(&mut Shared) -> R) -> Option<R> {
    let idx = shared_index().ok()?;
    let m = ssl.ex_data(idx)?;
    let mut g = m.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    Some(f(&mut g))
}

/// Parses a key-log line and keeps the application traffic secrets (RFC 8446 §7.1
/// `c ap traffic` / `s ap traffic`, as SSLKEYLOGFILE names them).
fn keylog(ssl: &openssl::ssl::SslRef, line: &str) {
    let mut parts = line.split(' ');
    let label = parts.next().unwrap_or("");
    let _random = parts.next();
    let Some(hex) = parts.next() else { return };
    let client = match label {
        "CLIENT_TRAFFIC_SECRET_0" => true,
        "SERVER_TRAFFIC_SECRET_0" => false,
        _ => return,
    };
    let mut bytes = Zeroizing::new(Vec::with_capacity(hex.len() / 2));
    let h = hex.as_bytes();
    for pair in h.chunks(2) {
        let v = std::str::from_utf8(pair).ok().and_then(|p| u8::from_str_radix(p, 16).ok());
        let Some(v) = v else { return };
        bytes.push(v);
    }
    with_shared(ssl, |s| {
        if client {
            s.client_secret = Some(bytes);
        } else {
            s.server_secret = Some(bytes);
        }
    });
}

fn base_context(server: bool) -> Result<SslContextBuilder, Error> {
    let e = |what: &str, err: openssl::error::ErrorStack| Error::internal(format!("OpenSSL {what}: {err}"));
    let method = if server { SslMethod::tls_server() } else { SslMethod::tls_client() };
    let mut b = SslContextBuilder::new(method).map_err(|x| e("context", x))?;
    b.set_min_proto_version(Some(SslVersion::TLS1_3)).map_err(|x| e("TLS 1.3 only", x))?;
    b.set_max_proto_version(Some(SslVersion::TLS1_3)).map_err(|x| e("TLS 1.3 only", x))?;
    // The two suites of NVMe/TCP; a connection narrows them to its PSK's (module docs).
    b.set_ciphersuites("TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384").map_err(|x| e("cipher suites", x))?;
    b.set_num_tickets(0).map_err(|x| e("tickets", x))?;
    b.set_options(SslOptions::NO_TICKET);
    // No certificate is ever accepted: a client without a trust store fails any
    // certificate-based handshake, and it also checks that the PSK was used.
    if server {
        // Resuming with a PSK needs a session id context when anything is verified.
        b.set_session_id_context(b"qpath-nvme-tcp").map_err(|x| e("session id context", x))?;
        b.set_verify(SslVerifyMode::NONE);
    } else {
        b.set_verify(SslVerifyMode::PEER);
    }
    b.set_mode(SslMode::ACCEPT_MOVING_WRITE_BUFFER);
    b.set_keylog_callback(keylog);
    Ok(b)
}

/// The server side's shared configuration (one per port): how identities find their PSK.
pub struct ServerConfig {
    ctx: SslContext,
    lookup: Arc<dyn PskLookup>,
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerConfig")
    }
}

impl ServerConfig {
    /// A server that takes the PSKs `lookup` finds.
    pub fn new(lookup: Arc<dyn PskLookup>) -> Result<ServerConfig, Error> {
        let mut b = base_context(true)?;
        b.set_client_hello_callback(|ssl, _alert| {
            narrow_suites(ssl)?;
            Ok(ClientHelloResponse::SUCCESS)
        });
        session::set_server_callback(&mut b);
        Ok(ServerConfig { ctx: b.build(), lookup })
    }
}

/// The server's suite for a ClientHello: the one named by the first offered PSK identity
/// this server holds a key for and whose suite the client offers, or, if none is, by the
/// first identity that parses (OpenSSL picks the suite before it looks at PSKs, and takes a
/// PSK only of the suite's hash). A client that does not offer that suite is told why, in
/// the log.
fn narrow_suites(ssl: &mut SslRef) -> Result<(), openssl::error::ErrorStack> {
    let offered = session::client_hello_identities(ssl);
    let ciphers = ssl.client_hello_ciphers().map(<[u8]>::to_vec).unwrap_or_default();
    let offers = |suite: Suite| ciphers.chunks_exact(2).any(|p| p == suite.id());
    let lookup = with_shared(ssl, |s| s.lookup.clone()).flatten();
    let holds = |bytes: &[u8]| lookup.as_deref().is_some_and(|l| server_psk(l, bytes).is_ok());
    // An identity that does not parse is refused by the PSK lookup, with its reason.
    let Some(id) = choose_identity(offered.iter().map(Vec::as_slice), holds, offers) else { return Ok(()) };
    let suite = id.hash.suite();
    with_shared(ssl, |s| {
        s.hash = Some(id.hash);
        if !offers(suite) {
            s.refused = Some(format!(
                "identity {id} names hash {:02}, and the client does not offer its cipher suite {}",
                id.hash.id(),
                suite.name()
            ));
        }
    });
    ssl.set_ciphersuites(suite.name())
}

/// Which offered identity names the connection's suite: the first one `holds` a key for
/// whose suite the client `offers`; else the first one that parses.
fn choose_identity<'a>(
    offered: impl Iterator<Item = &'a [u8]> + Clone,
    holds: impl Fn(&[u8]) -> bool,
    offers: impl Fn(Suite) -> bool,
) -> Option<Identity> {
    let usable = offered.clone().find_map(|b| {
        let id = Identity::parse(b).ok()?;
        (offers(id.hash.suite()) && holds(b)).then_some(id)
    });
    usable.or_else(|| offered.into_iter().find_map(|b| Identity::parse(b).ok()))
}

/// The server's session callback: the session for an identity the client offers, or none
/// (the reason kept for the log).
fn server_find(ssl: &SslRef, identity: &[u8]) -> Option<SslSession> {
    with_shared(ssl, |s| {
        let lookup = s.lookup.clone()?;
        // OpenSSL would skip a session of another hash than the chosen suite's; skipping
        // it here keeps the identity and the refusal those of the identities that count.
        if let (Some(hash), Ok(id)) = (s.hash, Identity::parse(identity))
            && id.hash != hash
        {
            return None;
        }
        let found = server_psk(&*lookup, identity).and_then(|(id, psk)| {
            let session = session::psk_session(ssl, psk.hash().suite(), psk.bytes())
                .map_err(|e| format!("identity {id}: OpenSSL refused its PSK session: {e}"))?;
            Ok((id, session))
        });
        match found {
            Ok((id, session)) => {
                s.identity = Some(id);
                Some(session)
            }
            Err(why) => {
                s.refused = Some(why);
                None
            }
        }
    })
    .flatten()
}

fn server_psk(lookup: &dyn PskLookup, identity: &[u8]) -> Result<(Identity, TlsPsk), String> {
    if identity.is_empty() {
        return Err("the client presented no PSK identity".to_string());
    }
    let id = Identity::parse(identity).map_err(|e| e.to_string())?;
    let psk = match lookup.lookup(&id) {
        Some(psk) => psk,
        None => return Err(lookup.refusal(&id).unwrap_or_else(|| format!("no TLS key for identity {id}"))),
    };
    check_psk(&id, &psk).map_err(|e| e.to_string())?;
    Ok((id, psk))
}

/// A PSK fits its identity: the same hash, and the hash's length (NVMe/TCP 1.1 §3.6.1.3).
fn check_psk(id: &Identity, psk: &TlsPsk) -> Result<(), Error> {
    if psk.hash() != id.hash {
        return Err(Error::key(format!(
            "identity {id} names hash {:02}, and its TLS PSK is of hash {:02}",
            id.hash.id(),
            psk.hash().id()
        )));
    }
    if psk.bytes().len() != psk.hash().len() {
        return Err(Error::key(format!(
            "a TLS PSK of hash {:02} ({}) is {} bytes, not {}",
            psk.hash().id(),
            psk.hash().name(),
            psk.hash().len(),
            psk.bytes().len()
        )));
    }
    Ok(())
}

/// The client side's shared configuration.
pub struct ClientConfig {
    ctx: SslContext,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientConfig")
    }
}

impl ClientConfig {
    /// The process-wide client configuration (each connection brings its identity and PSK).
    pub fn shared() -> Result<Arc<ClientConfig>, Error> {
        static CLIENT: OnceLock<Result<Arc<ClientConfig>, String>> = OnceLock::new();
        CLIENT
            .get_or_init(|| ClientConfig::new().map(Arc::new).map_err(|e| e.to_string()))
            .clone()
            .map_err(Error::internal)
    }

    fn new() -> Result<ClientConfig, Error> {
        let mut b = base_context(false)?;
        session::set_client_callback(&mut b);
        Ok(ClientConfig { ctx: b.build() })
    }
}

/// The client's session callback: the connection's identity and a session with its PSK.
fn client_offer(ssl: &SslRef) -> Option<session::Offer> {
    with_shared(ssl, |s| {
        let psk = s.psk.as_ref()?;
        let session = session::psk_session(ssl, psk.hash().suite(), psk.bytes()).ok()?;
        Some(session::Offer { identity: s.identity_wire.as_ptr(), identity_len: s.identity_wire.len(), session })
    })
    .flatten()
}

/// Bytes in and out of OpenSSL.
#[derive(Default)]
struct MemIo {
    input: Vec<u8>,
    pos: usize,
    output: Vec<u8>,
}

impl Read for MemIo {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let avail = &self.input[self.pos..];
        if avail.is_empty() {
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        let n = avail.len().min(buf.len());
        buf[..n].copy_from_slice(&avail[..n]);
        self.pos += n;
        Ok(n)
    }
}

impl Write for MemIo {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.output.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

enum Stage {
    Start(Ssl),
    Mid(MidHandshakeSslStream<MemIo>),
    Done,
}

/// What a finished handshake leaves: the keys of both directions and who is at the other end.
pub struct Established {
    /// The negotiated cipher suite.
    pub suite: Suite,
    /// Keys for records this end sends.
    pub seal: Keys,
    /// Keys for records this end receives.
    pub open: Keys,
    /// The PSK identity (the client's, on both ends).
    pub identity: Identity,
    /// Bytes that came after the handshake (already records).
    pub leftover: Vec<u8>,
}

impl std::fmt::Debug for Established {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Established").field("suite", &self.suite).field("identity", &self.identity).finish()
    }
}

/// Where a handshake is.
#[derive(Debug)]
pub enum Progress {
    /// Waiting for more bytes from the peer.
    NeedInput,
    /// Done.
    Done(Box<Established>),
}

/// A handshake in progress.
pub struct Handshake {
    server: bool,
    stage: Stage,
    /// Bytes for the peer not yet taken.
    output: Vec<u8>,
    input_total: usize,
}

impl std::fmt::Debug for Handshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handshake").field("server", &self.server).field("input_total", &self.input_total).finish()
    }
}

impl Handshake {
    /// The server side of a handshake on a new connection.
    pub fn server(cfg: &ServerConfig) -> Result<Handshake, Error> {
        let mut ssl = Ssl::new(&cfg.ctx).map_err(|e| Error::internal(format!("OpenSSL: {e}")))?;
        let shared = Shared { lookup: Some(Arc::clone(&cfg.lookup)), ..Shared::default() };
        ssl.set_ex_data(shared_index()?, Mutex::new(shared));
        ssl.set_accept_state();
        Ok(Handshake { server: true, stage: Stage::Start(ssl), output: Vec::new(), input_total: 0 })
    }

    /// The client side, presenting `identity` with `psk`; its ClientHello is ready at once.
    pub fn client(cfg: &ClientConfig, identity: Identity, psk: TlsPsk) -> Result<Handshake, Error> {
        // Only the PSK's suite: a server picks its suite before it looks at the PSK.
        let suites = psk.hash().suite().name();
        Handshake::client_offering(cfg, identity, psk, suites)
    }

    /// The client side, offering the TLS 1.3 cipher suites `suites` (OpenSSL's list syntax).
    fn client_offering(cfg: &ClientConfig, identity: Identity, psk: TlsPsk, suites: &str) -> Result<Handshake, Error> {
        if identity.to_string().len() > IDENTITY_MAX {
            return Err(Error::identity(format!(
                "the PSK identity of {} and {} is longer than the {IDENTITY_MAX} bytes TLS here carries",
                identity.hostnqn, identity.subnqn
            )));
        }
        check_psk(&identity, &psk)?;
        let mut ssl = Ssl::new(&cfg.ctx).map_err(|e| Error::internal(format!("OpenSSL: {e}")))?;
        ssl.set_ciphersuites(suites).map_err(|e| Error::internal(format!("OpenSSL cipher suites: {e}")))?;
        let identity_wire = identity.to_string().into_bytes().into_boxed_slice();
        ssl.set_ex_data(
            shared_index()?,
            Mutex::new(Shared { identity: Some(identity), identity_wire, psk: Some(psk), ..Shared::default() }),
        );
        ssl.set_connect_state();
        let mut h = Handshake { server: false, stage: Stage::Start(ssl), output: Vec::new(), input_total: 0 };
        match h.step(&[])? {
            Progress::NeedInput => Ok(h),
            Progress::Done(_) => Err(Error::internal("a TLS handshake cannot finish before the peer answers")),
        }
    }

    /// Bytes to send to the peer (handshake messages, or the alert of a failed handshake).
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.output)
    }

    /// Whether bytes wait for [`Handshake::take_output`].
    pub fn has_output(&self) -> bool {
        !self.output.is_empty()
    }

    /// Feeds bytes from the peer and runs the handshake as far as they go. An error is
    /// final; its alert (if OpenSSL made one) waits in [`Handshake::take_output`].
    pub fn step(&mut self, input: &[u8]) -> Result<Progress, Error> {
        self.input_total += input.len();
        if self.input_total > HANDSHAKE_INPUT_MAX {
            self.stage = Stage::Done;
            return Err(Error::handshake("the peer sent more than 64 KiB of handshake"));
        }
        let result = match std::mem::replace(&mut self.stage, Stage::Done) {
            Stage::Start(ssl) => {
                let io = MemIo { input: input.to_vec(), ..MemIo::default() };
                ssl.accept_or_connect(io, self.server)
            }
            Stage::Mid(mut mid) => {
                let io = mid.get_mut();
                io.input.drain(..io.pos);
                io.pos = 0;
                io.input.extend_from_slice(input);
                mid.handshake()
            }
            Stage::Done => return Err(Error::handshake("the handshake already ended")),
        };
        match result {
            Ok(mut stream) => {
                let io = stream.get_mut();
                self.output.append(&mut io.output);
                let leftover = io.input[io.pos..].to_vec();
                let est = finish(&stream, self.server, leftover)?;
                Ok(Progress::Done(Box::new(est)))
            }
            Err(HandshakeError::WouldBlock(mut mid)) => {
                self.output.append(&mut mid.get_mut().output);
                self.stage = Stage::Mid(mid);
                Ok(Progress::NeedInput)
            }
            Err(HandshakeError::Failure(mut mid)) => {
                self.output.append(&mut mid.get_mut().output);
                let refused = with_shared(mid.ssl(), |s| s.refused.take()).flatten();
                let reason = mid.error().ssl_error().and_then(|st| st.errors().first()).and_then(|e| e.reason());
                let why = match (refused, reason, mid.error().code()) {
                    (Some(r), _, _) => r,
                    (None, Some(r), ErrorCode::SSL) => r.to_string(),
                    (None, _, _) => mid.error().to_string(),
                };
                Err(Error::handshake(why))
            }
            Err(HandshakeError::SetupFailure(e)) => Err(Error::internal(format!("OpenSSL: {e}"))),
        }
    }
}

trait AcceptOrConnect {
    fn accept_or_connect(self, io: MemIo, server: bool) -> Result<SslStream<MemIo>, HandshakeError<MemIo>>;
}

impl AcceptOrConnect for Ssl {
    fn accept_or_connect(self, io: MemIo, server: bool) -> Result<SslStream<MemIo>, HandshakeError<MemIo>> {
        if server { self.accept(io) } else { self.connect(io) }
    }
}

fn finish(stream: &SslStream<MemIo>, server: bool, leftover: Vec<u8>) -> Result<Established, Error> {
    let ssl = stream.ssl();
    // A client must see the PSK used: a certificate handshake proves nothing here.
    if !ssl.session_reused() {
        return Err(Error::handshake("the server did not use the pre-shared key"));
    }
    let suite = ssl
        .current_cipher()
        .and_then(|c| Suite::from_id(c.protocol_id()))
        .ok_or_else(|| Error::handshake("a cipher suite NVMe/TCP does not use"))?;
    let (identity, client, server_secret) =
        with_shared(ssl, |s| (s.identity.take(), s.client_secret.take(), s.server_secret.take()))
            .ok_or_else(|| Error::internal("handshake state lost"))?;
    let identity = identity.ok_or_else(|| Error::handshake("no PSK identity"))?;
    if suite.hash() != identity.hash {
        return Err(Error::handshake(format!(
            "identity {identity} names hash {:02}, and the suite is {}",
            identity.hash.id(),
            suite.name()
        )));
    }
    let (Some(c), Some(s)) = (client, server_secret) else {
        return Err(Error::internal("OpenSSL did not give the traffic secrets"));
    };
    let (seal, open) = if server { (s, c) } else { (c, s) };
    Ok(Established {
        suite,
        seal: Keys::new(suite, Dir::Seal, &seal)?,
        open: Keys::new(suite, Dir::Open, &open)?,
        identity,
        leftover,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::psk::{ConfiguredPsk, Derivation, IdentityVersion, PskHash};

    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0f0e0d0c-0b0a-0908-0706-050403020100";
    const SUB: &str = "nqn.2026-11.io.qpath:s1";

    struct Store(ConfiguredPsk);
    impl PskLookup for Store {
        fn lookup(&self, id: &Identity) -> Option<TlsPsk> {
            self.0.retained(&id.hostnqn, Derivation::Standard).tls_psk(id)
        }
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// Runs a client and a server handshake against each other in memory.
    fn run(mut c: Handshake, mut s: Handshake) -> (Result<Established, Error>, Result<Established, Error>) {
        let (mut c_done, mut s_done) = (None, None);
        let mut to_server = c.take_output();
        for _ in 0..8 {
            if s_done.is_none() && !to_server.is_empty() {
                match s.step(&std::mem::take(&mut to_server)) {
                    Ok(Progress::Done(e)) => s_done = Some(Ok(*e)),
                    Ok(Progress::NeedInput) => {}
                    Err(e) => s_done = Some(Err(e)),
                }
            }
            let to_client = s.take_output();
            if c_done.is_none() && !to_client.is_empty() {
                match c.step(&to_client) {
                    Ok(Progress::Done(e)) => c_done = Some(Ok(*e)),
                    Ok(Progress::NeedInput) => {}
                    Err(e) => c_done = Some(Err(e)),
                }
                to_server = c.take_output();
            }
            if c_done.is_some() && s_done.is_some() {
                break;
            }
        }
        let pending = || Err(Error::handshake("still running"));
        (c_done.unwrap_or_else(pending), s_done.unwrap_or_else(pending))
    }

    fn client_and_server(
        server_key: &ConfiguredPsk,
        client_key: &ConfiguredPsk,
        suites: Option<&str>,
    ) -> (Handshake, Handshake) {
        let cfg = ServerConfig::new(Arc::new(Store(server_key.clone()))).unwrap();
        let r = client_key.retained(HOST, Derivation::Standard);
        let id = r.identity(IdentityVersion::V1, HOST, SUB);
        let psk = r.tls_psk(&id).unwrap();
        let client_cfg = ClientConfig::shared().unwrap();
        let c = match suites {
            Some(list) => Handshake::client_offering(&client_cfg, id, psk, list).unwrap(),
            None => Handshake::client(&client_cfg, id, psk).unwrap(),
        };
        (c, Handshake::server(&cfg).unwrap())
    }

    /// The session the callbacks hand OpenSSL: the PSK as its master key, the suite of the
    /// PSK's hash, TLS 1.3.
    #[test]
    fn a_psk_session_carries_key_suite_and_version() {
        let ctx = base_context(false).unwrap().build();
        let ssl = Ssl::new(&ctx).unwrap();
        for (suite, len) in [(Suite::Aes128GcmSha256, 32), (Suite::Aes256GcmSha384, 48)] {
            let key: Vec<u8> = (0..len).map(|i: u8| i ^ 0x5a).collect();
            let sess = session::psk_session(&ssl, suite, &key).unwrap();
            assert_eq!(sess.master_key_len(), len.into());
            let mut got = vec![0u8; 64];
            let n = sess.master_key(&mut got);
            assert!(got[..n] == key[..], "the master key is the PSK");
            assert_eq!(sess.protocol_version(), SslVersion::TLS1_3);
            assert_eq!(session::cipher_id(&sess), Some(suite.id()), "{}", suite.name());
        }
    }

    /// The pre_shared_key extension's identities, from bytes that may lie.
    fn psk_ext(ids: &[&[u8]]) -> Vec<u8> {
        let mut list = Vec::new();
        for id in ids {
            list.extend_from_slice(&u16::try_from(id.len()).unwrap().to_be_bytes());
            list.extend_from_slice(id);
            list.extend_from_slice(&[0, 0, 0, 0]);
        }
        let mut ext = u16::try_from(list.len()).unwrap().to_be_bytes().to_vec();
        ext.extend_from_slice(&list);
        ext.extend_from_slice(&[0, 33, 32]); // binders follow
        ext
    }

    fn all(e: &[u8]) -> Vec<&[u8]> {
        session::offered_identities(e).collect()
    }

    #[test]
    fn the_offered_identities_are_read_within_their_lengths() {
        let (a, b) = (&b"NVMe1R02 nqn.h nqn.s abc="[..], &b"NVMe0R01 nqn.h nqn.s"[..]);
        let ext = psk_ext(&[a, b]);
        assert_eq!(all(&ext), vec![a, b]);
        let first_end = 2 + 2 + a.len() + 4;
        for cut in 0..first_end {
            assert!(all(&ext[..cut]).is_empty(), "cut at {cut}");
        }
        for cut in first_end..first_end + 2 + b.len() + 4 {
            assert_eq!(all(&ext[..cut]), Vec::<&[u8]>::new(), "the list's length is past the cut at {cut}");
        }
        let mut long = ext.clone();
        long[3] = 0xff; // the first identity longer than its list
        assert!(all(&long).is_empty());
        let mut second_long = ext.clone();
        second_long[first_end + 1] = 0xff; // the second longer than what is left
        assert_eq!(all(&second_long), vec![a]);
        assert!(all(&psk_ext(&[b"", b""])).is_empty(), "empty identities");
        let many: Vec<&[u8]> = vec![a; 40];
        assert_eq!(all(&psk_ext(&many)).len(), session::IDENTITIES_MAX);
    }

    /// With several identities offered, the suite is the first usable one's: one the server
    /// holds a key for, whose suite the client offers; else the first that parses.
    #[test]
    fn the_suite_is_the_first_identity_the_server_can_use() {
        let k = ConfiguredPsk::generate(PskHash::Sha384).unwrap();
        let r = k.retained(HOST, Derivation::Standard);
        let held = r.identity(IdentityVersion::V1, HOST, SUB).to_string();
        let other = format!("NVMe1R01 {HOST} {SUB} {}", &held[held.rfind(' ').unwrap() + 1..]);
        let store = Store(k.clone());
        let holds = |b: &[u8]| server_psk(&store, b).is_ok();
        let both = |_: Suite| true;
        let pick = |ids: &[&[u8]], offers: &dyn Fn(Suite) -> bool| {
            choose_identity(ids.iter().copied(), holds, offers).map(|i| i.hash)
        };
        let (h, o) = (held.as_bytes(), other.as_bytes());
        assert_eq!(pick(&[o, h], &both), Some(PskHash::Sha384), "a key for the second, none for the first");
        assert_eq!(pick(&[h, o], &both), Some(PskHash::Sha384));
        assert_eq!(pick(&[b"garbage", h], &both), Some(PskHash::Sha384));
        let only_128 = |s: Suite| s == Suite::Aes128GcmSha256;
        assert_eq!(pick(&[h, o], &only_128), Some(PskHash::Sha384), "no usable one: the first that parses");
        assert_eq!(pick(&[o], &both), Some(PskHash::Sha256), "no key: the first that parses, to refuse");
        assert_eq!(pick(&[b"garbage"], &both), None);
    }

    /// Hash 02 on both ends: TLS_AES_256_GCM_SHA384, with traffic secrets of SHA-384's
    /// length that open each other's records.
    #[test]
    fn a_sha384_key_handshakes_with_aes_256() {
        let k = ConfiguredPsk::generate(PskHash::Sha384).unwrap();
        let (c, s) = client_and_server(&k, &k, None);
        let (c, s) = run(c, s);
        let (mut c, mut s) = (c.unwrap(), s.unwrap());
        assert_eq!((c.suite, s.suite), (Suite::Aes256GcmSha384, Suite::Aes256GcmSha384));
        assert_eq!(s.identity.hash, PskHash::Sha384);
        assert!(s.identity.to_string().starts_with("NVMe1R02 "), "{}", s.identity);
        let mut wire = Vec::new();
        crate::record::seal_bytes(&mut c.seal, crate::record::content::APPLICATION_DATA, b"an ICReq", &mut wire)
            .unwrap();
        let (ty, n) = crate::record::open(&mut s.open, &mut wire, None).unwrap();
        assert_eq!(ty, crate::record::content::APPLICATION_DATA);
        assert_eq!(&wire[crate::record::HEADER_LEN..crate::record::HEADER_LEN + n], b"an ICReq");
    }

    /// A client that offers both suites, AES-128 first, with a hash-02 identity: the server
    /// takes the suite the identity names (OpenSSL alone would pick AES-128 and ignore the
    /// PSK). One that offers only AES-128 is refused, and the server says why.
    #[test]
    fn the_server_takes_the_suite_the_identity_names() {
        let k = ConfiguredPsk::generate(PskHash::Sha384).unwrap();
        let (c, s) = client_and_server(&k, &k, Some("TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384"));
        let (c, s) = run(c, s);
        assert_eq!(c.unwrap().suite, Suite::Aes256GcmSha384);
        assert_eq!(s.unwrap().suite, Suite::Aes256GcmSha384);
        let (c, s) = client_and_server(&k, &k, Some("TLS_AES_128_GCM_SHA256"));
        let (c, s) = run(c, s);
        assert!(c.is_err());
        let e = s.unwrap_err().to_string();
        assert!(e.contains("does not offer its cipher suite TLS_AES_256_GCM_SHA384"), "{e}");
    }

    /// A wrong key of hash 02 fails the binder check; a client whose key is of the other
    /// hash than the server's finds no key.
    #[test]
    fn wrong_or_other_hash_keys_are_refused() {
        let k = ConfiguredPsk::generate(PskHash::Sha384).unwrap();
        let other = ConfiguredPsk::generate(PskHash::Sha384).unwrap();
        let (c, s) = client_and_server(&k, &other, None);
        let (c, s) = run(c, s);
        assert!(c.is_err() && s.is_err(), "a wrong key never makes a channel");
        let k256 = ConfiguredPsk::generate(PskHash::Sha256).unwrap();
        let (c, s) = client_and_server(&k, &k256, None);
        let (c, s) = run(c, s);
        assert!(c.is_err());
        let e = s.unwrap_err().to_string();
        assert!(e.contains("no TLS key for identity NVMe1R01"), "{e}");
        let secret = hex(&k
            .retained(HOST, Derivation::Standard)
            .tls_psk(&k.retained(HOST, Derivation::Standard).identity(IdentityVersion::V1, HOST, SUB))
            .unwrap()
            .bytes()[..8]);
        assert!(!e.contains(&secret), "no key in the error");
    }

    /// A PSK that does not fit its identity is refused before anything is sent.
    #[test]
    fn a_psk_that_does_not_fit_its_identity_is_refused() {
        let k = ConfiguredPsk::generate(PskHash::Sha256).unwrap();
        let r = k.retained(HOST, Derivation::Standard);
        let id = r.identity(IdentityVersion::V1, HOST, SUB);
        let cfg = ClientConfig::shared().unwrap();
        let e = Handshake::client(&cfg, id.clone(), TlsPsk::from_bytes(PskHash::Sha384, &[1; 48])).unwrap_err();
        assert!(e.to_string().contains("names hash 01, and its TLS PSK is of hash 02"), "{e}");
        let e = Handshake::client(&cfg, id, TlsPsk::from_bytes(PskHash::Sha256, &[1; 48])).unwrap_err();
        assert!(e.to_string().contains("hash 01 (sha256) is 32 bytes, not 48"), "{e}");
    }
}
