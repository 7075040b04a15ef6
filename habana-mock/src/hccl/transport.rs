//! Transports of the mock collectives: frames, links to peers and the per-rank inbox.
//!
//! Owns: [`Frame`] (the unit exchanged between ranks), [`Link`] (how one rank reaches one peer),
//! [`Rx`] (the inbox with per-peer stashes) and the process-global registry of in-process
//! inboxes. Must not touch: collective semantics (`algo.rs`) or communicator lifetime
//! (`comm.rs`).
//!
//! Choice: ranks of the same mock instance (same process and same copy of the mock; the peer
//! table carries a per-instance nonce) exchange frames through shared memory: each rank owns
//! one unbounded crossbeam inbox and its in-process peers hold a `Sender` to it (found in a
//! registry keyed by the communicator token and rank); no sockets on that data path. Ranks in
//! different processes use one TCP connection per pair on loopback (TCP_NODELAY); a reader
//! thread per connection turns the byte stream into frames in the same inbox, so both transports
//! look alike to the algorithms and a send never waits for the receiver (unbounded buffering,
//! which also makes grouped send/recv deadlock-free). End of stream or a reset becomes a
//! [`Kind::Gone`] frame naming the peer. Socket buffer sizes are left at the OS defaults (no
//! `libc`/`socket2` dependency).

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

/// Largest frame payload accepted from a socket (bounds allocation on a corrupt stream).
pub(crate) const MAX_FRAME_BYTES: u64 = 1 << 31;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    /// A collective's lockstep header.
    Header = 1,
    /// Collective payload.
    Data = 2,
    /// A point-to-point message (header + payload).
    P2p = 3,
    /// The sender failed operation `seq` (0 = not tied to a collective) with `code`.
    Fail = 4,
    /// The sender is gone (destroyed, aborted, killed, connection closed); payload = reason.
    Gone = 5,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Header,
            2 => Self::Data,
            3 => Self::P2p,
            4 => Self::Fail,
            5 => Self::Gone,
            _ => return None,
        })
    }
}

/// One message between two ranks of a communicator.
#[derive(Debug)]
pub(crate) struct Frame {
    pub from: u32,
    pub kind: Kind,
    pub seq: u64,
    pub code: i32,
    pub payload: Vec<u8>,
}

/// How a rank reaches one peer.
#[derive(Debug)]
pub(crate) enum Link {
    /// Same mock instance: the peer's inbox.
    Local(Sender<Frame>),
    /// Another process: a socket (writer under a lock) and a clone used to shut it down.
    Tcp { writer: Mutex<TcpStream>, ctl: TcpStream },
}

const WIRE_HEADER: usize = 1 + 4 + 8 + 8;

impl Link {
    /// Sends `f` (never waits for the receiver to read it). Err names the failure.
    pub(crate) fn send(&self, f: Frame) -> Result<(), String> {
        match self {
            Self::Local(tx) => tx.send(f).map_err(|_| "peer inbox closed".to_string()),
            Self::Tcp { writer, .. } => {
                let mut h = [0u8; WIRE_HEADER];
                h[0] = f.kind as u8;
                h[1..5].copy_from_slice(&f.code.to_le_bytes());
                h[5..13].copy_from_slice(&f.seq.to_le_bytes());
                h[13..21].copy_from_slice(&(f.payload.len() as u64).to_le_bytes());
                let mut w = writer.lock().unwrap_or_else(|e| e.into_inner());
                w.write_all(&h).and_then(|_| w.write_all(&f.payload)).map_err(|e| format!("socket write: {e}"))
            }
        }
    }

    /// Best-effort notice that this rank is gone, then closes a socket (wakes the peer's reader
    /// and our own). Never blocks on a busy writer.
    pub(crate) fn close(&self, from: u32, reason: &str) {
        let gone = || Frame { from, kind: Kind::Gone, seq: 0, code: 0, payload: reason.as_bytes().to_vec() };
        match self {
            Self::Local(tx) => {
                let _ = tx.send(gone());
            }
            Self::Tcp { writer, ctl } => {
                if let Ok(mut w) = writer.try_lock() {
                    let g = gone();
                    let mut h = [0u8; WIRE_HEADER];
                    h[0] = g.kind as u8;
                    h[13..21].copy_from_slice(&(g.payload.len() as u64).to_le_bytes());
                    let _ = w.write_all(&h).and_then(|_| w.write_all(&g.payload));
                }
                let _ = ctl.shutdown(Shutdown::Both);
            }
        }
    }
}

/// Wraps a connected socket to peer `from`: a reader thread feeding `inbox`, and the link.
pub(crate) fn tcp_link(stream: TcpStream, from: u32, inbox: Sender<Frame>) -> std::io::Result<Link> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(None)?;
    let reader = stream.try_clone()?;
    let ctl = stream.try_clone()?;
    std::thread::Builder::new()
        .name(format!("mock-hccl-rx-{from}"))
        .stack_size(256 << 10)
        .spawn(move || read_frames(reader, from, inbox))?;
    Ok(Link::Tcp { writer: Mutex::new(stream), ctl })
}

fn read_frames(mut s: TcpStream, from: u32, inbox: Sender<Frame>) {
    let reason = loop {
        let mut h = [0u8; WIRE_HEADER];
        if let Err(e) = s.read_exact(&mut h) {
            break if e.kind() == std::io::ErrorKind::UnexpectedEof {
                "connection closed (EOF)".to_string()
            } else {
                format!("connection error: {e}")
            };
        }
        let Some(kind) = Kind::from_u8(h[0]) else { break format!("corrupt frame kind {}", h[0]) };
        let code = i32::from_le_bytes(h[1..5].try_into().expect("4 bytes"));
        let seq = u64::from_le_bytes(h[5..13].try_into().expect("8 bytes"));
        let len = u64::from_le_bytes(h[13..21].try_into().expect("8 bytes"));
        if len > MAX_FRAME_BYTES {
            break format!("corrupt frame length {len}");
        }
        let mut payload = vec![0u8; len as usize];
        if let Err(e) = s.read_exact(&mut payload) {
            break format!("connection error in a frame: {e}");
        }
        if inbox.send(Frame { from, kind, seq, code, payload }).is_err() {
            return; // our communicator is gone
        }
    };
    let _ = inbox.send(Frame { from, kind: Kind::Gone, seq: 0, code: 0, payload: reason.into_bytes() });
}

/// A rank's receive side: the inbox and what arrived out of turn.
#[derive(Debug)]
pub(crate) struct Rx {
    inbox: Receiver<Frame>,
    /// Per peer: frames received but not consumed yet (FIFO per link).
    stash: Vec<VecDeque<Frame>>,
    /// Per peer: why it is gone, if it is.
    pub gone: Vec<Option<String>>,
    /// Failure notices from peers, in arrival order.
    pub fails: Vec<Frame>,
}

impl Rx {
    pub(crate) fn new(inbox: Receiver<Frame>, n: usize) -> Self {
        Self { inbox, stash: (0..n).map(|_| VecDeque::new()).collect(), gone: vec![None; n], fails: Vec::new() }
    }

    /// The next stashed frame from `from`.
    pub(crate) fn take(&mut self, from: u32) -> Option<Frame> {
        self.stash.get_mut(from as usize)?.pop_front()
    }

    /// Files one frame by kind.
    fn file(&mut self, f: Frame) {
        let i = f.from as usize;
        match f.kind {
            Kind::Fail => self.fails.push(f),
            Kind::Gone => {
                if let Some(g) = self.gone.get_mut(i)
                    && g.is_none()
                {
                    *g = Some(String::from_utf8_lossy(&f.payload).into_owned());
                }
            }
            _ => {
                if let Some(q) = self.stash.get_mut(i) {
                    q.push_back(f)
                }
            }
        }
    }

    /// Waits up to `wait` for one frame and files it; false on timeout.
    pub(crate) fn pump(&mut self, wait: Duration) -> bool {
        match self.inbox.recv_timeout(wait) {
            Ok(f) => {
                self.file(f);
                true
            }
            Err(RecvTimeoutError::Timeout) => false,
            // Unreachable while the comm holds a sender to its own inbox; treat as a pause.
            Err(RecvTimeoutError::Disconnected) => {
                std::thread::sleep(wait);
                false
            }
        }
    }

    /// Files every frame already in the inbox without waiting.
    pub(crate) fn drain(&mut self) {
        while let Ok(f) = self.inbox.try_recv() {
            self.file(f);
        }
    }
}

type LocalKey = ([u8; 16], u32);

fn local() -> &'static Mutex<HashMap<LocalKey, Sender<Frame>>> {
    static L: OnceLock<Mutex<HashMap<LocalKey, Sender<Frame>>>> = OnceLock::new();
    L.get_or_init(Default::default)
}

/// Publishes the inbox of `rank` of communicator `token` to in-process peers.
pub(crate) fn register_local(token: [u8; 16], rank: u32, tx: Sender<Frame>) -> Result<(), String> {
    let mut l = local().lock().unwrap_or_else(|e| e.into_inner());
    if l.contains_key(&(token, rank)) {
        return Err(format!("rank {rank} of this communicator already initialised in this process"));
    }
    l.insert((token, rank), tx);
    Ok(())
}

/// The inbox of in-process peer `rank`.
pub(crate) fn lookup_local(token: [u8; 16], rank: u32) -> Option<Sender<Frame>> {
    local().lock().unwrap_or_else(|e| e.into_inner()).get(&(token, rank)).cloned()
}

/// Withdraws an inbox (communicator destroyed or init failed).
pub(crate) fn unregister_local(token: [u8; 16], rank: u32) {
    local().lock().unwrap_or_else(|e| e.into_inner()).remove(&(token, rank));
}

/// A random nonce identifying this copy of the mock in this process (an in-process mock and a
/// loaded mock library in the same process are distinct instances and must talk over TCP).
pub(crate) fn instance_nonce() -> u64 {
    static N: OnceLock<u64> = OnceLock::new();
    *N.get_or_init(rand::random)
}
