//! The fixed newstyle handshake: options until EXPORT_NAME or GO.

use super::*;

pub(super) fn violation<T>(s: impl Into<String>) -> Result<T, NbdError> {
    Err(NbdError::Protocol(s.into()))
}

pub(super) fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}
pub(super) fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

pub(super) fn option_reply(
    w: &mut impl Write,
    option: u32,
    ty: u32,
    data: &[u8],
) -> io::Result<()> {
    let mut b = Vec::with_capacity(20 + data.len());
    b.extend_from_slice(&REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&ty.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    w.write_all(&b)
}

/// The outcome of the handshake.
#[derive(Debug)]
pub enum Negotiated {
    /// Transmission begins on this export.
    Go(Export),
    /// The client aborted (or left) during option haggling.
    Aborted,
}

pub(super) fn find<'a>(exports: &'a [Export], name: &[u8]) -> Option<&'a Export> {
    if name.is_empty() {
        return exports.first();
    }
    exports.iter().find(|e| e.name.as_bytes() == name)
}

/// Runs the fixed newstyle handshake on a stream.
pub fn handshake<S: Read + Write>(s: &mut S, exports: &[Export]) -> Result<Negotiated, NbdError> {
    s.write_all(&hello())?;
    s.flush()?;
    negotiate(s, exports)
}

/// The handshake after the server's hello: the client's flags and options.
pub(super) fn negotiate<S: Read + Write>(
    s: &mut S,
    exports: &[Export],
) -> Result<Negotiated, NbdError> {
    let cflags = read_u32(s)?;
    if cflags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        return violation(format!("unknown client flags {cflags:#x}"));
    }
    let no_zeroes = cflags & FLAG_C_NO_ZEROES != 0;
    loop {
        let magic = match read_u64(s) {
            Ok(m) => m,
            // Leaving during haggling is allowed (a hard disconnect).
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(Negotiated::Aborted),
            Err(e) => return Err(e.into()),
        };
        if magic != IHAVEOPT {
            return violation(format!("option magic {magic:#x}"));
        }
        let option = read_u32(s)?;
        let len = read_u32(s)?;
        if len > MAX_OPTION {
            return violation(format!("option of {len} bytes"));
        }
        let mut data = vec![0u8; len as usize];
        s.read_exact(&mut data)?;
        match option {
            opt::EXPORT_NAME => {
                let Some(e) = find(exports, &data) else {
                    // No way to report the error: terminate the session.
                    return violation("EXPORT_NAME of an unknown export");
                };
                let mut b = Vec::with_capacity(134);
                b.extend_from_slice(&e.size().to_be_bytes());
                b.extend_from_slice(&e.flags().to_be_bytes());
                if !no_zeroes {
                    b.extend_from_slice(&[0u8; 124]);
                }
                s.write_all(&b)?;
                s.flush()?;
                return Ok(Negotiated::Go(e.clone()));
            }
            opt::ABORT => {
                // The client may already have closed: ignore errors.
                let _ = option_reply(s, option, rep::ACK, &[]);
                let _ = s.flush();
                return Ok(Negotiated::Aborted);
            }
            opt::LIST => {
                if !data.is_empty() {
                    option_reply(s, option, rep::ERR_INVALID, &[])?;
                } else {
                    for e in exports {
                        let mut d = Vec::with_capacity(4 + e.name.len());
                        d.extend_from_slice(&(e.name.len() as u32).to_be_bytes());
                        d.extend_from_slice(e.name.as_bytes());
                        option_reply(s, option, rep::SERVER, &d)?;
                    }
                    option_reply(s, option, rep::ACK, &[])?;
                }
            }
            opt::INFO | opt::GO => {
                let Some((name, reqs)) = parse_info_request(&data) else {
                    option_reply(s, option, rep::ERR_INVALID, &[])?;
                    s.flush()?;
                    continue;
                };
                let Some(e) = find(exports, name) else {
                    option_reply(s, option, rep::ERR_UNKNOWN, &[])?;
                    s.flush()?;
                    continue;
                };
                let mut d = Vec::with_capacity(12);
                d.extend_from_slice(&info::EXPORT.to_be_bytes());
                d.extend_from_slice(&e.size().to_be_bytes());
                d.extend_from_slice(&e.flags().to_be_bytes());
                option_reply(s, option, rep::INFO, &d)?;
                // Block size constraints are always sent (the spec allows
                // unrequested information; clients ignore what they skip).
                let mut d = Vec::with_capacity(14);
                d.extend_from_slice(&info::BLOCK_SIZE.to_be_bytes());
                let min = e.dev.block_size().max(1);
                d.extend_from_slice(&min.to_be_bytes());
                d.extend_from_slice(&PREFERRED_BLOCK.max(min).to_be_bytes());
                d.extend_from_slice(&MAX_PAYLOAD.to_be_bytes());
                option_reply(s, option, rep::INFO, &d)?;
                for r in reqs {
                    let (ty, text) = match r {
                        info::NAME => (info::NAME, e.name.as_bytes()),
                        info::DESCRIPTION => (info::DESCRIPTION, e.description.as_bytes()),
                        _ => continue,
                    };
                    let mut d = Vec::with_capacity(2 + text.len());
                    d.extend_from_slice(&ty.to_be_bytes());
                    d.extend_from_slice(text);
                    option_reply(s, option, rep::INFO, &d)?;
                }
                option_reply(s, option, rep::ACK, &[])?;
                s.flush()?;
                if option == opt::GO {
                    return Ok(Negotiated::Go(e.clone()));
                }
            }
            _ => option_reply(s, option, rep::ERR_UNSUP, &[])?,
        }
        s.flush()?;
    }
}

/// Parses INFO/GO data: (name, information requests); `None` if malformed.
pub fn parse_info_request(d: &[u8]) -> Option<(&[u8], Vec<u16>)> {
    let n = u32::from_be_bytes(d.get(0..4)?.try_into().ok()?) as usize;
    let name = d.get(4..4usize.checked_add(n)?)?;
    let rest = &d[4 + n..];
    let k = u16::from_be_bytes(rest.get(0..2)?.try_into().ok()?) as usize;
    let list = rest.get(2..)?;
    if list.len() != 2 * k {
        return None;
    }
    Some((
        name,
        list.chunks_exact(2)
            .map(|c| u16::from_be_bytes([c[0], c[1]]))
            .collect(),
    ))
}
