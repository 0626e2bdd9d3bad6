//! Joins the records of one syscall (a payload larger than one record is
//! split into follow-up records with increasing `offset`) back into one
//! call. Pure: no I/O.
//!
//! Records of one call come from one thread, in order; another thread's
//! records may interleave. A missing piece (a dropped record) ends the
//! call early: what arrived is delivered, shorter than `ret`, so the loss
//! is visible downstream instead of silently corrupting the stream.

use std::collections::HashMap;

use agent_ebpf::RecordHeader;

#[derive(Default)]
pub struct Reassembler {
    pending: HashMap<u32, (RecordHeader, Vec<u8>)>,
    /// Calls delivered incomplete because a record was missing.
    pub gaps: u64,
}

impl Reassembler {
    /// Feed one data record; completed calls are appended to `out`.
    pub fn push(
        &mut self,
        hdr: RecordHeader,
        payload: &[u8],
        out: &mut Vec<(RecordHeader, Vec<u8>)>,
    ) {
        let tid = hdr.tid;
        if hdr.offset == 0 {
            if let Some(p) = self.pending.remove(&tid) {
                self.gaps += 1;
                out.push(p);
            }
            if payload.len() as u64 >= hdr.total_len as u64 {
                out.push((hdr, payload.to_vec()));
            } else {
                let mut data = Vec::with_capacity(hdr.total_len as usize);
                data.extend_from_slice(payload);
                self.pending.insert(tid, (hdr, data));
            }
            return;
        }
        match self.pending.get_mut(&tid) {
            Some((start, data))
                if start.ts_ns == hdr.ts_ns
                    && start.fd == hdr.fd
                    && data.len() as u64 == hdr.offset as u64 =>
            {
                data.extend_from_slice(payload);
                if data.len() as u64 >= start.total_len as u64 {
                    if let Some(done) = self.pending.remove(&tid) {
                        out.push(done);
                    }
                }
            }
            Some(_) => {
                self.gaps += 1;
                if let Some(p) = self.pending.remove(&tid) {
                    out.push(p);
                }
            }
            None => {
                // The start of this call was lost: report the call with no
                // bytes so the gap is visible.
                self.gaps += 1;
                let mut h = hdr;
                h.offset = 0;
                out.push((h, Vec::new()));
            }
        }
    }

    /// Deliver every incomplete call (at shutdown).
    pub fn flush(&mut self, out: &mut Vec<(RecordHeader, Vec<u8>)>) {
        let mut rest: Vec<_> = self.pending.drain().map(|(_, v)| v).collect();
        rest.sort_by_key(|(h, _)| h.ts_ns);
        self.gaps += rest.len() as u64;
        out.extend(rest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr(tid: u32, ts: u64, total: u32, offset: u32, cap: u32) -> RecordHeader {
        RecordHeader {
            ts_ns: ts,
            ret: total as i64,
            tgid: 1,
            tid,
            fd: 3,
            total_len: total,
            offset,
            cap_len: cap,
            kind: 1,
            ..Default::default()
        }
    }

    #[test]
    fn single_record_call_passes_straight_through() {
        let mut r = Reassembler::default();
        let mut out = vec![];
        r.push(hdr(1, 10, 3, 0, 3), b"abc", &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].1, b"abc");
        assert_eq!(r.gaps, 0);
    }

    #[test]
    fn interleaved_threads_are_joined_per_thread() {
        let mut r = Reassembler::default();
        let mut out = vec![];
        r.push(hdr(1, 10, 4, 0, 2), b"ab", &mut out);
        r.push(hdr(2, 11, 2, 0, 1), b"x", &mut out);
        r.push(hdr(1, 10, 4, 2, 2), b"cd", &mut out);
        r.push(hdr(2, 11, 2, 1, 1), b"y", &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].1, b"abcd");
        assert_eq!(out[1].1, b"xy");
        assert_eq!(r.gaps, 0);
    }

    #[test]
    fn a_missing_middle_record_delivers_the_prefix_and_counts_a_gap() {
        let mut r = Reassembler::default();
        let mut out = vec![];
        r.push(hdr(1, 10, 6, 0, 2), b"ab", &mut out);
        r.push(hdr(1, 10, 6, 4, 2), b"ef", &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].1, b"ab");
        assert_eq!(out[0].0.ret, 6);
        assert_eq!(r.gaps, 1);
    }

    #[test]
    fn a_lost_start_is_reported_as_an_empty_call() {
        let mut r = Reassembler::default();
        let mut out = vec![];
        r.push(hdr(1, 10, 6, 2, 2), b"cd", &mut out);
        assert_eq!(out.len(), 1);
        assert!(out[0].1.is_empty());
        assert_eq!(out[0].0.ret, 6);
    }

    #[test]
    fn flush_delivers_incomplete_calls() {
        let mut r = Reassembler::default();
        let mut out = vec![];
        r.push(hdr(1, 10, 6, 0, 2), b"ab", &mut out);
        assert!(out.is_empty());
        r.flush(&mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(r.gaps, 1);
    }
}
