//! Service names and the logical ids they register under.

use crate::{IpcError, Pid, Process, Scope};

/// The IPdisk (network disk) service.
pub const IPDISK: &str = "ipdisk";
/// The V I/O file server.
pub const FILESERVER: &str = "fileserver";
/// The team server (remote program execution).
pub const TEAM: &str = "team";
/// A host's pipe server (registered in local scope).
pub const PIPE: &str = "pipe";

/// The logical id a service name registers under (SetPid/GetPid): FNV-1a
/// of the name with the most significant bit clear, so every host maps a
/// name to the same id without a registry.
pub fn id(name: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h & 0x7fff_ffff
}

/// The well-known process group of a service: its servers join it, and
/// clients find them with a group Send (one reply or many).
pub fn group(name: &str) -> Pid {
    Pid::well_known_group(id(name) as u16)
}

/// Registers `pid` as the server of `name` in `scope` (SetPid).
pub fn register(p: &Process, name: &str, pid: Pid, scope: Scope) {
    p.set_pid(id(name), pid, scope);
}

/// Finds the server registered as `name` (GetPid in `scope`); `None` when
/// nobody answers.
pub fn find(p: &Process, name: &str, scope: Scope) -> Result<Option<Pid>, IpcError> {
    let pid = p.get_pid(id(name), scope)?;
    Ok((!pid.is_none()).then_some(pid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_and_leave_the_top_bit_clear() {
        // Fixed by the mapping: hosts built from different versions agree.
        assert_eq!(id(""), 0x811c_9dc5 & 0x7fff_ffff);
        for n in [IPDISK, FILESERVER, TEAM, PIPE, "echo"] {
            assert_eq!(id(n) & 0x8000_0000, 0);
            assert_eq!(id(n), id(n));
        }
        assert_ne!(id(IPDISK), id(FILESERVER));
        assert_eq!(group(TEAM), Pid::well_known_group(id(TEAM) as u16));
    }
}
