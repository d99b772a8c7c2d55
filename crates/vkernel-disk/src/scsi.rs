//! The SCSI block command set as a pure function layer: CDB parsing,
//! fixed-format sense data, and the data-in pages of the non-I/O commands.
//!
//! Nothing here does I/O. [`decode`] turns a CDB and a description of the
//! (virtual) device into an [`Action`] — data to return, or a validated
//! read/write/flush/unmap range for the caller to carry out — or a
//! [`Sense`] for CHECK CONDITION. It never panics on any input (see
//! [`fuzz_cdb`]).

/// SCSI status: GOOD.
pub const STATUS_GOOD: u8 = 0x00;
/// SCSI status: CHECK CONDITION (sense data describes the error).
pub const STATUS_CHECK_CONDITION: u8 = 0x02;

/// Operation codes handled by the device server.
pub mod op {
    /// TEST UNIT READY.
    pub const TEST_UNIT_READY: u8 = 0x00;
    /// REQUEST SENSE.
    pub const REQUEST_SENSE: u8 = 0x03;
    /// READ(6).
    pub const READ_6: u8 = 0x08;
    /// WRITE(6).
    pub const WRITE_6: u8 = 0x0a;
    /// INQUIRY.
    pub const INQUIRY: u8 = 0x12;
    /// MODE SENSE(6).
    pub const MODE_SENSE_6: u8 = 0x1a;
    /// READ CAPACITY(10).
    pub const READ_CAPACITY_10: u8 = 0x25;
    /// READ(10).
    pub const READ_10: u8 = 0x28;
    /// WRITE(10).
    pub const WRITE_10: u8 = 0x2a;
    /// SYNCHRONIZE CACHE(10).
    pub const SYNCHRONIZE_CACHE_10: u8 = 0x35;
    /// UNMAP.
    pub const UNMAP: u8 = 0x42;
    /// MODE SENSE(10).
    pub const MODE_SENSE_10: u8 = 0x5a;
    /// READ(16).
    pub const READ_16: u8 = 0x88;
    /// WRITE(16).
    pub const WRITE_16: u8 = 0x8a;
    /// SYNCHRONIZE CACHE(16).
    pub const SYNCHRONIZE_CACHE_16: u8 = 0x91;
    /// WRITE SAME(16).
    pub const WRITE_SAME_16: u8 = 0x93;
    /// SERVICE ACTION IN(16) (READ CAPACITY(16) is service action 0x10).
    pub const SERVICE_ACTION_IN_16: u8 = 0x9e;
    /// REPORT LUNS.
    pub const REPORT_LUNS: u8 = 0xa0;
}

/// Service action of READ CAPACITY(16) under SERVICE ACTION IN(16).
pub const SA_READ_CAPACITY_16: u8 = 0x10;

/// Sense keys used by this device server.
pub mod key {
    /// NO SENSE.
    pub const NO_SENSE: u8 = 0x0;
    /// NOT READY.
    pub const NOT_READY: u8 = 0x2;
    /// MEDIUM ERROR.
    pub const MEDIUM_ERROR: u8 = 0x3;
    /// HARDWARE ERROR.
    pub const HARDWARE_ERROR: u8 = 0x4;
    /// ILLEGAL REQUEST.
    pub const ILLEGAL_REQUEST: u8 = 0x5;
    /// DATA PROTECT.
    pub const DATA_PROTECT: u8 = 0x7;
    /// ABORTED COMMAND.
    pub const ABORTED_COMMAND: u8 = 0xb;
}

/// Additional sense codes (ASC, ASCQ) used by this device server.
pub mod asc {
    /// NO ADDITIONAL SENSE INFORMATION.
    pub const NONE: (u8, u8) = (0x00, 0x00);
    /// WRITE ERROR.
    pub const WRITE_ERROR: (u8, u8) = (0x0c, 0x00);
    /// UNRECOVERED READ ERROR.
    pub const READ_ERROR: (u8, u8) = (0x11, 0x00);
    /// PARAMETER LIST LENGTH ERROR.
    pub const PARAMETER_LIST_LENGTH: (u8, u8) = (0x1a, 0x00);
    /// INVALID COMMAND OPERATION CODE.
    pub const INVALID_OPCODE: (u8, u8) = (0x20, 0x00);
    /// LOGICAL BLOCK ADDRESS OUT OF RANGE.
    pub const LBA_OUT_OF_RANGE: (u8, u8) = (0x21, 0x00);
    /// INVALID FIELD IN CDB.
    pub const INVALID_FIELD_IN_CDB: (u8, u8) = (0x24, 0x00);
    /// INVALID FIELD IN PARAMETER LIST.
    pub const INVALID_FIELD_IN_PARAM: (u8, u8) = (0x26, 0x00);
    /// WRITE PROTECTED.
    pub const WRITE_PROTECTED: (u8, u8) = (0x27, 0x00);
    /// SAVING PARAMETERS NOT SUPPORTED.
    pub const SAVING_NOT_SUPPORTED: (u8, u8) = (0x39, 0x00);
    /// INTERNAL TARGET FAILURE.
    pub const INTERNAL_TARGET_FAILURE: (u8, u8) = (0x44, 0x00);
}

/// Length of the fixed-format sense data this device returns.
pub const SENSE_LEN: usize = 18;

/// Fixed-format sense data (SPC-4 4.5.3), current error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sense {
    /// Sense key (4 bits).
    pub key: u8,
    /// Additional sense code.
    pub asc: u8,
    /// Additional sense code qualifier.
    pub ascq: u8,
    /// INFORMATION field (e.g. the first bad LBA), if valid.
    pub info: Option<u32>,
    /// Sense-key-specific field pointer: (byte in CDB / parameter list, bit),
    /// and whether it points into the CDB (C/D = 1) or the parameter list.
    pub field: Option<FieldPointer>,
}

/// SENSE KEY SPECIFIC field pointer for ILLEGAL REQUEST.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldPointer {
    /// True if the error is in the CDB, false if in the parameter list.
    pub in_cdb: bool,
    /// Byte number of the bad field.
    pub byte: u16,
    /// Bit number (0–7) of the bad field's most significant bit, if known.
    pub bit: Option<u8>,
}

impl Sense {
    /// A sense with a key and (ASC, ASCQ), no information or pointer.
    pub const fn new(key: u8, code: (u8, u8)) -> Sense {
        Sense {
            key,
            asc: code.0,
            ascq: code.1,
            info: None,
            field: None,
        }
    }

    /// ILLEGAL REQUEST / INVALID COMMAND OPERATION CODE (pointer at byte 0).
    pub const fn invalid_opcode() -> Sense {
        Sense {
            field: Some(FieldPointer {
                in_cdb: true,
                byte: 0,
                bit: None,
            }),
            ..Sense::new(key::ILLEGAL_REQUEST, asc::INVALID_OPCODE)
        }
    }

    /// ILLEGAL REQUEST / INVALID FIELD IN CDB pointing at `byte`.
    pub const fn invalid_field(byte: u16) -> Sense {
        Sense {
            field: Some(FieldPointer {
                in_cdb: true,
                byte,
                bit: None,
            }),
            ..Sense::new(key::ILLEGAL_REQUEST, asc::INVALID_FIELD_IN_CDB)
        }
    }

    /// ILLEGAL REQUEST / INVALID FIELD IN PARAMETER LIST pointing at `byte`.
    pub const fn invalid_param(byte: u16) -> Sense {
        Sense {
            field: Some(FieldPointer {
                in_cdb: false,
                byte,
                bit: None,
            }),
            ..Sense::new(key::ILLEGAL_REQUEST, asc::INVALID_FIELD_IN_PARAM)
        }
    }

    /// ILLEGAL REQUEST / LOGICAL BLOCK ADDRESS OUT OF RANGE.
    pub fn lba_out_of_range(lba: u64) -> Sense {
        Sense {
            info: u32::try_from(lba).ok(),
            ..Sense::new(key::ILLEGAL_REQUEST, asc::LBA_OUT_OF_RANGE)
        }
    }

    /// DATA PROTECT / WRITE PROTECTED.
    pub const fn write_protected() -> Sense {
        Sense::new(key::DATA_PROTECT, asc::WRITE_PROTECTED)
    }

    /// MEDIUM ERROR / UNRECOVERED READ ERROR.
    pub const fn read_error() -> Sense {
        Sense::new(key::MEDIUM_ERROR, asc::READ_ERROR)
    }

    /// MEDIUM ERROR / WRITE ERROR.
    pub const fn write_error() -> Sense {
        Sense::new(key::MEDIUM_ERROR, asc::WRITE_ERROR)
    }

    /// NO SENSE (what REQUEST SENSE returns when nothing is pending).
    pub const fn no_sense() -> Sense {
        Sense::new(key::NO_SENSE, asc::NONE)
    }

    /// Encodes as 18 bytes of fixed-format sense data, response code 0x70.
    pub fn to_bytes(&self) -> [u8; SENSE_LEN] {
        let mut b = [0u8; SENSE_LEN];
        b[0] = 0x70 | if self.info.is_some() { 0x80 } else { 0 };
        b[2] = self.key & 0x0f;
        if let Some(i) = self.info {
            b[3..7].copy_from_slice(&i.to_be_bytes());
        }
        b[7] = (SENSE_LEN - 8) as u8;
        b[12] = self.asc;
        b[13] = self.ascq;
        if let Some(f) = self.field {
            b[15] =
                0x80 | if f.in_cdb { 0x40 } else { 0 } | f.bit.map_or(0, |bit| 0x08 | (bit & 7));
            b[16..18].copy_from_slice(&f.byte.to_be_bytes());
        }
        b
    }

    /// Decodes fixed-format sense data (response code 0x70 or 0x71);
    /// `None` if too short or of another format.
    pub fn from_bytes(b: &[u8]) -> Option<Sense> {
        if b.len() < 14 || !matches!(b[0] & 0x7f, 0x70 | 0x71) {
            return None;
        }
        let info = (b[0] & 0x80 != 0).then(|| u32::from_be_bytes([b[3], b[4], b[5], b[6]]));
        let field = (b.len() >= 18 && b[15] & 0x80 != 0).then(|| FieldPointer {
            in_cdb: b[15] & 0x40 != 0,
            byte: u16::from_be_bytes([b[16], b[17]]),
            bit: (b[15] & 0x08 != 0).then_some(b[15] & 7),
        });
        Some(Sense {
            key: b[2] & 0x0f,
            asc: b[12],
            ascq: b[13],
            info,
            field,
        })
    }
}

impl std::fmt::Display for Sense {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let k = match self.key {
            key::NO_SENSE => "NO SENSE",
            key::NOT_READY => "NOT READY",
            key::MEDIUM_ERROR => "MEDIUM ERROR",
            key::HARDWARE_ERROR => "HARDWARE ERROR",
            key::ILLEGAL_REQUEST => "ILLEGAL REQUEST",
            key::DATA_PROTECT => "DATA PROTECT",
            key::ABORTED_COMMAND => "ABORTED COMMAND",
            _ => "sense key",
        };
        let what = match (self.asc, self.ascq) {
            (0x20, 0) => " (invalid command operation code)",
            (0x21, 0) => " (logical block address out of range)",
            (0x24, 0) => " (invalid field in CDB)",
            (0x26, 0) => " (invalid field in parameter list)",
            (0x1a, 0) => " (parameter list length error)",
            (0x27, 0) => " (write protected)",
            (0x39, 0) => " (saving parameters not supported)",
            (0x11, 0) => " (unrecovered read error)",
            (0x0c, 0) => " (write error)",
            _ => "",
        };
        write!(
            f,
            "{k} {:#x}, ASC {:#04x} ASCQ {:#04x}{what}",
            self.key, self.asc, self.ascq
        )
    }
}

/// What the device server knows about the (virtual) device a command
/// addresses. A derived virtual device is described by its own view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Number of logical blocks.
    pub blocks: u64,
    /// Logical block length in bytes (a power of two, ≥ 512).
    pub block_size: u32,
    /// Writes fail with DATA PROTECT.
    pub read_only: bool,
    /// Unit serial number (VPD 0x80), ASCII.
    pub serial: String,
    /// 64-bit NAA identifier (VPD 0x83); the top nibble is forced to 5.
    pub naa: u64,
    /// Largest READ/WRITE transfer in blocks (VPD 0xB0); larger → INVALID FIELD IN CDB.
    pub max_transfer_blocks: u32,
    /// UNMAP and WRITE SAME(16) with UNMAP are supported.
    pub unmap: bool,
    /// A volatile write cache is reported (MODE SENSE caching page WCE).
    pub write_cache: bool,
}

impl DeviceInfo {
    /// A read-write device with defaults for the descriptive fields.
    pub fn new(blocks: u64, block_size: u32) -> DeviceInfo {
        DeviceInfo {
            blocks,
            block_size,
            read_only: false,
            serial: "VK0000000001".into(),
            naa: 0x5000_0000_0000_0001,
            max_transfer_blocks: ((8u64 << 20) / u64::from(block_size.max(1))) as u32,
            unmap: true,
            write_cache: true,
        }
    }
}

/// A validated I/O range: `blocks` logical blocks from `lba` (in the
/// addressed device's own numbering, already checked against its size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    /// First logical block.
    pub lba: u64,
    /// Number of blocks (may be 0).
    pub blocks: u64,
}

/// What the caller must do to carry out a command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Return these bytes (already cut to the allocation length) and GOOD.
    DataIn(Vec<u8>),
    /// Nothing to do: GOOD.
    Good,
    /// Read the range and return it.
    Read {
        /// The blocks.
        range: Range,
        /// FUA (reads: the data must come from the medium; a no-op here).
        fua: bool,
    },
    /// Take `range.blocks × block_size` bytes of data-out and write them.
    Write {
        /// The blocks.
        range: Range,
        /// Force unit access: durable before GOOD.
        fua: bool,
    },
    /// Make the range durable (blocks = 0 in the CDB means "to the end").
    Sync(Range),
    /// Take `param_len` bytes of UNMAP parameter list (data-out) and
    /// decode it with [`decode_unmap`].
    Unmap {
        /// Parameter list length.
        param_len: u16,
    },
    /// WRITE SAME(16): write one block of data-out (zeros if `ndob`) to
    /// every block of the range, deallocating if `unmap`.
    WriteSame {
        /// The blocks.
        range: Range,
        /// Deallocate when the data is zero.
        unmap: bool,
        /// No data-out buffer: the block is all zeros.
        ndob: bool,
    },
}

impl Action {
    /// Bytes of data-out the command expects from the initiator.
    pub fn data_out_len(&self, info: &DeviceInfo) -> u64 {
        match self {
            Action::Write { range, .. } => range.blocks * u64::from(info.block_size),
            Action::Unmap { param_len } => u64::from(*param_len),
            Action::WriteSame { ndob: false, .. } => u64::from(info.block_size),
            _ => 0,
        }
    }

    /// Bytes of data-in the command will return at most.
    pub fn data_in_len(&self, info: &DeviceInfo) -> u64 {
        match self {
            Action::DataIn(d) => d.len() as u64,
            Action::Read { range, .. } => range.blocks * u64::from(info.block_size),
            _ => 0,
        }
    }
}

/// Length of the CDB for an operation code by its group (SPC-4 4.2.5.1);
/// `None` for the variable-length and vendor-specific groups.
pub fn cdb_len(opcode: u8) -> Option<usize> {
    match opcode >> 5 {
        0 => Some(6),
        1 | 2 => Some(10),
        4 => Some(16),
        5 => Some(12),
        _ => None,
    }
}

fn be16(b: &[u8], i: usize) -> u16 {
    u16::from_be_bytes([b[i], b[i + 1]])
}
fn be32(b: &[u8], i: usize) -> u32 {
    u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}
fn be64(b: &[u8], i: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[i..i + 8]);
    u64::from_be_bytes(a)
}

/// Truncates a data-in buffer to the allocation length.
fn cut(mut v: Vec<u8>, alloc: usize) -> Action {
    v.truncate(alloc);
    Action::DataIn(v)
}

/// Checks an LBA range against the device (and the transfer limit if `io`).
fn range(
    info: &DeviceInfo,
    lba: u64,
    blocks: u64,
    len_byte: u16,
    io: bool,
) -> Result<Range, Sense> {
    if io && blocks > u64::from(info.max_transfer_blocks) {
        return Err(Sense::invalid_field(len_byte));
    }
    match lba.checked_add(blocks) {
        Some(end) if end <= info.blocks && lba <= info.blocks => Ok(Range { lba, blocks }),
        _ => Err(Sense::lba_out_of_range(lba)),
    }
}

/// Decodes a CDB against a device and says what to do, or why not
/// (CHECK CONDITION with this sense). Pure; never panics.
pub fn decode(info: &DeviceInfo, cdb: &[u8]) -> Result<Action, Sense> {
    let Some(&opcode) = cdb.first() else {
        return Err(Sense::invalid_opcode());
    };
    let Some(n) = cdb_len(opcode) else {
        return Err(Sense::invalid_opcode());
    };
    if !is_supported(opcode) {
        return Err(Sense::invalid_opcode());
    }
    if cdb.len() < n {
        // The CDB is cut short: the first missing byte is the bad field.
        return Err(Sense::invalid_field(cdb.len() as u16));
    }
    let cdb = &cdb[..n];
    // CONTROL byte: NACA and the obsolete LINK bit are not supported.
    if cdb[n - 1] & 0x05 != 0 {
        return Err(Sense::invalid_field(n as u16 - 1));
    }
    match opcode {
        op::TEST_UNIT_READY => Ok(Action::Good),
        op::REQUEST_SENSE => {
            if cdb[1] & 0x01 != 0 {
                // Descriptor-format sense is not supported.
                return Err(Sense::invalid_field(1));
            }
            Ok(cut(Sense::no_sense().to_bytes().to_vec(), cdb[4] as usize))
        }
        op::INQUIRY => inquiry(info, cdb),
        op::READ_CAPACITY_10 => {
            // PMI and LBA fields are obsolete; reject non-zero LBA without PMI.
            if cdb[8] & 0x01 == 0 && be32(cdb, 2) != 0 {
                return Err(Sense::invalid_field(2));
            }
            let last = info.blocks.saturating_sub(1);
            let mut d = Vec::with_capacity(8);
            d.extend_from_slice(&u32::try_from(last).unwrap_or(u32::MAX).to_be_bytes());
            d.extend_from_slice(&info.block_size.to_be_bytes());
            Ok(Action::DataIn(d))
        }
        op::SERVICE_ACTION_IN_16 => {
            if cdb[1] & 0x1f != SA_READ_CAPACITY_16 {
                return Err(Sense::invalid_field(1));
            }
            let mut d = vec![0u8; 32];
            d[0..8].copy_from_slice(&info.blocks.saturating_sub(1).to_be_bytes());
            d[8..12].copy_from_slice(&info.block_size.to_be_bytes());
            if info.unmap {
                d[14] = 0x80 | 0x40; // LBPME, LBPRZ: unmapped blocks read as zeros
            }
            Ok(cut(d, be32(cdb, 10) as usize))
        }
        op::READ_6 | op::WRITE_6 => {
            let lba = u64::from(be32(cdb, 0) & 0x001f_ffff);
            let blocks = match cdb[4] {
                0 => 256,
                b => u64::from(b),
            };
            let r = range(info, lba, blocks, 4, true)?;
            rw(info, opcode == op::WRITE_6, r, false)
        }
        op::READ_10 | op::WRITE_10 | op::READ_16 | op::WRITE_16 => {
            let sixteen = opcode == op::READ_16 || opcode == op::WRITE_16;
            // RDPROTECT/WRPROTECT: no protection information.
            if cdb[1] & 0xe0 != 0 {
                return Err(Sense::invalid_field(1));
            }
            let fua = cdb[1] & 0x08 != 0;
            let (lba, blocks, lb) = if sixteen {
                (be64(cdb, 2), u64::from(be32(cdb, 10)), 10)
            } else {
                (u64::from(be32(cdb, 2)), u64::from(be16(cdb, 7)), 7)
            };
            let r = range(info, lba, blocks, lb, true)?;
            let write = opcode == op::WRITE_10 || opcode == op::WRITE_16;
            rw(info, write, r, fua)
        }
        op::SYNCHRONIZE_CACHE_10 | op::SYNCHRONIZE_CACHE_16 => {
            let (lba, blocks) = if opcode == op::SYNCHRONIZE_CACHE_16 {
                (be64(cdb, 2), u64::from(be32(cdb, 10)))
            } else {
                (u64::from(be32(cdb, 2)), u64::from(be16(cdb, 7)))
            };
            let blocks = if blocks == 0 {
                info.blocks.saturating_sub(lba)
            } else {
                blocks
            };
            Ok(Action::Sync(range(info, lba, blocks, 0, false)?))
        }
        op::MODE_SENSE_6 | op::MODE_SENSE_10 => mode_sense(info, cdb),
        op::REPORT_LUNS => {
            if cdb[2] > 2 {
                return Err(Sense::invalid_field(2));
            }
            let alloc = be32(cdb, 6) as usize;
            if alloc < 16 {
                return Err(Sense::invalid_field(6));
            }
            let mut d = vec![0u8; 16];
            d[0..4].copy_from_slice(&8u32.to_be_bytes()); // one LUN: 0
            Ok(cut(d, alloc))
        }
        op::UNMAP => {
            if !info.unmap {
                return Err(Sense::invalid_opcode());
            }
            if cdb[1] & 0x01 != 0 {
                return Err(Sense::invalid_field(1)); // ANCHOR
            }
            if info.read_only {
                return Err(Sense::write_protected());
            }
            let param_len = be16(cdb, 7);
            if param_len == 0 {
                return Ok(Action::Good);
            }
            if param_len < 8 {
                return Err(Sense::new(key::ILLEGAL_REQUEST, asc::PARAMETER_LIST_LENGTH));
            }
            Ok(Action::Unmap { param_len })
        }
        op::WRITE_SAME_16 => {
            if cdb[1] & 0xe0 != 0 || cdb[1] & 0x10 != 0 {
                return Err(Sense::invalid_field(1)); // WRPROTECT, ANCHOR
            }
            let unmap = cdb[1] & 0x08 != 0;
            let ndob = cdb[1] & 0x01 != 0;
            if unmap && !info.unmap {
                return Err(Sense::invalid_field(1));
            }
            let blocks = u64::from(be32(cdb, 10));
            if blocks == 0 {
                return Err(Sense::invalid_field(10)); // WSNZ = 1
            }
            if blocks > max_write_same(info) {
                return Err(Sense::invalid_field(10));
            }
            let r = range(info, be64(cdb, 2), blocks, 10, false)?;
            if info.read_only {
                return Err(Sense::write_protected());
            }
            Ok(Action::WriteSame {
                range: r,
                unmap,
                ndob,
            })
        }
        _ => Err(Sense::invalid_opcode()),
    }
}

fn is_supported(opcode: u8) -> bool {
    matches!(
        opcode,
        op::TEST_UNIT_READY
            | op::REQUEST_SENSE
            | op::READ_6
            | op::WRITE_6
            | op::INQUIRY
            | op::MODE_SENSE_6
            | op::READ_CAPACITY_10
            | op::READ_10
            | op::WRITE_10
            | op::SYNCHRONIZE_CACHE_10
            | op::UNMAP
            | op::MODE_SENSE_10
            | op::READ_16
            | op::WRITE_16
            | op::SYNCHRONIZE_CACHE_16
            | op::WRITE_SAME_16
            | op::SERVICE_ACTION_IN_16
            | op::REPORT_LUNS
    )
}

/// Largest WRITE SAME in blocks (VPD 0xB0 MAXIMUM WRITE SAME LENGTH).
pub fn max_write_same(info: &DeviceInfo) -> u64 {
    (1u64 << 30) / u64::from(info.block_size.max(1))
}

/// Largest UNMAP LBA count per descriptor (VPD 0xB0).
pub const MAX_UNMAP_BLOCKS: u32 = 1 << 22;
/// Largest UNMAP block descriptor count (VPD 0xB0).
pub const MAX_UNMAP_DESCRIPTORS: u32 = 64;

fn rw(info: &DeviceInfo, write: bool, range: Range, fua: bool) -> Result<Action, Sense> {
    if write {
        if info.read_only {
            return Err(Sense::write_protected());
        }
        Ok(Action::Write { range, fua })
    } else {
        Ok(Action::Read { range, fua })
    }
}

/// Standard INQUIRY data vendor identification (8 bytes).
pub const VENDOR: &[u8; 8] = b"VKERNEL ";
/// Standard INQUIRY data product identification (16 bytes).
pub const PRODUCT: &[u8; 16] = b"IPDISK          ";
/// Standard INQUIRY data product revision (4 bytes).
pub const REVISION: &[u8; 4] = b"0001";

fn inquiry(info: &DeviceInfo, cdb: &[u8]) -> Result<Action, Sense> {
    let evpd = cdb[1] & 0x01 != 0;
    if cdb[1] & 0xfe != 0 {
        return Err(Sense::invalid_field(1)); // CMDDT (obsolete) and reserved bits
    }
    let page = cdb[2];
    let alloc = be16(cdb, 3) as usize;
    if !evpd {
        if page != 0 {
            return Err(Sense::invalid_field(2));
        }
        let mut d = vec![0u8; 36];
        d[0] = 0x00; // connected, direct-access block device
        d[2] = 0x06; // SPC-4
        d[3] = 0x02; // response data format 2
        d[4] = (d.len() - 5) as u8;
        d[7] = 0x02; // CMDQUE: tagged queueing
        d[8..16].copy_from_slice(VENDOR);
        d[16..32].copy_from_slice(PRODUCT);
        d[32..36].copy_from_slice(REVISION);
        return Ok(cut(d, alloc));
    }
    let mut body: Vec<u8> = match page {
        0x00 => {
            let mut v = vec![0x00, 0x80, 0x83, 0xb0];
            if info.unmap {
                v.push(0xb2);
            }
            v
        }
        0x80 => info
            .serial
            .bytes()
            .filter(|b| b.is_ascii_graphic())
            .collect(),
        0x83 => {
            let mut v = Vec::new();
            // NAA designator: binary code set, LU association, type 3 (NAA).
            v.extend_from_slice(&[0x01, 0x03, 0x00, 0x08]);
            let naa = (info.naa & 0x0fff_ffff_ffff_ffff) | 0x5000_0000_0000_0000;
            v.extend_from_slice(&naa.to_be_bytes());
            // T10 vendor ID designator: ASCII, LU association, type 1.
            let mut t10 = VENDOR.to_vec();
            t10.extend(
                info.serial
                    .bytes()
                    .filter(|b| b.is_ascii_graphic())
                    .take(64),
            );
            v.extend_from_slice(&[0x02, 0x01, 0x00, t10.len() as u8]);
            v.extend_from_slice(&t10);
            v
        }
        0xb0 => {
            let mut v = vec![0u8; 0x3c];
            v[0] = 0x01; // WSNZ: WRITE SAME with 0 blocks is rejected
                         // v[0..] is page byte 4 onward.
            let opt = (65536 / info.block_size.max(1)) as u16;
            v[2..4].copy_from_slice(&opt.max(1).to_be_bytes()); // optimal transfer length granularity
            v[4..8].copy_from_slice(&info.max_transfer_blocks.to_be_bytes());
            v[8..12].copy_from_slice(&info.max_transfer_blocks.to_be_bytes()); // optimal transfer length
            if info.unmap {
                v[16..20].copy_from_slice(&MAX_UNMAP_BLOCKS.to_be_bytes());
                v[20..24].copy_from_slice(&MAX_UNMAP_DESCRIPTORS.to_be_bytes());
                v[24..28].copy_from_slice(&1u32.to_be_bytes()); // optimal unmap granularity
            }
            v[32..40].copy_from_slice(&max_write_same(info).to_be_bytes());
            v
        }
        0xb2 if info.unmap => {
            // Threshold exponent 0; LBPU, LBPWS, LBPRZ; provisioning type 2 (thin).
            vec![0x00, 0x80 | 0x40 | 0x04, 0x02, 0x00]
        }
        _ => return Err(Sense::invalid_field(2)),
    };
    let mut d = vec![0x00, page];
    d.extend_from_slice(&(body.len() as u16).to_be_bytes());
    d.append(&mut body);
    Ok(cut(d, alloc))
}

/// Mode pages this device reports.
const PAGE_CACHING: u8 = 0x08;
const PAGE_CONTROL: u8 = 0x0a;
const PAGE_ALL: u8 = 0x3f;

fn mode_page(info: &DeviceInfo, page: u8, changeable: bool) -> Vec<u8> {
    match page {
        PAGE_CACHING => {
            let mut p = vec![0u8; 20];
            p[0] = PAGE_CACHING;
            p[1] = 18;
            if !changeable && info.write_cache {
                p[2] = 0x04; // WCE
            }
            p
        }
        _ => {
            let mut p = vec![0u8; 12];
            p[0] = PAGE_CONTROL;
            p[1] = 10;
            if !changeable {
                p[3] = 0x10; // QUEUE ALGORITHM MODIFIER 1: unrestricted reordering
            }
            p
        }
    }
}

fn mode_sense(info: &DeviceInfo, cdb: &[u8]) -> Result<Action, Sense> {
    let ten = cdb[0] == op::MODE_SENSE_10;
    let dbd = cdb[1] & 0x08 != 0;
    let llbaa = ten && cdb[1] & 0x10 != 0;
    let pc = cdb[2] >> 6;
    let page = cdb[2] & 0x3f;
    let subpage = cdb[3];
    let alloc = if ten {
        be16(cdb, 7) as usize
    } else {
        cdb[4] as usize
    };
    if pc == 3 {
        return Err(Sense::new(key::ILLEGAL_REQUEST, asc::SAVING_NOT_SUPPORTED));
    }
    if subpage != 0 && !(page == PAGE_ALL && subpage == 0xff) {
        return Err(Sense::invalid_field(3));
    }
    let changeable = pc == 1;
    let pages: Vec<u8> = match page {
        PAGE_CACHING | PAGE_CONTROL => mode_page(info, page, changeable),
        PAGE_ALL => {
            let mut v = mode_page(info, PAGE_CACHING, changeable);
            v.extend(mode_page(info, PAGE_CONTROL, changeable));
            v
        }
        _ => return Err(Sense::invalid_field(2)),
    };
    let dev_specific = if info.read_only { 0x80 } else { 0 } | 0x10; // WP, DPOFUA
    let mut bd = Vec::new();
    if !dbd {
        if llbaa {
            bd.extend_from_slice(&info.blocks.to_be_bytes());
            bd.extend_from_slice(&[0, 0, 0, 0]);
            bd.extend_from_slice(&info.block_size.to_be_bytes());
        } else {
            let n = u32::try_from(info.blocks).unwrap_or(u32::MAX);
            bd.extend_from_slice(&n.to_be_bytes());
            bd.push(0);
            bd.extend_from_slice(&info.block_size.to_be_bytes()[1..]);
        }
    }
    let mut d = Vec::new();
    if ten {
        let total = 8 + bd.len() + pages.len();
        d.extend_from_slice(&((total - 2) as u16).to_be_bytes());
        d.push(0);
        d.push(dev_specific);
        d.push(if llbaa && !dbd { 0x01 } else { 0 });
        d.push(0);
        d.extend_from_slice(&(bd.len() as u16).to_be_bytes());
    } else {
        let total = 4 + bd.len() + pages.len();
        d.push(u8::try_from(total - 1).unwrap_or(u8::MAX));
        d.push(0);
        d.push(dev_specific);
        d.push(bd.len() as u8);
    }
    d.extend(bd);
    d.extend(pages);
    Ok(cut(d, alloc))
}

/// Decodes an UNMAP parameter list into block ranges checked against the
/// device. Pure; never panics.
pub fn decode_unmap(info: &DeviceInfo, p: &[u8]) -> Result<Vec<Range>, Sense> {
    if p.len() < 8 {
        return Err(Sense::new(key::ILLEGAL_REQUEST, asc::PARAMETER_LIST_LENGTH));
    }
    let bd_len = be16(p, 2) as usize;
    if !bd_len.is_multiple_of(16) || 8 + bd_len > p.len() {
        return Err(Sense::invalid_param(2));
    }
    if (bd_len / 16) as u32 > MAX_UNMAP_DESCRIPTORS {
        return Err(Sense::invalid_param(2));
    }
    let mut out = Vec::with_capacity(bd_len / 16);
    for (i, d) in p[8..8 + bd_len].chunks_exact(16).enumerate() {
        let lba = be64(d, 0);
        let n = be32(d, 8);
        if n > MAX_UNMAP_BLOCKS {
            return Err(Sense::invalid_param((8 + i * 16 + 8) as u16));
        }
        out.push(range(info, lba, u64::from(n), 0, false)?);
    }
    Ok(out)
}

/// Builds a READ(16) or WRITE(16) CDB.
pub fn cdb_rw16(write: bool, lba: u64, blocks: u32, fua: bool) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = if write { op::WRITE_16 } else { op::READ_16 };
    c[1] = if fua { 0x08 } else { 0 };
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// Builds a SYNCHRONIZE CACHE(16) CDB (blocks 0 = to the end).
pub fn cdb_sync16(lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op::SYNCHRONIZE_CACHE_16;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// Builds a WRITE SAME(16) CDB.
pub fn cdb_write_same16(lba: u64, blocks: u32, unmap: bool, ndob: bool) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op::WRITE_SAME_16;
    c[1] = if unmap { 0x08 } else { 0 } | if ndob { 0x01 } else { 0 };
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// Builds a READ CAPACITY(16) CDB.
pub fn cdb_read_capacity16() -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op::SERVICE_ACTION_IN_16;
    c[1] = SA_READ_CAPACITY_16;
    c[10..14].copy_from_slice(&32u32.to_be_bytes());
    c
}

/// Builds an INQUIRY CDB (standard data if `vpd` is `None`).
pub fn cdb_inquiry(vpd: Option<u8>, alloc: u16) -> [u8; 6] {
    let mut c = [0u8; 6];
    c[0] = op::INQUIRY;
    if let Some(p) = vpd {
        c[1] = 1;
        c[2] = p;
    }
    c[3..5].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// Builds an UNMAP CDB and its parameter list for the given ranges.
pub fn unmap_request(ranges: &[(u64, u32)]) -> ([u8; 10], Vec<u8>) {
    let mut p = vec![0u8; 8 + 16 * ranges.len()];
    let bd = (16 * ranges.len()) as u16;
    p[0..2].copy_from_slice(&(bd + 6).to_be_bytes());
    p[2..4].copy_from_slice(&bd.to_be_bytes());
    for (i, (lba, n)) in ranges.iter().enumerate() {
        let o = 8 + 16 * i;
        p[o..o + 8].copy_from_slice(&lba.to_be_bytes());
        p[o + 8..o + 12].copy_from_slice(&n.to_be_bytes());
    }
    let mut c = [0u8; 10];
    c[0] = op::UNMAP;
    c[7..9].copy_from_slice(&(p.len() as u16).to_be_bytes());
    (c, p)
}

/// Fuzzing entry point: decodes arbitrary bytes as a CDB (and, for UNMAP,
/// the rest as a parameter list) against a few device shapes. Must never
/// panic; the result is discarded.
pub fn fuzz_cdb(data: &[u8]) {
    for (blocks, ro) in [
        (0u64, false),
        (1, true),
        (1 << 21, false),
        (u64::MAX, false),
    ] {
        let mut info = DeviceInfo::new(blocks, 512);
        info.read_only = ro;
        let Ok(a) = decode(&info, data) else {
            continue;
        };
        let _ = a.data_out_len(&info);
        let _ = a.data_in_len(&info);
        if let Action::Unmap { .. } = a {
            let _ = decode_unmap(&info, data.get(16..).unwrap_or(&[]));
        }
    }
    if let Some(s) = Sense::from_bytes(data) {
        let _ = s.to_bytes();
        let _ = s.to_string();
    }
}

#[cfg(test)]
mod tests;
