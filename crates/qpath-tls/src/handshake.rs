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
//! no session tickets. OpenSSL's "legacy" PSK callbacks give TLS 1.3 PSKs of SHA-256 only
//! (`TLS_AES_128_GCM_SHA256`); SHA-384 keys are refused with a clear error (see the README).

use std::io::{Read, Write};
use std::sync::{Arc, Mutex, OnceLock};

use openssl::ex_data::Index;
use openssl::ssl::{
    ErrorCode, HandshakeError, MidHandshakeSslStream, Ssl, SslContext, SslContextBuilder, SslMethod, SslMode,
    SslOptions, SslStream, SslVerifyMode, SslVersion,
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
}

/// Per-connection state the OpenSSL callbacks fill in.
#[derive(Default)]
struct Shared {
    /// Client: what it presents. Server: what the client presented and was found.
    identity: Option<Identity>,
    psk: Option<TlsPsk>,
    /// Why the server found no key (for the log; never the key).
    refused: Option<String>,
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
    // The legacy PSK callbacks carry SHA-256 PSKs in TLS 1.3 (see the module docs).
    b.set_ciphersuites("TLS_AES_128_GCM_SHA256").map_err(|x| e("cipher suites", x))?;
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
        b.set_psk_server_callback(move |ssl, identity, out| {
            let found = server_psk(&*lookup, identity);
            let len = match &found {
                Ok((_, psk)) if psk.bytes().len() <= out.len() => {
                    out[..psk.bytes().len()].copy_from_slice(psk.bytes());
                    psk.bytes().len()
                }
                _ => 0,
            };
            with_shared(ssl, |s| match found {
                Ok((id, psk)) => {
                    s.identity = Some(id);
                    s.psk = Some(psk);
                }
                Err(why) => s.refused = Some(why),
            });
            // 0: no PSK; OpenSSL then finds no way to authenticate and fails the handshake.
            Ok(len)
        });
        Ok(ServerConfig { ctx: b.build() })
    }
}

fn server_psk(lookup: &dyn PskLookup, identity: Option<&[u8]>) -> Result<(Identity, TlsPsk), String> {
    let bytes = identity.ok_or_else(|| "the client presented no PSK identity".to_string())?;
    let id = Identity::parse(bytes).map_err(|e| e.to_string())?;
    if id.hash != PskHash::Sha256 {
        return Err(format!("identity {id}: SHA-384 PSKs are not supported yet"));
    }
    match lookup.lookup(&id) {
        Some(psk) => Ok((id, psk)),
        None => Err(format!("no TLS key for identity {id}")),
    }
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
        b.set_psk_client_callback(|ssl, _hint, identity_out, psk_out| {
            let r = with_shared(ssl, |s| {
                let (Some(id), Some(psk)) = (&s.identity, &s.psk) else { return 0 };
                let id = id.to_string();
                // The identity goes out NUL-terminated; both must fit OpenSSL's buffers.
                if id.len() >= identity_out.len() || psk.bytes().len() > psk_out.len() {
                    return 0;
                }
                identity_out[..id.len()].copy_from_slice(id.as_bytes());
                identity_out[id.len()] = 0;
                psk_out[..psk.bytes().len()].copy_from_slice(psk.bytes());
                psk.bytes().len()
            });
            Ok(r.unwrap_or(0))
        });
        Ok(ClientConfig { ctx: b.build() })
    }
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
        ssl.set_ex_data(shared_index()?, Mutex::new(Shared::default()));
        ssl.set_accept_state();
        Ok(Handshake { server: true, stage: Stage::Start(ssl), output: Vec::new(), input_total: 0 })
    }

    /// The client side, presenting `identity` with `psk`; its ClientHello is ready at once.
    pub fn client(cfg: &ClientConfig, identity: Identity, psk: TlsPsk) -> Result<Handshake, Error> {
        if identity.to_string().len() > IDENTITY_MAX {
            return Err(Error::identity(format!(
                "the PSK identity of {} and {} is longer than the {IDENTITY_MAX} bytes TLS here carries",
                identity.hostnqn, identity.subnqn
            )));
        }
        if psk.hash() != PskHash::Sha256 {
            return Err(Error::key("SHA-384 TLS keys (hash 02) are not supported yet; use a key of hash 01"));
        }
        let mut ssl = Ssl::new(&cfg.ctx).map_err(|e| Error::internal(format!("OpenSSL: {e}")))?;
        ssl.set_ex_data(
            shared_index()?,
            Mutex::new(Shared { identity: Some(identity), psk: Some(psk), ..Shared::default() }),
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
