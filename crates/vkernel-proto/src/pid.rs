//! Process identifiers: 32-bit global pids, `logical host (16) ++ local id (16)`.
//!
//! The most significant bit is 0 for processes; pids with it set name process
//! groups. Group ids `0x8000_0000..=0x8000_ffff` are the well-known range
//! (like well-known ports); `AllocateGroupId` draws the others at random.

use std::fmt;

/// A logical host id: the high 16 bits of every pid it issues. MSB is always 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostId(pub u16);

impl HostId {
    /// Largest valid logical host id (MSB clear).
    pub const MAX: u16 = 0x7fff;

    /// True if `self` may name a logical host (non-zero, MSB clear).
    pub fn is_valid(self) -> bool {
        self.0 != 0 && self.0 <= Self::MAX
    }
}

impl fmt::Display for HostId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04x}", self.0)
    }
}

/// A global process id (or, with the MSB set, a group id).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Pid(pub u32);

impl Pid {
    /// The null pid: "no process". `GetPid` returns it when nothing is registered.
    pub const NONE: Pid = Pid(0);
    /// Bit that marks a group id.
    pub const GROUP_BIT: u32 = 0x8000_0000;

    /// Builds a process pid from a host id and a local id.
    pub fn new(host: HostId, local: u16) -> Pid {
        Pid(((host.0 as u32 & 0x7fff) << 16) | local as u32)
    }

    /// The logical host part (high 16 bits, MSB masked off).
    pub fn host(self) -> HostId {
        HostId(((self.0 >> 16) & 0x7fff) as u16)
    }

    /// The locally unique part (low 16 bits).
    pub fn local(self) -> u16 {
        self.0 as u16
    }

    /// True for group ids (MSB set).
    pub fn is_group(self) -> bool {
        self.0 & Self::GROUP_BIT != 0
    }

    /// The well-known group number `n` (`0x8000_0000 | n`).
    pub fn well_known_group(n: u16) -> Pid {
        Pid(Self::GROUP_BIT | n as u32)
    }

    /// True for a group id in the well-known range.
    pub fn is_well_known_group(self) -> bool {
        self.0 >> 16 == 0x8000
    }

    /// True for the null pid.
    pub fn is_none(self) -> bool {
        self.0 == 0
    }

    /// True if this can name a process: not null, not a group, valid host, non-zero local id.
    pub fn is_process(self) -> bool {
        !self.is_group() && self.host().is_valid() && self.local() != 0
    }
}

impl fmt::Debug for Pid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pid({:08x})", self.0)
    }
}

impl fmt::Display for Pid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_parts_roundtrip() {
        let p = Pid::new(HostId(0x1234), 0xbeef);
        assert_eq!(p.host(), HostId(0x1234));
        assert_eq!(p.local(), 0xbeef);
        assert!(!p.is_group());
        assert!(p.is_process());
        assert_eq!(p.0, 0x1234_beef);
    }

    #[test]
    fn host_msb_is_never_set() {
        let p = Pid::new(HostId(0xffff), 1);
        assert!(!p.is_group());
        assert_eq!(p.host(), HostId(0x7fff));
        assert!(!HostId(0x8000).is_valid());
        assert!(!HostId(0).is_valid());
    }

    #[test]
    fn group_bit() {
        assert!(Pid(0x8000_0001).is_group());
        assert!(!Pid(0x8000_0001).is_process());
        assert!(!Pid::NONE.is_process());
    }
}
