//! Cluster keys: authenticated and encrypted exchanges, rejections.

use super::*;

fn keyed(id: u8, secret: u8, encrypt: bool) -> crate::auth::AuthConfig {
    crate::auth::AuthConfig {
        cipher: crate::auth::Cipher::default(),
        keys: vec![crate::auth::Key {
            id,
            secret: [secret; 32],
        }],
        send_key: id,
        encrypt,
        counter_start: 1 << 40,
        max_skew: 1_000_000,
        salt: secret as u32,
    }
}

#[test]
fn keyed_hosts_talk_and_reject_replays_forgeries_and_strangers() {
    use crate::auth::Reject;
    for encrypt in [false, true] {
        let mut n = Net::with(3, |i, c| {
            c.auth = match i {
                0 | 1 => Some(keyed(1, 0x11, encrypt)),
                _ => Some(keyed(1, 0x22, encrypt)), // same id, other secret
            }
        });
        let s = n.e[0].create_process().unwrap();
        let c = n.e[1].create_process().unwrap();
        let page = pattern(3, 3000);
        n.e[1]
            .send(
                n.now,
                c,
                s,
                seg_msg(5, SegAccess::READ),
                Some(SharedBuf::new(page.clone()).lend()),
            )
            .unwrap();
        let mark = n.sent.len();
        n.run();
        let req = n.sent[mark].data.clone();
        let buf = SharedBuf::new(vec![0u8; 4096]);
        let r = n.e[0]
            .receive(n.now, s, None, Some(buf.lend()))
            .unwrap()
            .unwrap();
        assert_eq!((r.from, r.seg_bytes), (c, 3000));
        same_bytes(&buf.snapshot()[..3000], &page, "appended page through auth");
        if encrypt {
            assert!(
                !req.windows(64).any(|w| w == &page[..64]),
                "page travels encrypted"
            );
        }
        // The captured request replayed: rejected before the protocol.
        let dups = n.e[0].stats().duplicates;
        n.inject(0, 1, &req);
        assert_eq!(n.e[0].stats().auth_rejects_of(Reject::Replay), 1);
        assert_eq!(n.e[0].stats().duplicates, dups);
        let before = n.e[0].stats().clone();
        // Bit flips anywhere, truncation, no key, unknown key.
        for k in [3usize, 9, 14, 30, 60, req.len() / 2, req.len() - 1] {
            let mut f = req.clone();
            f[k] ^= 1;
            n.inject(0, 1, &f);
        }
        n.inject(0, 1, &req[..70]);
        let mut plain = req.clone();
        plain[5] = 0;
        n.inject(0, 1, &plain);
        let mut other = req.clone();
        other[5] = 9;
        n.inject(0, 1, &other);
        let st = n.e[0].stats();
        let rejected: u64 =
            st.auth_rejects.iter().sum::<u64>() - before.auth_rejects.iter().sum::<u64>();
        // The replay was counted before `before` was taken.
        assert_eq!(rejected, 7 + 3, "{:?}", st.auth_rejects);
        let delta = |r: Reject| st.auth_rejects_of(r) - before.auth_rejects_of(r);
        assert_eq!(delta(Reject::NoKey), 1);
        assert_eq!(delta(Reject::UnknownKey), 1);
        assert_eq!(delta(Reject::Truncated), 1);
        assert_eq!(st.rx, before.rx, "nothing rejected reached the protocol");
        // The exchange still completes.
        n.e[0]
            .reply(n.now, s, c, Message::with_code(6), None)
            .unwrap();
        n.run();
        assert_eq!(reply_of(&mut n.e[1], c).msg.code(), 6);
        // A host with another secret under the same id is not heard.
        let x = n.e[2].create_process().unwrap();
        n.e[2]
            .send(n.now, x, s, Message::with_code(7), None)
            .unwrap();
        n.run();
        assert!(n.e[0].stats().auth_rejects_of(Reject::BadTag) >= 1);
        assert!(!completed(&n.e[0], s));
        n.advance(4_000_000);
        assert!(matches!(send_err(&mut n.e[2], x), IpcError::Timeout(_)));
    }
}

#[test]
fn every_datagram_names_the_reply_port_under_the_mac() {
    // The runtime may send from a side socket: the engine names its main
    // port in every datagram, before sealing, so keyed hosts still talk.
    for auth in [false, true] {
        let mut n = Net::with(2, |i, c| {
            c.reply_port = addr(i).port();
            if auth {
                c.auth = Some(keyed(1, 0x11, false));
            }
        });
        let s = n.e[0].create_process().unwrap();
        let c = n.e[1].create_process().unwrap();
        assert_eq!(n.e[0].receive(n.now, s, None, None).unwrap(), None);
        let mark = n.sent.len();
        n.e[1]
            .send(n.now, c, s, Message::with_code(3), None)
            .unwrap();
        n.run();
        let r = received(&mut n.e[0], s);
        n.e[0]
            .reply(n.now, s, r.from, Message::with_code(4), None)
            .unwrap();
        n.run();
        assert_eq!(reply_of(&mut n.e[1], c).msg.code(), 4, "auth {auth}");
        let named: Vec<u16> = n.sent[mark..]
            .iter()
            .map(|x| u16::from_be_bytes([x.data[6], x.data[7]]))
            .collect();
        assert_eq!(named, vec![addr(1).port(), addr(0).port()], "auth {auth}");
        assert_eq!(n.e[0].stats().auth_rejects.iter().sum::<u64>(), 0);
    }
}
