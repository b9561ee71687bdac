//! Telling a client that half-closed its connection from one that left.
//!
//! Both look the same to the server: the end of the stream (a FIN) after a complete request.
//! A client that half-closes (`shutdown(SHUT_WR)`, as some proxies and HTTP/1.0-style clients
//! do) still waits for its answer; one that left (a timeout, a killed process) does not, and
//! its queued work should be freed. So hyper is told to keep serving after the end of the
//! stream, and this watch, on a duplicate of the socket's descriptor, sees the FIN while a
//! handler runs and sends the request an interim `100 Continue` (which HTTP/1.1 clients
//! skip). A client that left answers it with a reset, which closes the socket: the
//! connection is then dropped, and its handler with it.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// An interim answer every HTTP/1.1 client must accept before the final one (RFC 9110, 15.2).
const PROBE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// After a probe, how often the socket's state is read until the handler ends.
pub(super) const PROBE_POLL: Duration = Duration::from_millis(10);

/// The TCP state of a socket, as far as this watch needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PeerState {
    Open,
    /// The peer sent its FIN: it may still read.
    HalfClosed,
    /// Reset or fully closed: nothing more can be sent.
    Gone,
}

/// Readiness of a duplicate of a connection's descriptor, registered apart from the one hyper
/// reads through, so that watching it neither takes hyper's bytes nor its wake-ups.
pub(super) struct PeerWatch {
    fd: AsyncFd<OwnedFd>,
}

impl PeerWatch {
    /// `None` where the descriptor cannot be duplicated (out of descriptors): the connection
    /// is then served without the watch.
    pub fn new(socket: RawFd) -> Option<Self> {
        // SAFETY: `dup` of a descriptor the caller owns; the result is checked and owned.
        let dup = unsafe { libc::dup(socket) };
        if dup < 0 {
            return None;
        }
        // SAFETY: `dup` is a new descriptor that nothing else owns.
        let owned = unsafe { OwnedFd::from_raw_fd(dup) };
        // SAFETY: the descriptor is owned by the `AsyncFd` and closed only when it is dropped
        // (which deregisters it first).
        unsafe { AsyncFd::register_with_interest(owned, Interest::READABLE) }
            .ok()
            .map(|fd| Self { fd })
    }

    /// Resolves when the peer has sent its FIN (or reset): bytes of a request alone are
    /// skipped. Resolves at once ever after, so await it until it first resolves only.
    pub async fn read_closed(&self) {
        loop {
            let Ok(mut guard) = self.fd.readable().await else {
                return;
            };
            if guard.ready().is_read_closed() {
                return;
            }
            guard.clear_ready();
        }
    }

    pub fn state(&self) -> PeerState {
        tcp_state(self.fd.get_ref().as_raw_fd())
    }

    /// Sends the interim answer; the peer's kernel resets the connection if the client
    /// closed its socket.
    pub fn probe(&self) {
        // SAFETY: sending a static buffer on an open descriptor, without blocking or SIGPIPE.
        let _ = unsafe {
            libc::send(
                self.fd.get_ref().as_raw_fd(),
                PROBE.as_ptr().cast(),
                PROBE.len(),
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
    }
}

#[cfg(target_os = "linux")]
fn tcp_state(fd: RawFd) -> PeerState {
    // `tcpi_state` values of the kernel's `enum tcp_state`.
    const TCP_CLOSE: u8 = 7;
    const TCP_CLOSE_WAIT: u8 = 8;
    // SAFETY: `tcp_info` is plain data, filled by the kernel up to `len`.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: a valid descriptor and a buffer of `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    match (rc, info.tcpi_state) {
        (0, TCP_CLOSE) => PeerState::Gone,
        (0, TCP_CLOSE_WAIT) => PeerState::HalfClosed,
        (0, _) => PeerState::Open,
        _ => PeerState::Gone,
    }
}

#[cfg(not(target_os = "linux"))]
fn tcp_state(_fd: RawFd) -> PeerState {
    // No portable way to read it: never probe, never drop.
    PeerState::Open
}
