use super::*;

fn dev() -> DeviceInfo {
    DeviceInfo::new(1000, 512)
}

fn ro() -> DeviceInfo {
    DeviceInfo {
        read_only: true,
        ..dev()
    }
}

fn sense(r: Result<Action, Sense>) -> (u8, (u8, u8), Option<u16>) {
    match r {
        Err(s) => (s.key, (s.asc, s.ascq), s.field.map(|f| f.byte)),
        Ok(a) => panic!("expected CHECK CONDITION, got {a:?}"),
    }
}

fn data(r: Result<Action, Sense>) -> Vec<u8> {
    match r {
        Ok(Action::DataIn(d)) => d,
        other => panic!("expected data-in, got {other:?}"),
    }
}

const IR: u8 = key::ILLEGAL_REQUEST;

#[test]
fn sense_fixed_format_bytes() {
    let s = Sense::invalid_field(2).to_bytes();
    assert_eq!(s.len(), 18);
    assert_eq!(s[0], 0x70);
    assert_eq!(s[2], 0x05);
    assert_eq!(s[7], 10);
    assert_eq!((s[12], s[13]), (0x24, 0x00));
    assert_eq!(s[15], 0xc0, "SKSV and C/D");
    assert_eq!(u16::from_be_bytes([s[16], s[17]]), 2);
    let o = Sense::lba_out_of_range(77).to_bytes();
    assert_eq!(o[0], 0xf0, "VALID: information field set");
    assert_eq!(u32::from_be_bytes([o[3], o[4], o[5], o[6]]), 77);
    assert_eq!((o[12], o[13]), (0x21, 0));
    let p = Sense::write_protected().to_bytes();
    assert_eq!((p[2], p[12], p[13]), (0x07, 0x27, 0x00));
    for s in [
        Sense::invalid_field(9),
        Sense::invalid_param(3),
        Sense::invalid_opcode(),
        Sense::lba_out_of_range(5),
        Sense::write_protected(),
        Sense {
            field: Some(FieldPointer {
                in_cdb: true,
                byte: 1,
                bit: Some(3),
            }),
            ..Sense::invalid_field(1)
        },
    ] {
        assert_eq!(Sense::from_bytes(&s.to_bytes()), Some(s));
    }
    assert_eq!(Sense::from_bytes(&[0x72; 18]), None);
    assert_eq!(Sense::from_bytes(&[0x70; 5]), None);
    assert!(Sense::invalid_opcode()
        .to_string()
        .contains("invalid command operation code"));
}

#[test]
fn test_unit_ready_and_cdb_lengths() {
    assert_eq!(decode(&dev(), &[0; 6]), Ok(Action::Good));
    assert_eq!(cdb_len(0x28), Some(10));
    assert_eq!(cdb_len(0x88), Some(16));
    assert_eq!(cdb_len(0xa0), Some(12));
    assert_eq!(cdb_len(0x7f), None);
    // Short CDB: invalid field at the first missing byte.
    assert_eq!(
        sense(decode(&dev(), &[0x28, 0, 0])),
        (IR, asc::INVALID_FIELD_IN_CDB, Some(3))
    );
    // Empty CDB, unknown opcodes, variable-length and vendor groups: 0x20.
    for c in [
        &[][..],
        &[0x7f; 16],
        &[0xc0; 16],
        &[0x04; 6],
        &[0x2f; 10],
        &[0x9f; 16],
    ] {
        assert_eq!(sense(decode(&dev(), c)), (IR, asc::INVALID_OPCODE, Some(0)));
    }
    // NACA / LINK in the control byte.
    assert_eq!(
        sense(decode(&dev(), &[0, 0, 0, 0, 0, 0x04])),
        (IR, asc::INVALID_FIELD_IN_CDB, Some(5))
    );
    assert_eq!(
        sense(decode(&dev(), &[0, 0, 0, 0, 0, 0x01])),
        (IR, asc::INVALID_FIELD_IN_CDB, Some(5))
    );
    // Extra bytes beyond the CDB length are ignored.
    assert_eq!(decode(&dev(), &[0; 16]), Ok(Action::Good));
}

#[test]
fn inquiry_standard_and_vpd() {
    let d = data(decode(&dev(), &cdb_inquiry(None, 255)));
    assert_eq!(d.len(), 36);
    assert_eq!(d[0], 0);
    assert_eq!(d[2], 6);
    assert_eq!(d[3], 2);
    assert_eq!(d[4], 31);
    assert_eq!(d[7] & 0x02, 0x02, "CMDQUE");
    assert_eq!(&d[8..16], VENDOR);
    assert_eq!(&d[16..32], PRODUCT);
    // Allocation length cuts.
    assert_eq!(data(decode(&dev(), &cdb_inquiry(None, 5))).len(), 5);
    assert!(data(decode(&dev(), &cdb_inquiry(None, 0))).is_empty());
    // Page code without EVPD, CMDDT, unknown page.
    assert_eq!(
        sense(decode(&dev(), &[0x12, 0, 0x80, 0, 36, 0])),
        (IR, asc::INVALID_FIELD_IN_CDB, Some(2))
    );
    assert_eq!(
        sense(decode(&dev(), &[0x12, 2, 0, 0, 36, 0])),
        (IR, asc::INVALID_FIELD_IN_CDB, Some(1))
    );
    assert_eq!(
        sense(decode(&dev(), &cdb_inquiry(Some(0x99), 255))),
        (IR, asc::INVALID_FIELD_IN_CDB, Some(2))
    );
    let p0 = data(decode(&dev(), &cdb_inquiry(Some(0), 255)));
    assert_eq!(&p0[..4], &[0, 0, 0, 5]);
    assert_eq!(&p0[4..], &[0x00, 0x80, 0x83, 0xb0, 0xb2]);
    let p80 = data(decode(&dev(), &cdb_inquiry(Some(0x80), 255)));
    assert_eq!(&p80[4..], b"VK0000000001");
    let p83 = data(decode(&dev(), &cdb_inquiry(Some(0x83), 255)));
    assert_eq!(p83[1], 0x83);
    assert_eq!(&p83[4..8], &[0x01, 0x03, 0x00, 0x08]);
    assert_eq!(p83[8] >> 4, 5, "NAA 5");
    assert_eq!(&p83[16..20], &[0x02, 0x01, 0x00, 20]);
    assert_eq!(&p83[20..28], VENDOR);
    assert_eq!(u16::from_be_bytes([p83[2], p83[3]]) as usize, p83.len() - 4);
    let b0 = data(decode(&dev(), &cdb_inquiry(Some(0xb0), 255)));
    assert_eq!(u16::from_be_bytes([b0[2], b0[3]]), 0x3c);
    assert_eq!(
        u32::from_be_bytes(b0[8..12].try_into().unwrap()),
        16384,
        "8 MiB in blocks"
    );
    assert_eq!(
        u32::from_be_bytes(b0[20..24].try_into().unwrap()),
        MAX_UNMAP_BLOCKS
    );
    let b2 = data(decode(&dev(), &cdb_inquiry(Some(0xb2), 255)));
    assert_eq!(b2[5] & 0x80, 0x80, "LBPU");
    let no_unmap = DeviceInfo {
        unmap: false,
        ..dev()
    };
    assert_eq!(
        sense(decode(&no_unmap, &cdb_inquiry(Some(0xb2), 255))).1,
        asc::INVALID_FIELD_IN_CDB
    );
}

#[test]
fn read_capacity_10_and_16() {
    let d = data(decode(&dev(), &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0]));
    assert_eq!(d, vec![0, 0, 0x03, 0xe7, 0, 0, 2, 0]);
    let big = DeviceInfo::new(1 << 40, 512);
    let d = data(decode(&big, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0]));
    assert_eq!(&d[..4], &[0xff; 4], "too big for 10: 0xFFFFFFFF");
    assert_eq!(
        sense(decode(&dev(), &[0x25, 0, 0, 0, 0, 1, 0, 0, 0, 0])).1,
        asc::INVALID_FIELD_IN_CDB
    );
    let d = data(decode(&big, &cdb_read_capacity16()));
    assert_eq!(d.len(), 32);
    assert_eq!(
        u64::from_be_bytes(d[..8].try_into().unwrap()),
        (1 << 40) - 1
    );
    assert_eq!(u32::from_be_bytes(d[8..12].try_into().unwrap()), 512);
    assert_eq!(d[14] & 0xc0, 0xc0, "LBPME LBPRZ");
    let mut c = cdb_read_capacity16();
    c[1] = 0x11;
    assert_eq!(
        sense(decode(&dev(), &c)),
        (IR, asc::INVALID_FIELD_IN_CDB, Some(1))
    );
    c[1] = 0x10;
    c[13] = 12;
    assert_eq!(data(decode(&dev(), &c)).len(), 12);
}

#[test]
fn read_write_6_10_16() {
    let r = |lba, blocks| Range { lba, blocks };
    // READ(6): 21-bit LBA, 0 blocks = 256.
    assert_eq!(
        decode(&dev(), &[0x08, 0, 0, 5, 0, 0]),
        Ok(Action::Read {
            range: r(5, 256),
            fua: false
        })
    );
    assert_eq!(
        decode(&dev(), &[0x0a, 0, 0, 5, 3, 0]),
        Ok(Action::Write {
            range: r(5, 3),
            fua: false
        })
    );
    assert_eq!(
        sense(decode(&dev(), &[0x08, 0, 3, 0xe8, 1, 0])).1,
        asc::LBA_OUT_OF_RANGE
    );
    // READ(10)/WRITE(10) with FUA; zero length is a no-op transfer.
    assert_eq!(
        decode(&dev(), &[0x2a, 0x08, 0, 0, 0, 10, 0, 0, 4, 0]),
        Ok(Action::Write {
            range: r(10, 4),
            fua: true
        })
    );
    assert_eq!(
        decode(&dev(), &[0x28, 0, 0, 0, 3, 0xe8, 0, 0, 0, 0]),
        Ok(Action::Read {
            range: r(1000, 0),
            fua: false
        })
    );
    assert_eq!(
        decode(&dev(), &cdb_rw16(false, 999, 1, false)),
        Ok(Action::Read {
            range: r(999, 1),
            fua: false
        })
    );
    assert_eq!(
        decode(&dev(), &cdb_rw16(true, 0, 1000, true)),
        Ok(Action::Write {
            range: r(0, 1000),
            fua: true
        })
    );
    // Out of range, including overflow of lba + blocks.
    let (k, a, _) = sense(decode(&dev(), &cdb_rw16(false, 999, 2, false)));
    assert_eq!((k, a), (IR, asc::LBA_OUT_OF_RANGE));
    assert_eq!(
        sense(decode(&dev(), &cdb_rw16(true, u64::MAX, 2, false))).1,
        asc::LBA_OUT_OF_RANGE
    );
    assert_eq!(
        sense(decode(&dev(), &cdb_rw16(false, 1001, 0, false))).1,
        asc::LBA_OUT_OF_RANGE
    );
    let s = decode(&dev(), &cdb_rw16(false, 2000, 1, false)).unwrap_err();
    assert_eq!(s.info, Some(2000));
    // RDPROTECT: invalid field at byte 1. Too long: invalid field at the length.
    assert_eq!(
        sense(decode(&dev(), &[0x28, 0x20, 0, 0, 0, 0, 0, 0, 1, 0])),
        (IR, asc::INVALID_FIELD_IN_CDB, Some(1))
    );
    let big = DeviceInfo::new(1 << 30, 512);
    assert_eq!(
        sense(decode(&big, &cdb_rw16(false, 0, 16385, false))),
        (IR, asc::INVALID_FIELD_IN_CDB, Some(10))
    );
    // Writes to a read-only device: DATA PROTECT.
    for c in [
        &cdb_rw16(true, 0, 1, false)[..],
        &[0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0],
        &[0x0a, 0, 0, 0, 1, 0],
    ] {
        assert_eq!(
            sense(decode(&ro(), c)),
            (key::DATA_PROTECT, asc::WRITE_PROTECTED, None)
        );
    }
    assert!(decode(&ro(), &cdb_rw16(false, 0, 1, false)).is_ok());
    let a = decode(&dev(), &cdb_rw16(true, 0, 3, false)).unwrap();
    assert_eq!(a.data_out_len(&dev()), 1536);
    assert_eq!(a.data_in_len(&dev()), 0);
}

#[test]
fn synchronize_cache_10_and_16() {
    assert_eq!(
        decode(&dev(), &cdb_sync16(0, 0)),
        Ok(Action::Sync(Range {
            lba: 0,
            blocks: 1000
        }))
    );
    assert_eq!(
        decode(&dev(), &[0x35, 0x02, 0, 0, 0, 10, 0, 0, 5, 0]),
        Ok(Action::Sync(Range { lba: 10, blocks: 5 }))
    );
    assert_eq!(
        sense(decode(&dev(), &cdb_sync16(990, 20))).1,
        asc::LBA_OUT_OF_RANGE
    );
    assert!(decode(&ro(), &cdb_sync16(0, 0)).is_ok());
}

#[test]
fn mode_sense_6_and_10() {
    let d = data(decode(&dev(), &[0x1a, 0, 0x3f, 0, 255, 0]));
    assert_eq!(d[0] as usize, d.len() - 1);
    assert_eq!(d[2], 0x10, "DPOFUA, not WP");
    assert_eq!(d[3], 8, "block descriptor");
    assert_eq!(&d[4..8], &1000u32.to_be_bytes());
    assert_eq!(&d[9..12], &[0, 2, 0]);
    assert_eq!(d[12], 0x08, "caching page first");
    assert_eq!(d[14] & 0x04, 0x04, "WCE");
    assert_eq!(d[32], 0x0a, "control page");
    let d = data(decode(&ro(), &[0x1a, 0x08, 0x08, 0, 255, 0]));
    assert_eq!((d[2] & 0x80, d[3]), (0x80, 0), "WP, DBD");
    let d = data(decode(&dev(), &[0x5a, 0x10, 0x0a, 0, 0, 0, 0, 0, 255, 0]));
    assert_eq!(u16::from_be_bytes([d[0], d[1]]) as usize, d.len() - 2);
    assert_eq!(d[4], 1, "LONGLBA");
    assert_eq!(u16::from_be_bytes([d[6], d[7]]), 16);
    assert_eq!(d[8 + 16], 0x0a);
    // Changeable values: WCE not changeable.
    let d = data(decode(&dev(), &[0x1a, 0x08, 0x48, 0, 255, 0]));
    assert_eq!(d[6] & 0x04, 0);
    // Errors: saved values, unknown page, subpage.
    assert_eq!(
        sense(decode(&dev(), &[0x1a, 0, 0xc8, 0, 255, 0])),
        (IR, asc::SAVING_NOT_SUPPORTED, None)
    );
    assert_eq!(
        sense(decode(&dev(), &[0x1a, 0, 0x1c, 0, 255, 0])),
        (IR, asc::INVALID_FIELD_IN_CDB, Some(2))
    );
    assert_eq!(
        sense(decode(&dev(), &[0x5a, 0, 0x08, 1, 0, 0, 0, 0, 255, 0])),
        (IR, asc::INVALID_FIELD_IN_CDB, Some(3))
    );
    assert!(decode(&dev(), &[0x1a, 0, 0x3f, 0xff, 255, 0]).is_ok());
    assert_eq!(data(decode(&dev(), &[0x1a, 0, 0x3f, 0, 3, 0])).len(), 3);
}

#[test]
fn request_sense_and_report_luns() {
    let d = data(decode(&dev(), &[0x03, 0, 0, 0, 252, 0]));
    assert_eq!(Sense::from_bytes(&d), Some(Sense::no_sense()));
    assert_eq!(data(decode(&dev(), &[0x03, 0, 0, 0, 8, 0])).len(), 8);
    assert_eq!(
        sense(decode(&dev(), &[0x03, 1, 0, 0, 252, 0])),
        (IR, asc::INVALID_FIELD_IN_CDB, Some(1))
    );
    let d = data(decode(&dev(), &[0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]));
    assert_eq!(d, [&[0, 0, 0, 8][..], &[0; 12]].concat());
    assert_eq!(
        sense(decode(&dev(), &[0xa0, 0, 3, 0, 0, 0, 0, 0, 1, 0, 0, 0])),
        (IR, asc::INVALID_FIELD_IN_CDB, Some(2))
    );
    assert_eq!(
        sense(decode(&dev(), &[0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 0, 0])),
        (IR, asc::INVALID_FIELD_IN_CDB, Some(6))
    );
}

#[test]
fn unmap_and_write_same() {
    let (c, p) = unmap_request(&[(0, 10), (990, 10)]);
    assert_eq!(
        decode(&dev(), &c),
        Ok(Action::Unmap {
            param_len: p.len() as u16
        })
    );
    assert_eq!(
        decode_unmap(&dev(), &p),
        Ok(vec![
            Range { lba: 0, blocks: 10 },
            Range {
                lba: 990,
                blocks: 10
            }
        ])
    );
    let (_, bad) = unmap_request(&[(995, 10)]);
    assert_eq!(decode_unmap(&dev(), &bad).unwrap_err().asc, 0x21);
    let mut odd = p.clone();
    odd[3] = 15;
    assert_eq!(decode_unmap(&dev(), &odd).unwrap_err().asc, 0x26);
    assert_eq!(decode_unmap(&dev(), &p[..5]).unwrap_err().asc, 0x1a);
    assert_eq!(
        sense(decode(&ro(), &c)),
        (key::DATA_PROTECT, asc::WRITE_PROTECTED, None)
    );
    let mut anchor = c;
    anchor[1] = 1;
    assert_eq!(sense(decode(&dev(), &anchor)).2, Some(1));
    assert_eq!(
        decode(&dev(), &[0x42, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        Ok(Action::Good)
    );
    assert_eq!(
        sense(decode(&dev(), &[0x42, 0, 0, 0, 0, 0, 0, 0, 4, 0])).1,
        asc::PARAMETER_LIST_LENGTH
    );
    // WRITE SAME(16).
    let ws = decode(&dev(), &cdb_write_same16(5, 10, true, true)).unwrap();
    assert_eq!(
        ws,
        Action::WriteSame {
            range: Range { lba: 5, blocks: 10 },
            unmap: true,
            ndob: true
        }
    );
    assert_eq!(ws.data_out_len(&dev()), 0);
    let ws = decode(&dev(), &cdb_write_same16(5, 10, false, false)).unwrap();
    assert_eq!(ws.data_out_len(&dev()), 512);
    assert_eq!(
        sense(decode(&dev(), &cdb_write_same16(5, 0, false, true))).2,
        Some(10)
    );
    assert_eq!(
        sense(decode(&dev(), &cdb_write_same16(995, 10, false, true))).1,
        asc::LBA_OUT_OF_RANGE
    );
    assert_eq!(
        sense(decode(&ro(), &cdb_write_same16(0, 1, false, true))).0,
        key::DATA_PROTECT
    );
    let no_unmap = DeviceInfo {
        unmap: false,
        ..dev()
    };
    assert_eq!(sense(decode(&no_unmap, &c)).1, asc::INVALID_OPCODE);
    assert_eq!(
        sense(decode(&no_unmap, &cdb_write_same16(0, 1, true, true))).2,
        Some(1)
    );
}

#[test]
fn fuzz_entry_point_survives_edge_inputs() {
    fuzz_cdb(&[]);
    for op in 0..=255u8 {
        for fill in [0u8, 0xff, 0x5a] {
            let mut v = [fill; 40];
            v[0] = op;
            for n in 0..=v.len() {
                fuzz_cdb(&v[..n]);
            }
        }
    }
}

proptest::proptest! {
    #[test]
    fn decode_never_panics(cdb in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
                           blocks in proptest::prelude::any::<u64>(),
                           shift in 9u32..17) {
        let info = DeviceInfo::new(blocks, 1 << shift);
        if let Ok(a) = decode(&info, &cdb) {
            let _ = a.data_out_len(&info);
            if let Action::Unmap { .. } = a {
                let _ = decode_unmap(&info, &cdb);
            }
        }
        fuzz_cdb(&cdb);
    }
}
