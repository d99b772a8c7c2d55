//! The [`INVALIDATE`] message a server sends the clients that watch.

use super::*;

/// What an [`INVALIDATE`] message says changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Invalidation {
    /// [`INVAL_ATTR`] | [`INVAL_DATA`] | [`INVAL_ENTRY`].
    pub flags: u32,
    /// The file's (device, inode), when the server names it so.
    pub id: (u32, u64),
    /// Length of the path in the segment (0: none).
    pub path_len: u32,
}

impl Invalidation {
    /// The message (the path goes in the Send's segment).
    pub fn encode(&self) -> Message {
        let mut m = Message::zero();
        let (hi, lo) = split64(self.id.1);
        m.0[..6].copy_from_slice(&[INVALIDATE, self.flags, self.id.0, hi, lo, self.path_len]);
        m
    }

    /// Decodes an [`INVALIDATE`] message (`EPROTO` for another code,
    /// unknown flags or a path over [`MAX_REQUEST_PATH`], two with
    /// [`INVAL_RENAME`]).
    pub fn decode(m: &Message) -> Result<Invalidation, Errno> {
        let w = &m.0;
        let known = INVAL_ATTR | INVAL_DATA | INVAL_ENTRY | INVAL_RENAME | INVAL_EXCHANGE;
        let most = if w[1] & INVAL_RENAME != 0 {
            2 * MAX_REQUEST_PATH + 1
        } else {
            MAX_REQUEST_PATH
        };
        if w[0] & CODE_MASK != INVALIDATE || w[1] & !known != 0 || w[5] as usize > most {
            return Err(Errno::EPROTO);
        }
        Ok(Invalidation {
            flags: w[1],
            id: (w[2], join64(w[3], w[4])),
            path_len: w[5],
        })
    }
}
