//! The attach socket's messages: a Unix SEQPACKET socket, one record per
//! message: eight little-endian u32 words, then an optional payload, with
//! memory files passed alongside (SCM_RIGHTS). See docs/PROTOCOL.md.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// "VKAT": the first word of HELLO and WELCOME.
pub(crate) const MAGIC: u32 = 0x564b_4154;
/// The attach protocol's version.
pub(crate) const VERSION: u32 = 2;
/// The largest payload a record carries.
pub(crate) const MAX_PAYLOAD: usize = 128 << 10;
/// Files one record carries at most.
pub(crate) const MAX_FDS: usize = 3;

/// Record kinds (word 0).
pub(crate) mod kind {
    /// Program → host: [MAGIC, VERSION]. First record.
    pub(crate) const HELLO: u32 = 1;
    /// Host → program: [MAGIC, VERSION, host id, principal]; payload: the
    /// host's UDP address as text.
    pub(crate) const WELCOME: u32 = 2;
    /// Program → host: [id]; files: slot, window and (optionally) peer
    /// page. Creates a process; the answer's v0 is its pid, v1 is 1 if the
    /// peer page was taken.
    pub(crate) const CREATE: u32 = 3;
    /// Program → host: [pid]; file: a new, larger window for the process
    /// (taken by its next ADOPT_WINDOW call).
    pub(crate) const WINDOW: u32 = 4;
    /// Program → host: [id, what, a, b]; payload per `what`. A question
    /// about the host (see [`super::ask`]).
    pub(crate) const ASK: u32 = 5;
    /// Host → program: [id, status, err arg, v0, v1]; payload per question.
    pub(crate) const ANSWER: u32 = 6;
    /// Program → host: []; payload: 16-byte event records
    /// (`crate::direct::Ev::encode`), what its processes did outside the
    /// host, for the host's counters. No answer.
    pub(crate) const TALLY: u32 = 7;
    /// Program → host: []; payload: trace lines (`trace::Event` JSON, one
    /// per line) of what its processes did outside the host, for the
    /// host's `--trace` file. No answer.
    pub(crate) const TRACE: u32 = 8;
    /// Program → host: []. The program closed its kernel: its processes
    /// go now. The host shuts its side for writing (the program's reader
    /// ends, and its processes' calls with it) and takes only reports
    /// (TALLY, TRACE) until the connection closes: processes the program
    /// still holds report what they counted when they end. Sent only to a
    /// host whose WELCOME says it takes it (flags bit 3).
    pub(crate) const DETACH: u32 = 9;
}

/// Questions (ASK's `what`).
pub(crate) mod ask {
    pub(crate) const PROCESS_EXISTS: u32 = 1;
    pub(crate) const STATS_JSON: u32 = 2;
    pub(crate) const PROMETHEUS: u32 = 3;
    pub(crate) const SRTT: u32 = 4;
    pub(crate) const ADD_PEER: u32 = 5;
    /// [pid]: the peer page of that process, as a file with the answer
    /// (only a process of the asker's uid, to a program with peer pages).
    pub(crate) const PEER_PAGE: u32 = 6;
    /// [pid]: that process's window, as a file with the answer (v0: its
    /// generation), on the same terms as PEER_PAGE.
    pub(crate) const WINDOW_OF: u32 = 7;
    /// [host id, pid, n, port]: may `pid` (the asker's) send its remote
    /// Sends itself, from its socket at `port` (docs/PROTOCOL.md §8f)?
    /// v0: the first of `n` sequence numbers reserved for it (v1 = n;
    /// `n` = 0 asks for none); payload:
    /// where that logical host is, if known (an address as text). Refused
    /// to programs of another uid than the host's (or root's), and while
    /// the host authenticates, injects faults or traces datagrams.
    pub(crate) const DIRECT: u32 = 8;
    /// []: the host's keys (`AuthConfig::to_bytes`, its counter start the
    /// host's wall clock now) and, as a file, the page of its packet
    /// counter; only to a program DIRECT grants, of a keyed host.
    pub(crate) const KEYS: u32 = 9;
}

/// One record.
#[derive(Debug, Default)]
pub(crate) struct Record {
    pub(crate) words: [u32; 8],
    pub(crate) payload: Vec<u8>,
    pub(crate) fds: Vec<OwnedFd>,
}

impl Record {
    pub(crate) fn kind(&self) -> u32 {
        self.words[0]
    }
}

/// Sends one record with `fds` attached.
pub(crate) fn send(
    sock: impl AsFd,
    words: &[u32; 8],
    payload: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    let mut head = [0u8; 32];
    for (c, w) in head.chunks_exact_mut(4).zip(words) {
        c.copy_from_slice(&w.to_le_bytes());
    }
    let iov = [IoSlice::new(&head), IoSlice::new(payload)];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !anc.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many files",
        ));
    }
    let n = rustix::net::sendmsg(sock, &iov, &mut anc, SendFlags::NOSIGNAL)?;
    if n != head.len() + payload.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short record"));
    }
    Ok(())
}

/// Receives one record; `Ok(None)` at end of stream (the other side
/// closed or died). A record shorter than its words is an error.
pub(crate) fn recv(sock: impl AsFd) -> io::Result<Option<Record>> {
    let mut head = [0u8; 32];
    let mut payload = vec![0u8; MAX_PAYLOAD];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut anc = RecvAncillaryBuffer::new(&mut space);
    let r = loop {
        let mut iov = [IoSliceMut::new(&mut head), IoSliceMut::new(&mut payload)];
        match rustix::net::recvmsg(&sock, &mut iov, &mut anc, RecvFlags::CMSG_CLOEXEC) {
            Err(rustix::io::Errno::INTR) => continue,
            r => break r?,
        }
    };
    let mut fds = Vec::new();
    for m in anc.drain() {
        if let RecvAncillaryMessage::ScmRights(it) = m {
            fds.extend(it);
        }
    }
    if r.bytes == 0 {
        return Ok(None);
    }
    if r.bytes < head.len() || r.flags.contains(rustix::net::ReturnFlags::TRUNC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "malformed record",
        ));
    }
    let mut words = [0u32; 8];
    for (w, c) in words.iter_mut().zip(head.chunks_exact(4)) {
        *w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
    payload.truncate(r.bytes - head.len());
    Ok(Some(Record {
        words,
        payload,
        fds,
    }))
}

/// A new SEQPACKET socket (close-on-exec).
pub(crate) fn socket() -> io::Result<OwnedFd> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    Ok(rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_carry_words_payload_and_files() {
        use rustix::net::{AddressFamily, SocketFlags, SocketType};
        let (a, b) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        let (_m, f) = super::super::shm::Shm::create("r", 4096).unwrap();
        send(&a, &[1, 2, 3, 4, 5, 6, 7, 8], b"hi", &[f.as_fd()]).unwrap();
        let r = recv(&b).unwrap().unwrap();
        assert_eq!(r.words, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(r.payload, b"hi");
        assert_eq!(r.fds.len(), 1);
        send(&a, &[9; 8], &[], &[]).unwrap();
        assert!(recv(&b).unwrap().unwrap().fds.is_empty());
        drop(a);
        assert!(recv(&b).unwrap().is_none());
    }
}
