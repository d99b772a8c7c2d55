//! The primitives that move data through lent memory: reply with a
//! segment, MoveTo and MoveFrom, from the caller's own slice or from a
//! window another program maps (`Loan`).

use super::*;

impl LocalProcess {
    /// Reply-with-segment: also writes `data` at `offset` in `to`'s
    /// write-granted segment. Up to one datagram's worth travels in the
    /// reply. More goes ahead of the reply in bulk chunks when the request
    /// is idempotent (nothing waits for an acknowledgement; a lost chunk
    /// makes the request run again), and otherwise by MoveTo before the
    /// reply (blocking until acknowledged; the sender's
    /// [`Reply::seg_bytes`] then does not count them).
    pub(crate) fn reply_with_segment(
        &self,
        msg: &Message,
        to: Pid,
        offset: u32,
        data: &[u8],
    ) -> Result<(), IpcError> {
        self.reply_loan(msg, to, offset, Loan::Own(data))
    }

    /// [`Self::reply_with_segment`] of any lent memory (a window).
    pub(crate) fn reply_loan(
        &self,
        msg: &Message,
        to: Pid,
        offset: u32,
        mut data: Loan<'_>,
    ) -> Result<(), IpcError> {
        match self.reply_loan_now(msg, to, offset, data.reborrow()) {
            Err(IpcError::SegmentTooLarge { .. }) => {
                self.move_to_loan(to, offset, data)?;
                self.reply(msg, to)
            }
            r => r,
        }
    }

    /// [`Self::reply_with_segment`] that never waits: `SegmentTooLarge`
    /// if the data must be moved (and acknowledged) before the reply.
    pub(crate) fn reply_with_segment_now(
        &self,
        msg: &Message,
        to: Pid,
        offset: u32,
        data: &[u8],
    ) -> Result<(), IpcError> {
        self.reply_loan_now(msg, to, offset, Loan::Own(data))
    }

    fn reply_loan_now(
        &self,
        msg: &Message,
        to: Pid,
        offset: u32,
        data: Loan<'_>,
    ) -> Result<(), IpcError> {
        if self.peer_holds(to) {
            // Its sender lent no segment (it would have come through the
            // engine): as the engine says.
            return match data.len() == 0 {
                true => self.reply(msg, to),
                false => Err(IpcError::AccessDenied(to)),
            };
        }
        let m = *msg;
        self.trace(Phase::Reply, to, self.pid, true);
        if let Loan::Own(d) = data {
            if d.len() <= vkernel_proto::MAX_APPEND {
                return self
                    .shared
                    .with_engine(|e, now| e.reply(now, self.pid, to, m, Some((offset, d))));
            }
        }
        let (lease, lent) = data.lend();
        // The engine's hold on `lent` ends before this returns: its chunks
        // are sent (or encoded) under the same lock.
        let r = self
            .shared
            .with_engine(|e, now| e.reply_ahead(now, self.pid, to, m, offset, lent));
        lease.release();
        r
    }

    /// MoveTo: copies `src` into `to`'s write-granted segment at `offset`.
    pub(crate) fn move_to(&self, to: Pid, offset: u32, src: &[u8]) -> Result<usize, IpcError> {
        self.move_to_loan(to, offset, Loan::Own(src))
    }

    /// [`Self::move_to`] from any lent memory (a window).
    pub(crate) fn move_to_loan(
        &self,
        to: Pid,
        offset: u32,
        src: Loan<'_>,
    ) -> Result<usize, IpcError> {
        self.move_lent(to, src, |e, now, lent| {
            e.move_to(now, self.pid, to, offset, lent)
        })
    }

    /// A move with `peer` of the lent `loan`, started by `start`: lent
    /// until the move ends, then released.
    fn move_lent(
        &self,
        peer: Pid,
        loan: Loan<'_>,
        start: impl FnOnce(
            &mut vkernel_proto::Engine,
            Micros,
            vkernel_proto::Seg,
        ) -> Result<Option<usize>, IpcError>,
    ) -> Result<usize, IpcError> {
        if self.peer_holds(peer) {
            return Err(IpcError::AccessDenied(peer));
        }
        let (lease, lent) = loan.lend();
        let r = self.shared.with_engine(|e, now| start(e, now, lent));
        let r = self.finish_move(r, peer);
        lease.release();
        r
    }

    /// MoveTo of `data[range]`, kept rather than copied if it goes
    /// write-behind (see `Process::move_to_shared`).
    pub(crate) fn move_to_shared(
        &self,
        to: Pid,
        offset: u32,
        data: &Arc<[u8]>,
        range: std::ops::Range<usize>,
    ) -> Result<usize, IpcError> {
        let src = vkernel_proto::SharedSeg::new(data.clone(), range)
            .ok_or(IpcError::OutOfBounds(self.pid))?;
        let r = self
            .shared
            .with_engine(|e, now| e.move_to(now, self.pid, to, offset, Box::new(src)));
        self.finish_move(r, to)
    }

    /// MoveFrom: copies from `from`'s read-granted segment at `offset` into `dest`.
    pub(crate) fn move_from(
        &self,
        from: Pid,
        offset: u32,
        dest: &mut [u8],
    ) -> Result<usize, IpcError> {
        self.move_from_loan(from, offset, Loan::OwnMut(dest))
    }

    /// [`Self::move_from`] into any lent memory (a window).
    pub(crate) fn move_from_loan(
        &self,
        from: Pid,
        offset: u32,
        dest: Loan<'_>,
    ) -> Result<usize, IpcError> {
        self.move_lent(from, dest, |e, now, lent| {
            e.move_from(now, self.pid, from, offset, lent)
        })
    }

    fn finish_move(
        &self,
        r: Result<Option<usize>, IpcError>,
        peer: Pid,
    ) -> Result<usize, IpcError> {
        match r? {
            Some(n) => Ok(n),
            None => match self.wait(self.expect_for(peer))? {
                Completion::Move(r) => r,
                _ => Err(self.stray_completion()),
            },
        }
    }
}
