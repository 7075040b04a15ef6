//! Unique ids and the init rendezvous of the mock collectives.
//!
//! Owns: the byte layout of `hcclUniqueId` produced by the mock, the coordinator (a TCP
//! listener thread started by `hcclGetUniqueId`, or by rank 0 under `HCCL_COMM_ID`) and the
//! rank side of `hcclCommInitRank`'s rendezvous (join, wait for the peer table, connect the
//! cross-process links). Must not touch: collectives or the Synapse state.
//!
//! Id layout (`internal`, little-endian; `length` = bytes used = 30 + address length):
//! `[0..8]` magic `"DCMOCKID"`, `[8..12]` layout version (1), `[12..28]` a random 128-bit token
//! every joining rank must present, `[28..30]` address length L, `[30..30+L]` the coordinator's
//! `IP:PORT` in UTF-8. An all-zero id (`length` 0) means "use `HCCL_COMM_ID`" (token all zero).
//!
//! Coordinator protocol: a rank sends (token, rank, nranks, pid, instance nonce, data-plane
//! address); the coordinator answers progress notices (ranks joined so far), then either the
//! peer table (when all nranks joined) or an error (bad token, nranks disagreement, duplicate
//! rank; these poison the rendezvous so every rank, present or later, gets the same error).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use habana_sys::{HCCL_UNIQUE_ID_MAX_BYTES, hcclResult_t, hcclUniqueId};

use crate::error::HErr;

/// Magic at the start of a mock unique id.
pub const ID_MAGIC: &[u8; 8] = b"DCMOCKID";
/// Layout version stored after the magic.
pub const ID_VERSION: u32 = 1;
/// Environment variable naming the coordinator address when the id is empty (vendor behaviour).
pub const ENV_COMM_ID: &str = habana_sys::comm_id::ENV_COMM_ID;

/// A decoded unique id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MockId {
    pub token: [u8; 16],
    pub addr: String,
}

impl MockId {
    pub(crate) fn encode(&self) -> hcclUniqueId {
        let mut id = hcclUniqueId::default();
        let a = self.addr.as_bytes();
        id.internal[..8].copy_from_slice(ID_MAGIC);
        id.internal[8..12].copy_from_slice(&ID_VERSION.to_le_bytes());
        id.internal[12..28].copy_from_slice(&self.token);
        id.internal[28..30].copy_from_slice(&(a.len() as u16).to_le_bytes());
        id.internal[30..30 + a.len()].copy_from_slice(a);
        id.length = 30 + a.len();
        id
    }

    /// Decodes `id`; `Ok(None)` for an empty id (`length` 0).
    pub(crate) fn decode(id: &hcclUniqueId) -> Result<Option<Self>, HErr> {
        let bad = |why: &str| HErr::new(hcclResult_t::INVALID_ARGUMENT, format!("invalid unique id: {why}"));
        if id.length == 0 {
            return Ok(None);
        }
        if id.length < 30 || id.length > HCCL_UNIQUE_ID_MAX_BYTES {
            return Err(bad(&format!("length {} (a mock id has 30..=1024 bytes)", id.length)));
        }
        let b = &id.internal;
        if &b[..8] != ID_MAGIC {
            return Err(bad("wrong magic (not produced by the CPU mock's hcclGetUniqueId)"));
        }
        let v = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
        if v != ID_VERSION {
            return Err(bad(&format!("layout version {v}, expected {ID_VERSION}")));
        }
        let l = u16::from_le_bytes([b[28], b[29]]) as usize;
        if 30 + l != id.length {
            return Err(bad(&format!("address length {l} does not match length {}", id.length)));
        }
        let addr = std::str::from_utf8(&b[30..30 + l]).map_err(|_| bad("address is not UTF-8"))?.to_string();
        Ok(Some(Self { token: b[12..28].try_into().expect("16 bytes"), addr }))
    }
}

/// One rank's entry in the peer table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PeerInfo {
    pub pid: u32,
    pub nonce: u64,
    pub addr: String,
}

/// Starts a coordinator on `bind` ("IP:PORT"; port 0 = ephemeral) and returns its id. The
/// thread lives until a rendezvous completes, or `timeout` + 5 s after the first join, or 1 h.
pub(crate) fn start_coordinator(bind: &str, token: [u8; 16], timeout: Duration) -> Result<MockId, HErr> {
    let l = TcpListener::bind(bind)
        .map_err(|e| HErr::new(hcclResult_t::SOCKET_ERROR, format!("cannot bind the coordinator to {bind}: {e}")))?;
    let addr = l.local_addr().map_err(|e| HErr::new(hcclResult_t::SOCKET_ERROR, e.to_string()))?;
    l.set_nonblocking(true).map_err(|e| HErr::new(hcclResult_t::SOCKET_ERROR, e.to_string()))?;
    std::thread::Builder::new()
        .name("mock-hccl-coordinator".into())
        .stack_size(256 << 10)
        .spawn(move || Coordinator { token, joined: Vec::new(), nranks: None, poison: None }.serve(l, timeout))
        .map_err(|e| HErr::new(hcclResult_t::SYSTEM_ERROR, format!("cannot start the coordinator thread: {e}")))?;
    Ok(MockId { token, addr: addr.to_string() })
}

struct Joined {
    rank: u32,
    stream: TcpStream,
    info: PeerInfo,
}

struct Coordinator {
    token: [u8; 16],
    joined: Vec<Joined>,
    nranks: Option<u32>,
    poison: Option<(hcclResult_t, String)>,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u16).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn send_msg(s: &mut TcpStream, body: &[u8]) -> std::io::Result<()> {
    s.write_all(&(body.len() as u32).to_le_bytes())?;
    s.write_all(body)
}

fn recv_msg(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut l = [0u8; 4];
    s.read_exact(&mut l)?;
    let l = u32::from_le_bytes(l);
    if l > 1 << 20 {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "rendezvous message too large"));
    }
    let mut b = vec![0u8; l as usize];
    s.read_exact(&mut b)?;
    Ok(b)
}

/// A cursor over a received message.
struct Cur<'a>(&'a [u8]);

impl Cur<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|b| u32::from_le_bytes(b.try_into().expect("4")))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8).map(|b| u64::from_le_bytes(b.try_into().expect("8")))
    }
    fn str(&mut self) -> Option<String> {
        let l = self.take(2).map(|b| u16::from_le_bytes([b[0], b[1]]))? as usize;
        self.take(l).and_then(|b| std::str::from_utf8(b).ok()).map(str::to_string)
    }
}

const MSG_PROGRESS: u8 = 1;
const MSG_TABLE: u8 = 2;
const MSG_ERROR: u8 = 3;

fn error_msg(code: hcclResult_t, msg: &str) -> Vec<u8> {
    let mut b = vec![MSG_ERROR];
    b.extend_from_slice(&code.0.to_le_bytes());
    put_str(&mut b, &msg.chars().take(4000).collect::<String>());
    b
}

impl Coordinator {
    fn serve(mut self, l: TcpListener, timeout: Duration) {
        let born = Instant::now();
        let mut first_join: Option<Instant> = None;
        loop {
            if first_join.is_some_and(|t| t.elapsed() > timeout + Duration::from_secs(5))
                || born.elapsed() > Duration::from_secs(3600)
            {
                return;
            }
            match l.accept() {
                Ok((s, peer)) => {
                    first_join.get_or_insert_with(Instant::now);
                    if self.handle(s, peer) {
                        return;
                    }
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    /// Handles one joining connection; true when the rendezvous completed.
    fn handle(&mut self, mut s: TcpStream, peer: SocketAddr) -> bool {
        let _ = s.set_nonblocking(false);
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let Ok(msg) = recv_msg(&mut s) else { return false };
        let mut c = Cur(&msg);
        let token = c.take(16).map(<[u8]>::to_vec);
        if token.as_deref() != Some(&self.token[..]) {
            tracing::warn!(%peer, "mock HCCL coordinator refused a connection with a wrong token");
            let _ = send_msg(&mut s, &error_msg(hcclResult_t::INVALID_USAGE, "wrong unique id token"));
            return false;
        }
        let (Some(rank), Some(n), Some(pid), Some(nonce), Some(addr)) = (c.u32(), c.u32(), c.u32(), c.u64(), c.str())
        else {
            let _ = send_msg(&mut s, &error_msg(hcclResult_t::INVALID_USAGE, "malformed join message"));
            return false;
        };
        if self.poison.is_none() {
            if let Some(prev) = self.nranks
                && prev != n
            {
                let first = self.joined.first().map_or(0, |j| j.rank);
                self.poison = Some((
                    hcclResult_t::INVALID_USAGE,
                    format!("nranks disagreement: rank {first} joined with nranks={prev}, rank {rank} with nranks={n}"),
                ));
            } else if self.joined.iter().any(|j| j.rank == rank) {
                self.poison = Some((hcclResult_t::INVALID_USAGE, format!("duplicate rank: rank {rank} joined twice")));
            }
        }
        if let Some((code, m)) = &self.poison {
            let e = error_msg(*code, m);
            let _ = send_msg(&mut s, &e);
            for j in &mut self.joined {
                let _ = send_msg(&mut j.stream, &e);
            }
            self.joined.clear();
            return false;
        }
        self.nranks = Some(n);
        self.joined.push(Joined { rank, stream: s, info: PeerInfo { pid, nonce, addr } });
        let mut p = vec![MSG_PROGRESS];
        p.extend_from_slice(&(self.joined.len() as u32).to_le_bytes());
        for j in &self.joined {
            p.extend_from_slice(&j.rank.to_le_bytes());
        }
        for j in &mut self.joined {
            let _ = send_msg(&mut j.stream, &p);
        }
        if self.joined.len() as u32 == n {
            self.joined.sort_by_key(|j| j.rank);
            let mut t = vec![MSG_TABLE];
            for j in &self.joined {
                t.extend_from_slice(&j.info.pid.to_le_bytes());
                t.extend_from_slice(&j.info.nonce.to_le_bytes());
                put_str(&mut t, &j.info.addr);
            }
            for j in &mut self.joined {
                let _ = send_msg(&mut j.stream, &t);
            }
            return true;
        }
        false
    }
}

fn resolve(addr: &str) -> Result<SocketAddr, HErr> {
    addr.to_socket_addrs().ok().and_then(|mut a| a.next()).ok_or_else(|| {
        HErr::new(hcclResult_t::INVALID_ARGUMENT, format!("cannot resolve coordinator address {addr:?}"))
    })
}

/// Joins the rendezvous of `id` as `rank` of `n` and waits (until `deadline`) for the peer
/// table. Errors: hcclSocketError on timeout (message: how many and which ranks joined) or when
/// the coordinator is unreachable; the coordinator's error (hcclInvalidUsage) otherwise.
pub(crate) fn rendezvous(
    id: &MockId,
    rank: u32,
    n: u32,
    me: &PeerInfo,
    deadline: Instant,
) -> Result<Vec<PeerInfo>, HErr> {
    let to = resolve(&id.addr)?;
    let mut s = loop {
        match TcpStream::connect_timeout(&to, Duration::from_millis(500)) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => {
                return Err(HErr::new(
                    hcclResult_t::SOCKET_ERROR,
                    format!("cannot reach the coordinator at {}: {e}", id.addr),
                ));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let _ = s.set_nodelay(true);
    let mut j = id.token.to_vec();
    for v in [rank, n, me.pid] {
        j.extend_from_slice(&v.to_le_bytes());
    }
    j.extend_from_slice(&me.nonce.to_le_bytes());
    put_str(&mut j, &me.addr);
    send_msg(&mut s, &j).map_err(|e| HErr::new(hcclResult_t::SOCKET_ERROR, format!("coordinator write: {e}")))?;
    let mut joined: Vec<u32> = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            break;
        }
        let msg = match recv_msg(&mut s) {
            Ok(m) => m,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => break,
            Err(e) => {
                return Err(HErr::new(hcclResult_t::SOCKET_ERROR, format!("coordinator connection lost: {e}")));
            }
        };
        let mut c = Cur(&msg[1..]);
        match msg.first() {
            Some(&MSG_PROGRESS) => {
                let k = c.u32().unwrap_or(0);
                joined = (0..k).filter_map(|_| c.u32()).collect();
            }
            Some(&MSG_TABLE) => {
                let mut t = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    let (Some(pid), Some(nonce), Some(addr)) = (c.u32(), c.u64(), c.str()) else {
                        return Err(HErr::new(hcclResult_t::INTERNAL_ERROR, "malformed peer table"));
                    };
                    t.push(PeerInfo { pid, nonce, addr });
                }
                return Ok(t);
            }
            Some(&MSG_ERROR) => {
                let code = c.u32().map_or(hcclResult_t::INTERNAL_ERROR, |v| hcclResult_t(v as i32));
                return Err(HErr::new(code, c.str().unwrap_or_default()));
            }
            _ => return Err(HErr::new(hcclResult_t::INTERNAL_ERROR, "malformed coordinator message")),
        }
    }
    joined.sort_unstable();
    let missing: Vec<u32> = (0..n).filter(|r| !joined.contains(r)).collect();
    Err(HErr::new(
        hcclResult_t::SOCKET_ERROR,
        format!("init timed out: {} of {n} ranks joined (joined {joined:?}, missing {missing:?})", joined.len()),
    ))
}

/// Connects the cross-process links of `rank`: to every lower-ranked remote peer it connects
/// and introduces itself (token, rank); from every higher-ranked one it accepts on `listener`.
/// Returns (peer rank, stream) pairs.
pub(crate) fn connect_mesh(
    token: [u8; 16],
    rank: u32,
    remote: &[(u32, String)],
    listener: &TcpListener,
    deadline: Instant,
) -> Result<Vec<(u32, TcpStream)>, HErr> {
    let sock = |e: std::io::Error, what: &str| HErr::new(hcclResult_t::SOCKET_ERROR, format!("{what}: {e}"));
    let mut out = Vec::new();
    for (peer, addr) in remote.iter().filter(|(p, _)| *p < rank) {
        let to = resolve(addr)?;
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(5))
            .map_err(|e| sock(e, &format!("connect to rank {peer} at {addr}")))?;
        let mut hello = token.to_vec();
        hello.extend_from_slice(&rank.to_le_bytes());
        s.write_all(&hello).map_err(|e| sock(e, &format!("hello to rank {peer}")))?;
        out.push((*peer, s));
    }
    let mut expect: Vec<u32> = remote.iter().map(|(p, _)| *p).filter(|p| *p > rank).collect();
    listener.set_nonblocking(true).map_err(|e| sock(e, "listener"))?;
    while !expect.is_empty() {
        match listener.accept() {
            Ok((mut s, _)) => {
                s.set_nonblocking(false).map_err(|e| sock(e, "accept"))?;
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let mut hello = [0u8; 20];
                if s.read_exact(&mut hello).is_err() || hello[..16] != token {
                    tracing::warn!("mock HCCL data plane refused a connection without the communicator token");
                    continue;
                }
                let p = u32::from_le_bytes(hello[16..20].try_into().expect("4"));
                if let Some(i) = expect.iter().position(|&e| e == p) {
                    expect.swap_remove(i);
                    out.push((p, s));
                }
            }
            Err(_) if Instant::now() >= deadline => {
                return Err(HErr::new(
                    hcclResult_t::SOCKET_ERROR,
                    format!("init timed out waiting for data connections from ranks {expect:?}"),
                ));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_round_trips_and_rejects_foreign_bytes() {
        let id = MockId { token: [7; 16], addr: "127.0.0.1:4242".into() };
        let raw = id.encode();
        assert_eq!(raw.length, 30 + 14);
        assert_eq!(MockId::decode(&raw).unwrap(), Some(id));
        let mut bad = raw;
        bad.internal[0] = b'X';
        assert_eq!(MockId::decode(&bad).unwrap_err().status, hcclResult_t::INVALID_ARGUMENT);
        let mut short = raw;
        short.length = 12;
        assert!(MockId::decode(&short).is_err());
        assert_eq!(MockId::decode(&hcclUniqueId::default()).unwrap(), None);
    }
}
