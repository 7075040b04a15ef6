//! The TCP rendezvous over loopback: ranks as threads; refusals of bad peers.

#[path = "support/hermetic.rs"]
mod hermetic;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use dropcompute::hccl::rendezvous::{self, JobSecret, RendezvousError};

const LONG: Duration = Duration::from_secs(20);

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn payload() -> Vec<u8> {
    (0..1032u32).map(|i| (i * 7 % 251) as u8).collect()
}

/// Reads the server's challenge and returns the stream, ready for a hello.
fn connect_past_challenge(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(LONG)).unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut challenge = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut challenge).unwrap();
    assert_eq!(&challenge[..6], rendezvous::MAGIC);
    s
}

/// Reads the server's answer: `Some(reason)` for a refusal, `None` when it just closed.
fn refusal(s: &mut TcpStream) -> Option<String> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut body).ok()?;
    assert_eq!(body[0], 1, "expected a refusal");
    Some(String::from_utf8_lossy(&body[1..]).into_owned())
}

#[test]
fn four_ranks_get_the_payload_on_loopback() {
    let secret = JobSecret::random();
    let server = rendezvous::serve(loopback(), secret.clone(), &payload(), 4, LONG).unwrap();
    let addr = server.local_addr();
    assert!(addr.ip().is_loopback() && addr.port() != 0, "{addr}");
    let got: Vec<Vec<u8>> = std::thread::scope(|s| {
        let hs: Vec<_> = (1..4)
            .map(|r| {
                s.spawn({
                    let k = secret.clone();
                    move || rendezvous::fetch(addr, &k, r, 4, LONG)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
    });
    server.wait().unwrap();
    assert!(got.iter().all(|g| *g == payload()));
}

#[test]
fn wrong_secret_is_refused_and_does_not_count() {
    let secret = JobSecret::random();
    let server = rendezvous::serve(loopback(), secret.clone(), &payload(), 3, LONG).unwrap();
    let addr = server.local_addr();
    match rendezvous::fetch(addr, &JobSecret::random(), 1, 3, LONG) {
        Err(RendezvousError::Refused { reason, .. }) => assert!(reason.contains("secret"), "{reason}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // Ranks 1 and 2 with the right secret still join: the intruder took no rank.
    for r in 1..3 {
        assert_eq!(rendezvous::fetch(addr, &secret, r, 3, LONG).unwrap(), payload());
    }
    server.wait().unwrap();
}

#[test]
fn duplicate_rank_and_world_size_disagreement_are_refused() {
    let secret = JobSecret::random();
    let server = rendezvous::serve(loopback(), secret.clone(), b"id", 3, LONG).unwrap();
    let addr = server.local_addr();
    assert_eq!(rendezvous::fetch(addr, &secret, 1, 3, LONG).unwrap(), b"id");
    match rendezvous::fetch(addr, &secret, 1, 3, LONG) {
        Err(RendezvousError::Refused { reason, .. }) => assert!(reason.contains("duplicate rank 1"), "{reason}"),
        other => panic!("{other:?}"),
    }
    match rendezvous::fetch(addr, &secret, 2, 5, LONG) {
        Err(RendezvousError::Refused { reason, .. }) => assert!(reason.contains("world size 5"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(rendezvous::fetch(addr, &secret, 2, 3, LONG).unwrap(), b"id");
    server.wait().unwrap();
}

#[test]
fn oversized_and_garbage_messages_are_refused() {
    let secret = JobSecret::random();
    let server = rendezvous::serve(loopback(), secret.clone(), b"id", 2, LONG).unwrap();
    let addr = server.local_addr();
    // A 1 GiB length prefix: refused before any allocation, without reading a body.
    let mut s = connect_past_challenge(addr);
    s.write_all(&(1u32 << 30).to_le_bytes()).unwrap();
    let reason = refusal(&mut s).expect("a refusal");
    assert!(reason.contains("1073741824 bytes exceeds"), "{reason}");
    // A well-framed body of garbage.
    let mut s = connect_past_challenge(addr);
    let garbage = vec![0xA5u8; 80];
    s.write_all(&(garbage.len() as u32).to_le_bytes()).unwrap();
    s.write_all(&garbage).unwrap();
    assert!(refusal(&mut s).expect("a refusal").contains("magic"));
    // Raw bytes that are not even a frame, then a hang-up.
    let mut s = connect_past_challenge(addr);
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    drop(s);
    // None of them counted: the real rank still joins.
    assert_eq!(rendezvous::fetch(addr, &secret, 1, 2, LONG).unwrap(), b"id");
    server.wait().unwrap();
}

#[test]
fn a_rank_that_never_joins_times_out_naming_the_counts() {
    let secret = JobSecret::random();
    // Rank 1's fetch must complete within the server's timeout: 5 s keeps that true on a loaded
    // machine (one core, parallel builds), where 600 ms did not always.
    let timeout = Duration::from_secs(5);
    let server = rendezvous::serve(loopback(), secret.clone(), b"id", 3, timeout).unwrap();
    let addr = server.local_addr();
    // A silent peer holds a connection open; it must not keep the server past its deadline.
    let _silent = TcpStream::connect(addr).unwrap();
    assert_eq!(rendezvous::fetch(addr, &secret, 1, 3, LONG).unwrap(), b"id");
    match server.wait() {
        Err(RendezvousError::Timeout { joined, expected, after, .. }) => {
            assert_eq!((joined, expected, after), (1, 2, timeout));
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
}

#[test]
fn fetch_before_serve_retries_until_the_server_is_up() {
    // `serve` binds by address itself: a released port, retried if another process took it.
    let (fetched, served) = hermetic::retry_on_fresh_port(
        |addr| {
            let secret = JobSecret::random();
            let (retried_tx, retried) = std::sync::mpsc::channel::<()>();
            let client = std::thread::spawn({
                let k = secret.clone();
                move || {
                    // Readiness signal: the client's first retry (its debug event), captured by a
                    // subscriber of this thread only.
                    let subscriber = tracing_subscriber::fmt()
                        .with_max_level(tracing::Level::DEBUG)
                        .with_writer(move || RetrySignal(retried_tx.clone()))
                        .finish();
                    tracing::subscriber::with_default(subscriber, || rendezvous::fetch(addr, &k, 1, 2, LONG))
                }
            });
            // Serve only once the client failed to connect and is retrying.
            retried.recv_timeout(LONG).expect("the client retries while nobody serves");
            match rendezvous::serve(addr, secret, b"late", 2, LONG) {
                Ok(server) => (client.join().unwrap(), Some(server.wait())),
                Err(e) => {
                    let _ = client.join();
                    (Err(e), None)
                }
            }
        },
        |(_, served)| served.is_none(),
    );
    assert_eq!(fetched.unwrap(), b"late");
    served.expect("the server bound its port").unwrap();
}

/// A log writer that signals every event mentioning a retry.
struct RetrySignal(std::sync::mpsc::Sender<()>);

impl Write for RetrySignal {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if String::from_utf8_lossy(buf).contains("retrying in") {
            let _ = self.0.send(());
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn fetch_gives_up_at_its_deadline_when_nobody_serves() {
    let timeout = Duration::from_millis(300);
    // Nobody serves on a released port, unless another process took it meanwhile: retried.
    let (addr, r) = hermetic::retry_on_fresh_port(
        |addr| (addr, rendezvous::fetch(addr, &JobSecret::random(), 1, 2, timeout)),
        |(_, r)| !matches!(r, Err(RendezvousError::Unreachable { .. })),
    );
    match r {
        Err(RendezvousError::Unreachable { addr: a, after, .. }) => assert_eq!((a, after), (addr, timeout)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_server_without_our_secret_cannot_hand_out_an_id() {
    // A fake server that skips the proof check and replies with an untagged "forged" id.
    let listener = hermetic::listener();
    let addr = listener.local_addr().unwrap();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut challenge = rendezvous::MAGIC.to_vec();
        challenge.extend_from_slice(&rendezvous::VERSION.to_le_bytes());
        challenge.extend_from_slice(&[0u8; 32]);
        s.write_all(&(challenge.len() as u32).to_le_bytes()).unwrap();
        s.write_all(&challenge).unwrap();
        let mut hello = vec![0u8; 4 + rendezvous::HELLO_LEN];
        s.read_exact(&mut hello).unwrap();
        let mut reply = vec![0u8; 33];
        reply.extend_from_slice(b"forged");
        s.write_all(&(reply.len() as u32).to_le_bytes()).unwrap();
        s.write_all(&reply).unwrap();
    });
    match rendezvous::fetch(addr, &JobSecret::random(), 1, 2, LONG) {
        Err(RendezvousError::Protocol { reason, .. }) => assert!(reason.contains("not authenticated"), "{reason}"),
        other => panic!("expected a protocol error, got {other:?}"),
    }
    fake.join().unwrap();
}

#[test]
fn bad_arguments_are_rejected() {
    let k = JobSecret::random();
    let big = vec![0u8; rendezvous::MAX_PAYLOAD + 1];
    let e = rendezvous::serve(loopback(), k.clone(), &big, 2, LONG).unwrap_err();
    assert!(matches!(e, RendezvousError::InvalidArgument { what: "payload", .. }), "{e}");
    let e = rendezvous::serve(loopback(), k.clone(), b"", 0, LONG).unwrap_err();
    assert!(matches!(e, RendezvousError::InvalidArgument { what: "world_size", .. }), "{e}");
    for (rank, world) in [(0, 2), (2, 2)] {
        let e = rendezvous::fetch(loopback(), &k, rank, world, LONG).unwrap_err();
        assert!(matches!(e, RendezvousError::InvalidArgument { what: "rank", .. }), "{e}");
    }
    // Binding an address this host does not have fails with the address in the error.
    let e = rendezvous::serve("192.0.2.1:4000".parse().unwrap(), k.clone(), b"", 2, LONG).unwrap_err();
    assert!(matches!(e, RendezvousError::Io { op: "bind", .. }) && e.to_string().contains("192.0.2.1:4000"), "{e}");
    // World size 1: nothing to wait for.
    rendezvous::serve(loopback(), k, b"", 1, LONG).unwrap().wait().unwrap();
}
