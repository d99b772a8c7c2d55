//! The pipe and team messages, encoded and decoded in one place (the
//! layouts are tabled in [`crate::pipe`] and [`crate::team`]). Word 0 of a
//! request is its code; word 0 of a reply is its [`Status`].

use vkernel::{Message, Pid};

use crate::pipe::{self, End};
use crate::team::{self, Exit};
use crate::Status;

/// A reply that carries only its status.
pub fn status_reply(s: Status) -> Message {
    let mut r = Message::zero();
    r.0[0] = s.0;
    r
}

/// The status of a reply.
pub fn reply_status(m: &Message) -> Status {
    Status(m.0[0])
}

/// An OK reply with a count in word 1 (a pipe id, bytes written or read).
pub fn count_reply(n: u32) -> Message {
    let mut r = status_reply(Status::OK);
    r.0[1] = n;
    r
}

/// The count of a [`count_reply`].
pub fn reply_count(m: &Message) -> u32 {
    m.0[1]
}

/// The reply to a READ at end of file.
pub fn eof_reply() -> Message {
    let mut r = status_reply(Status::OK);
    r.0[2] = 1;
    r
}

/// Whether a READ reply says end of file.
pub fn reply_eof(m: &Message) -> bool {
    m.0[2] == 1
}

fn end_word(e: Option<End>) -> u32 {
    e.map_or(0, |e| e as u32)
}

/// A pipe server request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PipeRequest {
    /// CREATE a pipe of `capacity` bytes (0 = default).
    Create {
        /// Buffer bytes asked for.
        capacity: u32,
    },
    /// WRITE `len` bytes (in the read segment).
    Write {
        /// The pipe.
        pipe: u32,
        /// Bytes to write.
        len: u32,
    },
    /// READ at most `most` bytes (into the write segment).
    Read {
        /// The pipe.
        pipe: u32,
        /// Most bytes wanted.
        most: u32,
    },
    /// CLOSE an end (`None`: not a valid end).
    Close {
        /// The pipe.
        pipe: u32,
        /// Which end.
        end: Option<End>,
    },
    /// HANDOFF an end to another holder.
    HandOff {
        /// The pipe.
        pipe: u32,
        /// Which end.
        end: Option<End>,
        /// The new holder.
        to: Pid,
    },
    /// Internal (the watcher): `holder` no longer exists.
    Gone {
        /// The vanished holder.
        holder: Pid,
    },
}

impl PipeRequest {
    /// The request message.
    pub fn encode(&self) -> Message {
        let (code, w) = match *self {
            PipeRequest::Create { capacity } => (pipe::CREATE, [capacity, 0, 0]),
            PipeRequest::Write { pipe, len } => (pipe::WRITE, [pipe, len, 0]),
            PipeRequest::Read { pipe, most } => (pipe::READ, [pipe, most, 0]),
            PipeRequest::Close { pipe, end } => (pipe::CLOSE, [pipe, end_word(end), 0]),
            PipeRequest::HandOff { pipe, end, to } => (pipe::HANDOFF, [pipe, end_word(end), to.0]),
            PipeRequest::Gone { holder } => (pipe::GONE, [holder.0, 0, 0]),
        };
        let mut m = Message::with_code(code);
        m.0[1..4].copy_from_slice(&w);
        m
    }

    /// Decodes a request; `None` for an unknown code.
    pub fn decode(m: &Message) -> Option<PipeRequest> {
        let (pipe, end) = (m.0[1], End::from_word(m.0[2]));
        Some(match m.code() {
            pipe::CREATE => PipeRequest::Create { capacity: m.0[1] },
            pipe::WRITE => PipeRequest::Write { pipe, len: m.0[2] },
            pipe::READ => PipeRequest::Read { pipe, most: m.0[2] },
            pipe::CLOSE => PipeRequest::Close { pipe, end },
            pipe::HANDOFF => PipeRequest::HandOff {
                pipe,
                end,
                to: Pid(m.0[3]),
            },
            pipe::GONE => PipeRequest::Gone {
                holder: Pid(m.0[1]),
            },
            _ => return None,
        })
    }
}

/// A team server request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TeamRequest {
    /// RUN the program the read segment names, loaded from file server `fs`.
    Run {
        /// The file server.
        fs: Pid,
    },
    /// WAIT for a job to end.
    Wait {
        /// The job.
        job: u32,
    },
    /// KILL a job with a signal.
    Kill {
        /// The job.
        job: u32,
        /// The signal.
        signal: i32,
    },
    /// LOAD: how busy the server is.
    Load,
    /// Internal: a job's program ended.
    Done {
        /// The job.
        job: u32,
        /// How it ended.
        exit: Exit,
    },
}

impl TeamRequest {
    /// The request message.
    pub fn encode(&self) -> Message {
        let (code, w) = match *self {
            TeamRequest::Run { fs } => (team::RUN, [fs.0, 0, 0]),
            TeamRequest::Wait { job } => (team::WAIT, [job, 0, 0]),
            TeamRequest::Kill { job, signal } => (team::KILL, [job, signal as u32, 0]),
            TeamRequest::Load => (team::LOAD, [0; 3]),
            TeamRequest::Done { job, exit } => (
                team::DONE,
                [job, exit.code as u32, exit.signal.unwrap_or(0) as u32],
            ),
        };
        let mut m = Message::with_code(code);
        m.0[1..4].copy_from_slice(&w);
        m
    }

    /// Decodes a request; `None` for an unknown code.
    pub fn decode(m: &Message) -> Option<TeamRequest> {
        Some(match m.code() {
            team::RUN => TeamRequest::Run { fs: Pid(m.0[1]) },
            team::WAIT => TeamRequest::Wait { job: m.0[1] },
            team::KILL => TeamRequest::Kill {
                job: m.0[1],
                signal: m.0[2] as i32,
            },
            team::LOAD => TeamRequest::Load,
            team::DONE => TeamRequest::Done {
                job: m.0[1],
                exit: decode_exit(m),
            },
            _ => return None,
        })
    }
}

fn decode_exit(m: &Message) -> Exit {
    let sig = m.0[3] as i32;
    Exit {
        code: m.0[2] as i32,
        signal: (sig != 0).then_some(sig),
    }
}

/// The OK reply to WAIT: how the job ended.
pub fn exit_reply(e: Exit) -> Message {
    let mut r = status_reply(Status::OK);
    r.0[1] = e.code as u32;
    r.0[2] = e.signal.unwrap_or(0) as u32;
    r
}

/// Decodes a reply to WAIT.
pub fn reply_exit(m: &Message) -> Result<Exit, Status> {
    match reply_status(m) {
        Status::OK => {
            let sig = m.0[2] as i32;
            Ok(Exit {
                code: m.0[1] as i32,
                signal: (sig != 0).then_some(sig),
            })
        }
        s => Err(s),
    }
}

/// The OK reply to RUN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Started {
    /// The job.
    pub job: u32,
    /// The program's stdin pipe (its write end handed to the client).
    pub stdin: u32,
    /// Its stdout pipe (read end handed to the client).
    pub stdout: u32,
    /// Its stderr pipe (read end handed to the client).
    pub stderr: u32,
    /// The pipe server holding them.
    pub pipe_server: Pid,
    /// The program's OS process id.
    pub os_pid: u32,
}

impl Started {
    /// The reply message.
    pub fn encode(&self) -> Message {
        let mut r = status_reply(Status::OK);
        r.0[1..7].copy_from_slice(&[
            self.job,
            self.stdin,
            self.stdout,
            self.stderr,
            self.pipe_server.0,
            self.os_pid,
        ]);
        r
    }

    /// Decodes a reply to RUN.
    pub fn decode(m: &Message) -> Result<Started, Status> {
        match reply_status(m) {
            Status::OK => Ok(Started {
                job: m.0[1],
                stdin: m.0[2],
                stdout: m.0[3],
                stderr: m.0[4],
                pipe_server: Pid(m.0[5]),
                os_pid: m.0[6],
            }),
            s => Err(s),
        }
    }
}

/// The reply to LOAD.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Load {
    /// The machine's load average × 100.
    pub load_x100: u32,
    /// Jobs running.
    pub jobs: u32,
    /// Online CPUs.
    pub cpus: u32,
}

impl Load {
    /// The reply message.
    pub fn encode(&self) -> Message {
        let mut r = status_reply(Status::OK);
        r.0[1..4].copy_from_slice(&[self.load_x100, self.jobs, self.cpus]);
        r
    }

    /// Decodes a reply to LOAD.
    pub fn decode(m: &Message) -> Load {
        Load {
            load_x100: m.0[1],
            jobs: m.0[2],
            cpus: m.0[3],
        }
    }

    /// Load average per CPU.
    pub fn per_cpu(&self) -> f64 {
        f64::from(self.load_x100) / 100.0 / f64::from(self.cpus.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip() {
        let p = [
            PipeRequest::Create { capacity: 4096 },
            PipeRequest::Write { pipe: 3, len: 9 },
            PipeRequest::Read { pipe: 3, most: 9 },
            PipeRequest::Close {
                pipe: 3,
                end: Some(End::Read),
            },
            PipeRequest::HandOff {
                pipe: 3,
                end: Some(End::Write),
                to: Pid(0x1234_5678),
            },
            PipeRequest::Gone { holder: Pid(7) },
        ];
        for r in p {
            assert_eq!(PipeRequest::decode(&r.encode()), Some(r));
        }
        let exit = Exit {
            code: 137,
            signal: Some(9),
        };
        let t = [
            TeamRequest::Run { fs: Pid(5) },
            TeamRequest::Wait { job: 2 },
            TeamRequest::Kill { job: 2, signal: 15 },
            TeamRequest::Load,
            TeamRequest::Done { job: 2, exit },
        ];
        for r in t {
            assert_eq!(TeamRequest::decode(&r.encode()), Some(r));
        }
        assert_eq!(TeamRequest::decode(&Message::with_code(1)), None);
        assert_eq!(reply_exit(&exit_reply(exit)), Ok(exit));
        assert_eq!(reply_exit(&status_reply(Status::EBADF)), Err(Status::EBADF));
        let s = Started {
            job: 1,
            stdin: 2,
            stdout: 3,
            stderr: 4,
            pipe_server: Pid(5),
            os_pid: 6,
        };
        assert_eq!(Started::decode(&s.encode()), Ok(s));
        let l = Load {
            load_x100: 150,
            jobs: 2,
            cpus: 3,
        };
        assert_eq!(Load::decode(&l.encode()), l);
        assert!(reply_eof(&eof_reply()));
        assert_eq!(reply_count(&count_reply(8)), 8);
    }
}
