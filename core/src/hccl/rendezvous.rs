//! The job's TCP rendezvous: rank 0 hands an opaque payload (the HCCL unique id, at most
//! [`MAX_PAYLOAD`] bytes) to the other ranks of the job, over `std::net` and plain threads.
//!
//! Owns: the wire protocol, the job secret ([`JobSecret`]), [`serve`] (rank 0) and [`fetch`]
//! (every other rank). Must not touch: the environment (see `bootstrap`), HCCL or the device.
//!
//! # Protocol (version 1, all integers little-endian, every message is a `u32` length + body)
//! 1. server → client, challenge: `"DCRDV1"`, version `u16`, server nonce `[u8; 32]`.
//! 2. client → server, hello: `"DCRDV1"`, version `u16`, rank `u32`, world size `u32`, client
//!    nonce `[u8; 32]`, proof `[u8; 32]` = HMAC-SHA256(secret, `"hello"` || server nonce || the
//!    hello's first 48 bytes).
//! 3. server → client, reply: `0`, tag `[u8; 32]` = HMAC-SHA256(secret, `"reply"` || server
//!    nonce || client nonce || rank || payload), payload; or `1`, reason (UTF-8, unauthenticated).
//!
//! # Threat model
//! The secret never crosses the wire: each side proves it knows it with an HMAC over fresh
//! nonces (RFC 2104, so no length extension and no replay of a recorded hello). The client also
//! checks the server's tag, so a stale or foreign server on the port cannot hand out a forged
//! id. Nothing is encrypted: the unique id is visible to anyone who can sniff the network (it
//! only says where HCCL's own coordinator listens). A peer without the secret is refused, logged
//! with `tracing::warn!` and does not count as a rank. Every read has a size bound
//! ([`MAX_MESSAGE`]) and a deadline; at most [`MAX_PENDING`] handshakes run at once, each for at
//! most [`HANDSHAKE_TIMEOUT`], so bad peers cannot make the server hang or allocate without bound.
#![forbid(unsafe_code)]

use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hmac::{Hmac, KeyInit, Mac};
use rand::RngCore;
use sha2::Sha256;

/// Protocol magic, first bytes of the challenge and the hello.
pub const MAGIC: &[u8; 6] = b"DCRDV1";
/// Protocol version.
pub const VERSION: u16 = 1;
/// Largest payload in bytes (the HCCL unique id is 1032 bytes: `habana_api.md` §4).
pub const MAX_PAYLOAD: usize = 4096;
/// Largest message body in bytes that the server reads from a client; a longer declared length
/// is refused before anything is allocated.
pub const MAX_MESSAGE: usize = 4096;
/// Most handshakes in flight at once; further connections are closed at once (and logged).
pub const MAX_PENDING: usize = 64;
/// Longest one connection may take to complete its handshake (capped by the server deadline).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Shortest job secret in bytes (128 bits).
pub const MIN_SECRET_BYTES: usize = 16;

/// Length in bytes of the server and client nonces.
pub const NONCE_LEN: usize = 32;
const TAG_LEN: usize = 32;
const CHALLENGE_LEN: usize = 6 + 2 + NONCE_LEN;
const HELLO_SIGNED_LEN: usize = 6 + 2 + 4 + 4 + NONCE_LEN;
/// Length in bytes of a hello body.
pub const HELLO_LEN: usize = HELLO_SIGNED_LEN + TAG_LEN;
const REPLY_MAX: usize = 1 + TAG_LEN + MAX_PAYLOAD;
const POLL: Duration = Duration::from_millis(5);

type HmacSha256 = Hmac<Sha256>;
type Result<T> = std::result::Result<T, RendezvousError>;

/// A job secret: random bytes every rank of one job shares (at least [`MIN_SECRET_BYTES`]).
/// `Debug` does not print it.
#[derive(Clone, PartialEq, Eq)]
pub struct JobSecret(Vec<u8>);

impl std::fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "JobSecret(<{} bytes, redacted>)", self.0.len())
    }
}

/// Why a hex string is not a job secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// A character that is not a hex digit, at byte offset `position`.
    #[error("not hex: {ch:?} at offset {position}")]
    NotHex {
        /// Byte offset in the string.
        position: usize,
        /// The character.
        ch: char,
    },
    /// An odd number of hex digits.
    #[error("odd number of hex digits ({digits})")]
    OddLength {
        /// Number of digits.
        digits: usize,
    },
    /// Fewer than [`MIN_SECRET_BYTES`] bytes.
    #[error("{bits} bits, at least {} required", MIN_SECRET_BYTES * 8)]
    TooShort {
        /// Length in bits.
        bits: usize,
    },
}

impl JobSecret {
    /// 32 fresh bytes from the thread-local CSPRNG (`rand::rng()`, ChaCha seeded by the OS):
    /// for jobs whose ranks we start ourselves.
    pub fn random() -> Self {
        let mut b = vec![0u8; 32];
        rand::rng().fill_bytes(&mut b);
        Self(b)
    }

    /// Parses hex (either case, surrounding whitespace ignored), as made by
    /// `openssl rand -hex 16`.
    ///
    /// # Errors
    /// [`SecretError`] for a non-hex character, an odd length, or fewer than 128 bits.
    pub fn from_hex(s: &str) -> std::result::Result<Self, SecretError> {
        let s = s.trim();
        // A secret is not a UniqueId, so it uses the `hex` crate directly (no codec of our own).
        // The character check comes first so a bad character is named even in an odd-length
        // string.
        if let Some((position, ch)) = s.char_indices().find(|(_, c)| !c.is_ascii_hexdigit()) {
            return Err(SecretError::NotHex { position, ch });
        }
        let bytes = hex::decode(s).map_err(|_| SecretError::OddLength { digits: s.len() })?;
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(SecretError::TooShort { bits: s.len() * 4 });
        }
        Ok(Self(bytes))
    }

    /// Lowercase hex, the form [`JobSecret::from_hex`] and `DROPCOMPUTE_JOB_SECRET` take.
    pub fn to_hex(&self) -> String {
        hex::encode(&self.0)
    }

    fn mac(&self, label: &[u8], parts: &[&[u8]]) -> HmacSha256 {
        let mut m = <HmacSha256 as KeyInit>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
        m.update(label);
        for p in parts {
            m.update(p);
        }
        m
    }
}

/// A rendezvous failure, with the address and the counts or reason.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RendezvousError {
    /// The server's deadline passed before every rank joined.
    #[error("rendezvous at {addr}: {joined} of {expected} ranks joined within {after:?}")]
    Timeout {
        /// Where the server listened.
        addr: SocketAddr,
        /// Ranks that received the payload.
        joined: usize,
        /// Ranks expected (world size - 1).
        expected: usize,
        /// The timeout.
        after: Duration,
    },
    /// A client could not complete a handshake with the server before its deadline.
    #[error("rendezvous at {addr} not reached within {after:?}; last error: {last}")]
    Unreachable {
        /// The server address.
        addr: SocketAddr,
        /// The timeout.
        after: Duration,
        /// The last connect or I/O error.
        last: String,
    },
    /// The server refused this rank (wrong secret, duplicate rank, world size disagreement...).
    #[error("rendezvous at {addr} refused the connection: {reason}")]
    Refused {
        /// The server address.
        addr: SocketAddr,
        /// The server's reason.
        reason: String,
    },
    /// An I/O error that retrying cannot fix (e.g. bind failed).
    #[error("rendezvous {op} at {addr}: {source}")]
    Io {
        /// The call that failed (`bind`, ...).
        op: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The peer broke the protocol (bad magic, version, size, or an unauthenticated reply).
    #[error("rendezvous at {addr}: protocol violation: {reason}")]
    Protocol {
        /// The peer address.
        addr: SocketAddr,
        /// What was wrong.
        reason: String,
    },
    /// The one-host rendezvous file (`hccl::local`): its private directory cannot be made or
    /// is not private, it cannot be written, or rank 0 did not publish it in time.
    #[error("one-host rendezvous file {}: {why}", path.display())]
    LocalFile {
        /// The file (or its directory).
        path: std::path::PathBuf,
        /// What went wrong.
        why: String,
    },
    /// A stop signal (SIGINT, SIGTERM, SIGHUP) arrived while this rank waited for the
    /// rendezvous (exit 130, as every interrupted phase).
    #[error("interrupted by {signal} while waiting for {waiting_for}")]
    Interrupted {
        /// The signal's name.
        signal: &'static str,
        /// What was awaited (the rendezvous file or address).
        waiting_for: String,
    },
    /// A bad argument to [`serve`] or [`fetch`].
    #[error("rendezvous argument {what} = {value} is invalid")]
    InvalidArgument {
        /// The argument.
        what: &'static str,
        /// Its value and the rule.
        value: String,
    },
}

/// A validated hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The joining rank (1..world size).
    pub rank: u32,
    /// The client nonce.
    pub client_nonce: [u8; NONCE_LEN],
}

/// Checks a hello body against the secret, the server nonce and the world size. Pure, so fuzz
/// and property tests can drive it.
///
/// # Errors
/// The refusal reason: wrong length (not [`HELLO_LEN`]), magic, version, proof (wrong or
/// missing secret), world size disagreement, or a rank outside `1..world_size`.
pub fn check_hello(
    body: &[u8],
    secret: &JobSecret,
    server_nonce: &[u8; NONCE_LEN],
    world_size: u32,
) -> std::result::Result<Hello, String> {
    if body.len() != HELLO_LEN {
        return Err(format!("hello is {} bytes, expected {HELLO_LEN}", body.len()));
    }
    if &body[..6] != MAGIC {
        return Err("bad magic (not a dropcompute rendezvous client)".into());
    }
    let u32_at = |i: usize| u32::from_le_bytes([body[i], body[i + 1], body[i + 2], body[i + 3]]);
    let version = u16::from_le_bytes([body[6], body[7]]);
    if version != VERSION {
        return Err(format!("protocol version {version}, expected {VERSION}"));
    }
    let (signed, proof) = body.split_at(HELLO_SIGNED_LEN);
    if secret.mac(b"hello", &[server_nonce, signed]).verify_slice(proof).is_err() {
        return Err("wrong job secret (proof does not verify)".into());
    }
    let (rank, theirs) = (u32_at(8), u32_at(12));
    if theirs != world_size {
        return Err(format!("rank {rank} says world size {theirs}, the server has {world_size}"));
    }
    if rank == 0 || rank >= world_size {
        return Err(format!("rank {rank} outside 1..{world_size}"));
    }
    let mut client_nonce = [0u8; NONCE_LEN];
    client_nonce.copy_from_slice(&signed[16..]);
    Ok(Hello { rank, client_nonce })
}

/// Builds a hello body (the client's side of [`check_hello`]).
pub fn make_hello(
    secret: &JobSecret,
    server_nonce: &[u8; NONCE_LEN],
    rank: u32,
    world_size: u32,
    client_nonce: &[u8; NONCE_LEN],
) -> Vec<u8> {
    let mut b = Vec::with_capacity(HELLO_LEN);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&rank.to_le_bytes());
    b.extend_from_slice(&world_size.to_le_bytes());
    b.extend_from_slice(client_nonce);
    let tag = secret.mac(b"hello", &[server_nonce, &b]).finalize().into_bytes();
    b.extend_from_slice(&tag);
    b
}

/// Checks a challenge body (the server's first message) and returns the server nonce. Pure,
/// for fuzz and property tests.
///
/// # Errors
/// The protocol violation: wrong length, magic (not a dropcompute rendezvous) or version.
pub fn parse_challenge(body: &[u8]) -> std::result::Result<[u8; NONCE_LEN], String> {
    if body.len() != CHALLENGE_LEN || &body[..6] != MAGIC {
        return Err("the server's challenge is not a dropcompute rendezvous".into());
    }
    let version = u16::from_le_bytes([body[6], body[7]]);
    if version != VERSION {
        return Err(format!("server protocol version {version}, ours is {VERSION}"));
    }
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(&body[8..]);
    Ok(nonce)
}

/// A decoded server reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The authenticated payload (the HCCL unique id).
    Payload(Vec<u8>),
    /// The server refused us, with its (unauthenticated) reason, at most 512 bytes.
    Refused(String),
}

/// Decodes and authenticates a reply body for `rank` (the client's side of the handshake).
/// Pure, for fuzz and property tests.
///
/// # Errors
/// The protocol violation: an unknown tag byte, a short reply, or a payload whose tag does not
/// verify (a server without our secret).
pub fn check_reply(
    reply: &[u8],
    secret: &JobSecret,
    server_nonce: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
    rank: u32,
) -> std::result::Result<Reply, String> {
    match reply.split_first() {
        Some((0, rest)) if rest.len() >= TAG_LEN => {
            let (tag, payload) = rest.split_at(TAG_LEN);
            match reply_mac(secret, server_nonce, client_nonce, rank, payload).verify_slice(tag) {
                Ok(()) => Ok(Reply::Payload(payload.to_vec())),
                Err(_) => Err("reply not authenticated: the server does not know our job secret".into()),
            }
        }
        Some((1, reason)) => Ok(Reply::Refused(String::from_utf8_lossy(&reason[..reason.len().min(512)]).into_owned())),
        _ => Err(format!("malformed reply of {} bytes", reply.len())),
    }
}

fn reply_mac(secret: &JobSecret, sn: &[u8], cn: &[u8], rank: u32, payload: &[u8]) -> HmacSha256 {
    secret.mac(b"reply", &[sn, cn, &rank.to_le_bytes(), payload])
}

/// Reads exactly `buf.len()` bytes, each read bounded by what is left until `deadline`.
fn read_exact_by(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf[done..]) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "peer closed")),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads one length-prefixed message of at most `max` bytes (checked before allocating).
fn read_msg(s: &mut TcpStream, max: usize, deadline: Instant) -> std::result::Result<Vec<u8>, String> {
    let mut len = [0u8; 4];
    read_exact_by(s, &mut len, deadline).map_err(|e| format!("reading a length: {e}"))?;
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(format!("message of {len} bytes exceeds the bound of {max}"));
    }
    let mut body = vec![0u8; len];
    read_exact_by(s, &mut body, deadline).map_err(|e| format!("reading {len} bytes: {e}"))?;
    Ok(body)
}

fn write_msg(s: &mut TcpStream, body: &[u8], deadline: Instant) -> io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    s.set_write_timeout(Some(left.max(Duration::from_millis(1))))?;
    let mut m = Vec::with_capacity(4 + body.len());
    m.extend_from_slice(&(body.len() as u32).to_le_bytes());
    m.extend_from_slice(body);
    s.write_all(&m)
}

/// Ranks that joined, shared by the accept loop and the handshake threads.
#[derive(Default)]
struct Joined {
    reserved: Mutex<HashSet<u32>>,
    confirmed: AtomicUsize,
}

struct Job {
    secret: JobSecret,
    payload: Vec<u8>,
    world_size: u32,
    joined: Joined,
    pending: AtomicUsize,
}

/// Rank 0's running rendezvous server (a background thread).
///
/// Dropping it without [`RendezvousServer::wait`] leaves the thread to finish on its own by the
/// deadline.
#[derive(Debug)]
pub struct RendezvousServer {
    addr: SocketAddr,
    handle: JoinHandle<Result<()>>,
}

/// Binds `addr` (exactly that address: pass a loopback address for a single host) and serves
/// `payload` to `world_size - 1` authenticated ranks in a background thread, for at most
/// `timeout` from now. `addr` may have port 0 (see [`RendezvousServer::local_addr`]).
///
/// # Errors
/// [`RendezvousError::InvalidArgument`] for a payload over [`MAX_PAYLOAD`] bytes or a world
/// size of 0; [`RendezvousError::Io`] when the bind fails (address in use, not local).
pub fn serve(
    addr: SocketAddr,
    secret: JobSecret,
    payload: &[u8],
    world_size: u32,
    timeout: Duration,
) -> Result<RendezvousServer> {
    if payload.len() > MAX_PAYLOAD {
        let value = format!("{} bytes (at most {MAX_PAYLOAD})", payload.len());
        return Err(RendezvousError::InvalidArgument { what: "payload", value });
    }
    if world_size == 0 {
        return Err(RendezvousError::InvalidArgument { what: "world_size", value: "0".into() });
    }
    let io = |op| move |source| RendezvousError::Io { op, addr, source };
    let listener = TcpListener::bind(addr).map_err(io("bind"))?;
    let local = listener.local_addr().map_err(io("local_addr"))?;
    listener.set_nonblocking(true).map_err(io("set_nonblocking"))?;
    let job =
        Job { secret, payload: payload.to_vec(), world_size, joined: Joined::default(), pending: AtomicUsize::new(0) };
    let deadline = Instant::now() + timeout;
    let handle = std::thread::Builder::new()
        .name("dc-rendezvous".into())
        .spawn(move || accept_loop(&listener, local, &job, deadline, timeout))
        .map_err(io("spawn"))?;
    Ok(RendezvousServer { addr: local, handle })
}

impl RendezvousServer {
    /// The bound address (with the real port when 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits until every rank joined or the deadline passed (the thread never outlives the
    /// deadline by more than one poll interval).
    ///
    /// # Errors
    /// [`RendezvousError::Timeout`] with the joined and expected counts.
    pub fn wait(self) -> Result<()> {
        let addr = self.addr;
        self.handle.join().unwrap_or_else(|_| {
            Err(RendezvousError::Protocol { addr, reason: "rendezvous server thread panicked".into() })
        })
    }
}

fn accept_loop(listener: &TcpListener, addr: SocketAddr, job: &Job, deadline: Instant, after: Duration) -> Result<()> {
    let expected = job.world_size as usize - 1;
    std::thread::scope(|scope| {
        loop {
            let joined = job.joined.confirmed.load(Ordering::Acquire);
            if joined >= expected {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(RendezvousError::Timeout { addr, joined, expected, after });
            }
            match listener.accept() {
                Ok((stream, peer)) => {
                    if job.pending.load(Ordering::Acquire) >= MAX_PENDING {
                        tracing::warn!(%peer, "rendezvous: too many handshakes in flight, connection closed");
                        continue;
                    }
                    job.pending.fetch_add(1, Ordering::AcqRel);
                    let conn_deadline = deadline.min(Instant::now() + HANDSHAKE_TIMEOUT);
                    scope.spawn(move || {
                        handle_conn(stream, peer, job, conn_deadline);
                        job.pending.fetch_sub(1, Ordering::AcqRel);
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(POLL),
                Err(e) => {
                    tracing::warn!(error = %e, "rendezvous: accept failed");
                    std::thread::sleep(POLL);
                }
            }
        }
    })
}

fn handle_conn(mut stream: TcpStream, peer: SocketAddr, job: &Job, deadline: Instant) {
    match handshake(&mut stream, job, deadline) {
        Ok(rank) => tracing::debug!(%peer, rank, "rendezvous: rank joined"),
        Err(reason) => {
            tracing::warn!(%peer, %reason, "rendezvous: refused a connection");
            let mut msg = vec![1u8];
            msg.extend_from_slice(reason.as_bytes());
            let _ = write_msg(&mut stream, &msg, deadline); // best effort: the peer may be gone
        }
    }
}

fn handshake(stream: &mut TcpStream, job: &Job, deadline: Instant) -> std::result::Result<u32, String> {
    stream.set_nonblocking(false).map_err(|e| format!("set_nonblocking: {e}"))?;
    let _ = stream.set_nodelay(true);
    let mut nonce = [0u8; NONCE_LEN];
    rand::rng().fill_bytes(&mut nonce);
    let mut challenge = Vec::with_capacity(CHALLENGE_LEN);
    challenge.extend_from_slice(MAGIC);
    challenge.extend_from_slice(&VERSION.to_le_bytes());
    challenge.extend_from_slice(&nonce);
    write_msg(stream, &challenge, deadline).map_err(|e| format!("sending the challenge: {e}"))?;
    let body = read_msg(stream, MAX_MESSAGE, deadline)?;
    let hello = check_hello(&body, &job.secret, &nonce, job.world_size)?;
    let rank = hello.rank;
    let fresh = job.joined.reserved.lock().is_ok_and(|mut r| r.insert(rank));
    if !fresh {
        return Err(format!("duplicate rank {rank}"));
    }
    let tag = reply_mac(&job.secret, &nonce, &hello.client_nonce, rank, &job.payload).finalize().into_bytes();
    let mut reply = Vec::with_capacity(1 + TAG_LEN + job.payload.len());
    reply.push(0);
    reply.extend_from_slice(&tag);
    reply.extend_from_slice(&job.payload);
    if let Err(e) = write_msg(stream, &reply, deadline) {
        if let Ok(mut r) = job.joined.reserved.lock() {
            r.remove(&rank);
        }
        return Err(format!("sending the payload to rank {rank}: {e}"));
    }
    job.joined.confirmed.fetch_add(1, Ordering::AcqRel);
    Ok(rank)
}

/// Whether a client attempt may be retried (the server may not be up yet).
enum Attempt {
    Retry(String),
    Fatal(RendezvousError),
}

/// Fetches the payload from rank 0's server at `addr` as rank `rank` of `world_size`, retrying
/// the connection (backoff 10 ms doubling to 200 ms) until `timeout` passes, since rank 0 may
/// start later.
///
/// # Errors
/// [`RendezvousError::InvalidArgument`] for rank 0 or `rank >= world_size`;
/// [`RendezvousError::Refused`] when the server refuses (wrong secret, duplicate rank, world
/// size disagreement: not retried); [`RendezvousError::Protocol`] for a bad challenge or an
/// unauthenticated reply (a server without our secret); [`RendezvousError::Unreachable`] when
/// no handshake completed in time.
pub fn fetch(addr: SocketAddr, secret: &JobSecret, rank: u32, world_size: u32, timeout: Duration) -> Result<Vec<u8>> {
    if rank == 0 || rank >= world_size {
        let value = format!("{rank} (must be in 1..{world_size}; rank 0 serves)");
        return Err(RendezvousError::InvalidArgument { what: "rank", value });
    }
    let deadline = Instant::now() + timeout;
    let mut backoff = Duration::from_millis(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let last = match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(1)).max(POLL)) {
            Ok(mut s) => match client_handshake(&mut s, addr, secret, rank, world_size, deadline) {
                Ok(payload) => return Ok(payload),
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Retry(why)) => why,
            },
            Err(e) => format!("connect: {e}"),
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(RendezvousError::Unreachable { addr, after: timeout, last });
        }
        tracing::debug!(%addr, rank, "rendezvous server not reachable yet ({last}); retrying in {:?}", backoff.min(left));
        std::thread::sleep(backoff.min(left));
        backoff = (backoff * 2).min(Duration::from_millis(200));
    }
}

fn client_handshake(
    s: &mut TcpStream,
    addr: SocketAddr,
    secret: &JobSecret,
    rank: u32,
    world_size: u32,
    deadline: Instant,
) -> std::result::Result<Vec<u8>, Attempt> {
    let protocol = |reason: String| Attempt::Fatal(RendezvousError::Protocol { addr, reason });
    let _ = s.set_nodelay(true);
    let challenge = read_msg(s, CHALLENGE_LEN, deadline).map_err(Attempt::Retry)?;
    let server_nonce = parse_challenge(&challenge).map_err(protocol)?;
    let mut client_nonce = [0u8; NONCE_LEN];
    rand::rng().fill_bytes(&mut client_nonce);
    let hello = make_hello(secret, &server_nonce, rank, world_size, &client_nonce);
    write_msg(s, &hello, deadline).map_err(|e| Attempt::Retry(format!("sending the hello: {e}")))?;
    let reply = read_msg(s, REPLY_MAX, deadline).map_err(Attempt::Retry)?;
    match check_reply(&reply, secret, &server_nonce, &client_nonce, rank).map_err(protocol)? {
        Reply::Payload(p) => Ok(p),
        Reply::Refused(reason) => Err(Attempt::Fatal(RendezvousError::Refused { addr, reason })),
    }
}
