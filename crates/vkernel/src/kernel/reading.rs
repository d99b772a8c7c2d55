//! Reading a host's main socket and the threads' answer sockets: who
//! reads (the reader roles, [`Reading`]), one datagram or a batch at a
//! time, bulk chunks received in place, and what waits unread when timers
//! fall due.
//!
//! Any thread that waits reads: there is no network thread on the common
//! path (see the module docs of `kernel`).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use vkernel_proto::wire::MAX_DATAGRAM;
use vkernel_proto::{Completion, Micros, Pid};

use super::shared::State;
use super::Shared;

/// In [`Shared::blocked_readers`]: a lone reader waits in the socket.
pub(super) const LONE: u64 = 1 << 63;

/// How a thread blocked as a reader of the main socket waits
/// ([`Shared::enter_reader`]); leaving the role on drop.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Reading {
    /// In the socket itself, alone ([`Shared::recv_lone`]).
    Lone,
    /// The only reader, in `poll` on the socket and its eventfd.
    Alone,
    /// One of several, in its epoll set (the socket registered exclusive).
    Shared,
    /// Not a reader: a lone one is in the socket. On its eventfd alone;
    /// counted in `Shared::gated` if true.
    Gated(bool),
}

/// A thread's role as a blocked reader of a host's main socket.
pub(crate) struct ReaderRole<'a>(&'a Shared, Reading);

impl ReaderRole<'_> {
    /// How the thread waits.
    pub(crate) fn reading(&self) -> Reading {
        self.1
    }
}

impl Drop for ReaderRole<'_> {
    fn drop(&mut self) {
        let sh = self.0;
        match self.1 {
            Reading::Lone => {
                sh.net.set_lone(false);
                let before = sh.blocked_readers.fetch_sub(1 | LONE, Ordering::SeqCst);
                // A thread that came to read meanwhile is gated, or about
                // to be: nobody reads the socket now but the background
                // thread.
                if before & !LONE > 1 || sh.gated.load(Ordering::SeqCst) > 0 {
                    sh.nudge_background();
                }
            }
            Reading::Alone | Reading::Shared => {
                sh.blocked_readers.fetch_sub(1, Ordering::AcqRel);
            }
            Reading::Gated(true) => {
                sh.gated.fetch_sub(1, Ordering::AcqRel);
            }
            Reading::Gated(false) => {}
        }
    }
}

/// What [`Shared::recv_in_place`] did.
enum InPlace {
    /// Took a datagram (and this completion, if it was the caller's), or
    /// took none but has the caller's completion (from a timer).
    Done(Option<Completion>),
    /// Nothing queued.
    Empty,
    /// Took nothing: read the next datagram as usual.
    No,
    /// Took nothing: the next datagram is a small bulk chunk, best taken
    /// with the ones behind it ([`Shared::recv_batch_from`]).
    Small,
}

/// Bulk chunks below this many data bytes are received in batches, not
/// in place: a copy of so few bytes costs less than the extra call.
const SMALL_CHUNK: usize = 8192;

/// True if the datagram (or its fixed part) is a bulk chunk: MoveTo
/// data, or MoveFrom data coming back.
fn is_bulk(d: &[u8]) -> bool {
    let pt = d.get(vkernel_proto::wire::field::PTYPE).copied();
    pt.and_then(vkernel_proto::wire::PacketType::from_u8)
        .is_some_and(|t| t.is_bulk())
}

thread_local! {
    static RECV_BUF: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; MAX_DATAGRAM + 1]);
    /// This thread holds the batch slots and is handling what it read
    /// there (see [`Shared::read_unread_main`]).
    static IN_BATCH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The most `recvmmsg` calls [`Shared::read_unread_main`] makes before
/// timeouts.
const UNREAD_BATCHES: usize = 2;

impl Shared {
    /// Before retransmissions are due: reads what waits in the answer
    /// sockets of the processes concerned whose threads are blocked (not
    /// scheduled yet since their reply came, on a loaded machine), so the
    /// reply is taken as such rather than the request sent again. Their
    /// completions wake them as usual.
    pub(super) fn read_unread_answers(&self, st: &mut State, now: Micros) {
        let mut due = Vec::new();
        st.engine.due_retransmissions(now, &mut due);
        if due.is_empty() {
            return;
        }
        // Answers to Sends without a segment carry no data: a fixed part
        // and at most an authentication trailer.
        let mut buf = [0u8; 1024];
        for pid in due {
            let Some(sock) = st.waiters.get(&pid).and_then(|w| w.blocked_in_answer()) else {
                continue;
            };
            for _ in 0..4 {
                let Some((len, from)) = self.net.recv_answer(&sock, &mut buf) else {
                    break;
                };
                self.net
                    .counters
                    .answers_for_others
                    .fetch_add(1, Ordering::Relaxed);
                if let Some(tr) = &self.tracer {
                    tr.datagram(false, &buf[..len]);
                }
                st.engine.handle_datagram(now, from, &buf[..len]);
            }
        }
    }

    /// Before timeouts fire: takes what waits in the main socket, so that
    /// an answer that came in time is seen as such. A process moving data
    /// write-behind does not wait, so nothing of it reads the transfers'
    /// acknowledgements; when its next call found a probe due, the
    /// acknowledgement was often queued unread, and the probe (or, later,
    /// a timeout and a window cut) needless.
    ///
    /// False if another thread holds the batch slots: it is reading, or
    /// holds datagrams it has not handled yet. (The slots are taken after
    /// the engine lock here, before it in `recv_batch_from`: so only
    /// tried, never waited for.)
    pub(super) fn read_unread_main(&self, st: &mut State, now: Micros) -> bool {
        let Ok(mut slot) = self.rx_batch.try_lock() else {
            // This thread's own batch has been handled by now.
            return IN_BATCH.with(|b| b.get());
        };
        let b = slot.get_or_insert_with(Box::default);
        for _ in 0..UNREAD_BATCHES {
            let k = self.net.recv_batch(b, false);
            for (data, from) in b.datagrams() {
                if let Some(tr) = &self.tracer {
                    tr.datagram(false, data);
                }
                st.engine.handle_datagram(now, from, data);
            }
            if k < crate::net::RECV_BATCH {
                break;
            }
        }
        true
    }

    /// Reads and processes what waits on the calling thread's answer
    /// socket `sock` (at most 8 datagrams, up to the one that completes
    /// `me`'s operation): that completion, if one came.
    pub(crate) fn poll_answer(&self, me: Pid, sock: &std::net::UdpSocket) -> Option<Completion> {
        let mut mine = None;
        RECV_BUF.with(|b| {
            let mut buf = b.borrow_mut();
            for _ in 0..8 {
                let Some((len, from)) = self.net.recv_answer(sock, &mut buf) else {
                    break;
                };
                mine = self.handle_answer(me, from, &buf[..len]);
                if mine.is_some() {
                    // Done: no empty read after the reply.
                    break;
                }
            }
        });
        mine
    }

    /// Handles a datagram read from `me`'s thread's answer socket: `me`'s
    /// completion, if it produced it.
    pub(crate) fn handle_answer(
        &self,
        me: Pid,
        from: SocketAddr,
        data: &[u8],
    ) -> Option<Completion> {
        if let Some(tr) = &self.tracer {
            tr.datagram(false, data);
        }
        self.with_engine_as(Some(me), |e, now| e.handle_datagram(now, from, data))
            .1
    }

    /// Reads and processes up to `max` queued datagrams.
    pub(crate) fn poll_socket(&self, max: usize) -> usize {
        self.poll_socket_as(None, max).0
    }

    /// [`Shared::poll_socket`] by the waiting process `me`: returns its own
    /// completion if one of the datagrams produced it. (It still drains up
    /// to `max`: a datagram left behind might wait for a timer, since
    /// exclusive epoll wakes one reader per arrival.)
    pub(crate) fn poll_socket_as(
        &self,
        me: Option<Pid>,
        max: usize,
    ) -> (usize, Option<Completion>) {
        let mut n = 0;
        let mut mine = None;
        RECV_BUF.with(|b| {
            let mut buf = b.borrow_mut();
            while n < max {
                // A lone reader waits in the main socket: leave it to it
                // (`try_recv` below then reads the group socket only).
                let lone = self.net.lone();
                // (Not while tracing: the tracer records whole datagrams.)
                if !lone && self.bulk_rx.load(Ordering::Relaxed) && self.tracer.is_none() {
                    match self.recv_in_place(me, &mut buf) {
                        InPlace::Done(c) => {
                            n += 1;
                            if c.is_some() {
                                mine = c;
                            }
                            continue;
                        }
                        InPlace::Empty if !self.net.has_multicast_socket() => break,
                        InPlace::Small => {
                            let (k, c) = self.recv_batch_from(me).unwrap_or((0, None));
                            n += k;
                            if c.is_some() {
                                mine = c;
                            }
                            if k > 0 {
                                continue;
                            }
                        }
                        _ => {}
                    }
                }
                // Small datagrams, when the caller takes several: all that
                // are queued by one recvmmsg, under one engine lock (a
                // loaded server's Sends; and a lone one costs one call,
                // not a second empty recv).
                if !lone
                    && max > 1
                    && self.tracer.is_none()
                    && !self.bulk_rx.load(Ordering::Relaxed)
                {
                    if let Some((k, c)) = self.recv_batch_from(me) {
                        n += k;
                        if c.is_some() {
                            mine = c;
                        }
                        if k == crate::net::RECV_BATCH {
                            continue;
                        }
                        if !self.net.has_multicast_socket() {
                            break;
                        }
                    }
                }
                let Some((len, from)) = self.net.try_recv(&mut buf) else {
                    break;
                };
                n += 1;
                let data = &buf[..len];
                let bulk = is_bulk(data);
                if bulk != self.bulk_rx.load(Ordering::Relaxed) {
                    self.bulk_rx.store(bulk, Ordering::Relaxed);
                }
                if let Some(tr) = &self.tracer {
                    tr.datagram(false, data);
                }
                let (_, c) = self.with_engine_as(me, |e, now| e.handle_datagram(now, from, data));
                if c.is_some() {
                    mine = c;
                }
            }
        });
        (n, mine)
    }

    /// Takes the next datagram, receiving a bulk chunk's data straight into
    /// the lent buffer it is for (one copy fewer), under the engine lock
    /// that keeps the buffer lent. Another reader may take the datagram
    /// between the peek and the receive: then what arrived (whatever it
    /// is) is put together and handled as usual, and the place, which only
    /// a chunk not yet received gets, waits for the real chunk.
    fn recv_in_place(&self, me: Option<Pid>, spill: &mut [u8]) -> InPlace {
        use vkernel_proto::wire::FIXED_BYTES;
        let mut head = [0u8; FIXED_BYTES];
        let Some((k, _)) = self.net.peek(&mut head) else {
            return InPlace::Empty;
        };
        if k < FIXED_BYTES || !is_bulk(&head) {
            self.bulk_rx.store(false, Ordering::Relaxed);
            return InPlace::No;
        }
        let len_field = vkernel_proto::wire::field::LENGTH;
        let data_len = head
            .get(len_field)
            .and_then(|b| b.try_into().ok())
            .map_or(usize::MAX, |b| u32::from_be_bytes(b) as usize);
        if data_len < SMALL_CHUNK {
            return InPlace::Small;
        }
        let (done, mine) = self.with_engine_as(me, |e, now| {
            // Peek again under the lock: the datagram peeked before may have
            // been taken and handled since, and its transfer forgotten by
            // the engine (an exchange remembers its last few), which would then
            // offer its place again; whatever this thread then received
            // would land there and nothing would put the real data back.
            // A datagram still queued now is handled only after this lock
            // is released, so if another reader takes it, its data is
            // written over whatever lands in the place meanwhile.
            let mut again = [0u8; FIXED_BYTES];
            let still = self
                .net
                .peek(&mut again)
                .is_some_and(|(k, _)| k >= FIXED_BYTES && again == head);
            let slot = if still { e.placement(&head) } else { None };
            let Some(mut slot) = slot else {
                // Not placeable (held already, say): read it as usual,
                // under this lock rather than taking it again.
                let Some((len, from)) = self.net.try_recv(spill) else {
                    return false;
                };
                e.handle_datagram(now, from, &spill[..len]);
                return true;
            };
            let want = slot.len();
            let mut got = [0u8; FIXED_BYTES];
            let Some(raw) = slot.raw() else {
                return false;
            };
            let Some((len, from)) = self.net.recv_parts(&mut got, raw, spill) else {
                return false;
            };
            let c = &self.net.counters;
            if len == FIXED_BYTES + want && got == head {
                c.bulk_in_place.fetch_add(1, Ordering::Relaxed);
                e.handle_placed(now, from, &got);
            } else {
                c.bulk_in_place_missed.fetch_add(1, Ordering::Relaxed);
                let mut whole = Vec::with_capacity(len);
                whole.extend_from_slice(&got[..len.min(FIXED_BYTES)]);
                let in_slot = len.saturating_sub(FIXED_BYTES).min(want);
                slot.append_to(in_slot, &mut whole);
                let rest = len.saturating_sub(FIXED_BYTES + want);
                whole.extend_from_slice(&spill[..rest.min(spill.len())]);
                e.handle_datagram(now, from, &whole);
            }
            true
        });
        // (A completion of the caller's from a timer run in the same call
        // is returned even if no datagram was taken.)
        if done || mine.is_some() {
            InPlace::Done(mine)
        } else {
            InPlace::No
        }
    }

    /// Takes up to 32 queued datagrams in one call and handles them under
    /// one engine lock: how many, and `me`'s completion if one of them
    /// produced it; `None` if another thread holds the slots (nothing was
    /// read).
    fn recv_batch_from(&self, me: Option<Pid>) -> Option<(usize, Option<Completion>)> {
        let mut slot = self.rx_batch.try_lock().ok()?;
        let b = slot.get_or_insert_with(Box::default);
        if self.net.recv_batch(b, false) == 0 {
            return Some((0, None));
        }
        Some(self.handle_batch(me, b))
    }

    /// Waits in the main socket as its lone reader (the caller holds the
    /// [`Reading::Lone`] role, and its thread is noted as waiting there)
    /// until datagrams come, a wake-up, or the receive timeout; then
    /// handles them as [`Shared::recv_batch_from`] does. How many, and
    /// `me`'s completion if one of them produced it.
    pub(crate) fn recv_lone(&self, me: Pid) -> (usize, Option<Completion>) {
        // Never contended: the role is one thread's at a time.
        let mut slot = match self.lone_batch.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let b = slot.get_or_insert_with(Box::default);
        let n = self.net.recv_batch(b, true);
        // Others may read again (new readers still wait for the role to
        // end).
        self.net.set_lone(false);
        let c = &self.net.counters;
        c.lone_waits.fetch_add(1, Ordering::Relaxed);
        if b.wakes > 0 {
            c.lone_wakes.fetch_add(1, Ordering::Relaxed);
        } else if n == 0 {
            c.lone_timeouts.fetch_add(1, Ordering::Relaxed);
        }
        if n == 0 {
            return (0, None);
        }
        self.handle_batch(Some(me), b)
    }

    /// Handles the datagrams of `b` under one engine lock.
    fn handle_batch(
        &self,
        me: Option<Pid>,
        b: &crate::net::RecvBatch,
    ) -> (usize, Option<Completion>) {
        // As one datagram at a time would: a bulk stream's next chunks are
        // received in place.
        let bulk = b.datagrams().last().is_some_and(|(d, _)| is_bulk(d));
        if bulk != self.bulk_rx.load(Ordering::Relaxed) {
            self.bulk_rx.store(bulk, Ordering::Relaxed);
        }
        IN_BATCH.with(|x| x.set(true));
        let (_, mine) = self.with_engine_as(me, |e, now| {
            for (data, from) in b.datagrams() {
                e.handle_datagram(now, from, data);
            }
        });
        IN_BATCH.with(|x| x.set(false));
        (b.len(), mine)
    }

    /// Whether a reader blocking for up to `timeout` may wait in the
    /// socket itself ([`Shared::enter_reader`]): the next timer is far
    /// enough off for the socket's millisecond timeout (which this sets),
    /// and datagrams are taken whole (no bulk stream received in place,
    /// no tracer).
    pub(crate) fn may_wait_lone(&self, timeout: Duration) -> bool {
        self.tracer.is_none()
            && !self.bulk_rx.load(Ordering::Relaxed)
            && self.net.set_recv_timeout(timeout)
    }

    /// Enters a thread blocking as a reader of the main socket. `may_lone`:
    /// it can wait in the socket itself (`recvmmsg`, one system call where
    /// `poll` and a read take two), which it then does if no other reader
    /// is blocked. While it does, nobody else reads the socket, since a
    /// wake-up (an empty datagram) another took would leave it asleep: a
    /// thread that comes to read meanwhile waits on its eventfd, and, if
    /// it `needs_socket` (what it waits for may come in a datagram), the
    /// lone reader has the background thread read once it leaves.
    pub(crate) fn enter_reader(&self, may_lone: bool, needs_socket: bool) -> ReaderRole<'_> {
        let r = &self.blocked_readers;
        if may_lone
            && r.compare_exchange(0, 1 | LONE, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            self.net.set_lone(true);
            return ReaderRole(self, Reading::Lone);
        }
        let before = r.fetch_add(1, Ordering::SeqCst);
        if before & LONE != 0 {
            // Counted as gated before leaving the readers: the lone reader
            // sees one or the other.
            if needs_socket {
                self.gated.fetch_add(1, Ordering::SeqCst);
            }
            r.fetch_sub(1, Ordering::SeqCst);
            return ReaderRole(self, Reading::Gated(needs_socket));
        }
        ReaderRole(
            self,
            if before == 0 {
                Reading::Alone
            } else {
                Reading::Shared
            },
        )
    }

    /// Threads that will read the socket promptly (spinning or blocked on
    /// it; a lone reader counts once).
    pub(crate) fn readers(&self) -> usize {
        (self.spinning() + (self.blocked_readers.load(Ordering::Acquire) & !LONE)) as usize
    }
}
