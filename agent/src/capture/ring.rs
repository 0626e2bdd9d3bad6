//! Reading the kernel's BPF ring buffer in batches.
//!
//! The kernel's producer (a traced process, inside its syscall) reads the
//! consumer position on every reserve and commit, and the consumer reads
//! the producer position. aya's `RingBuf::next` publishes the consumer
//! position after every record, so with a busy engine on one CPU and the
//! agent on another, every record moves that cache line between them
//! and the engine pays the miss inside its syscall. This reader publishes
//! the position once per drained batch (and every [`PUBLISH_BYTES`] within
//! a long one, so the kernel gets space back while a burst is read), and
//! reads the producer position once per batch.
//!
//! Layout (the kernel's ABI, `kernel/bpf/ringbuf.c`): page 0 of the map's
//! fd holds the consumer position (read-write); from page 1, the producer
//! position page followed by the data pages mapped twice in a row, so a
//! record that wraps around the end reads as one slice. Each record is an
//! 8-byte header (`len` with a busy and a discard bit, then the page
//! offset) and `len` bytes, padded to 8.
//!
//! Owns: the two mappings. Must not: hand out a record after publishing
//! past it (the kernel may then reuse its bytes).

use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd},
    sync::atomic::{AtomicU32, AtomicU64, Ordering},
};

const BUSY: u32 = 1 << 31;
const DISCARD: u32 = 1 << 30;
const HEADER: u64 = 8;

/// Consumed bytes after which the position is published even in the
/// middle of a batch.
pub const PUBLISH_BYTES: u64 = 256 * 1024;

struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Mapping {
    fn new(fd: BorrowedFd<'_>, len: usize, prot: i32, offset: usize) -> io::Result<Self> {
        // SAFETY: a fresh shared mapping of the map's fd; checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { ptr, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

pub struct RingReader {
    consumer: Mapping,
    producer: Mapping,
    page: usize,
    mask: u64,
}

// SAFETY: the mappings are owned by the reader and only touched through
// `&mut self` (and the kernel, through atomics).
unsafe impl Send for RingReader {}

impl RingReader {
    /// Maps the ring buffer map `fd` of `byte_size` data bytes (a power of
    /// two multiple of the page size, as the kernel requires).
    pub fn new(fd: BorrowedFd<'_>, byte_size: u32) -> io::Result<Self> {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let size = byte_size as usize;
        if !size.is_power_of_two() || !size.is_multiple_of(page) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("ring buffer size {size} is not a power-of-two multiple of the page size"),
            ));
        }
        let consumer = Mapping::new(fd, page, libc::PROT_READ | libc::PROT_WRITE, 0)?;
        let producer = Mapping::new(fd, page + 2 * size, libc::PROT_READ, page)?;
        Ok(Self {
            consumer,
            producer,
            page,
            mask: size as u64 - 1,
        })
    }

    fn consumer_pos(&self) -> &AtomicU64 {
        // SAFETY: page 0 of the map starts with the kernel's u64 consumer
        // position, 8-aligned (page-aligned mapping).
        unsafe { &*(self.consumer.ptr as *const AtomicU64) }
    }

    fn producer_pos(&self) -> &AtomicU64 {
        // SAFETY: as above, the producer page.
        unsafe { &*(self.producer.ptr as *const AtomicU64) }
    }

    /// Calls `f` with every committed record, in order, stopping at the
    /// first one still being written or once `limit` bytes of records were
    /// consumed (so a producer faster than `f` cannot make one call last,
    /// and its output grow, without end); returns how many records were
    /// passed and whether it stopped at the limit with more to read.
    pub fn drain(&mut self, limit: u64, mut f: impl FnMut(&[u8])) -> (u64, bool) {
        // SAFETY: the data pages follow the producer page.
        let data = unsafe { (self.producer.ptr as *const u8).add(self.page) };
        let mut cons = self.consumer_pos().load(Ordering::Relaxed);
        let mut published = cons;
        let start = cons;
        let mut passed = 0;
        let mut more = false;
        'batches: loop {
            let prod = self.producer_pos().load(Ordering::Acquire);
            if cons >= prod {
                break;
            }
            while cons < prod {
                let off = (cons & self.mask) as usize;
                // SAFETY: `off` < size; the header is 8-aligned inside the
                // first copy of the data pages.
                let hdr = unsafe { &*(data.add(off) as *const AtomicU32) }.load(Ordering::Acquire);
                if hdr & BUSY != 0 {
                    break 'batches;
                }
                let len = (hdr & !(BUSY | DISCARD)) as u64;
                if hdr & DISCARD == 0 {
                    // SAFETY: a committed record of `len` bytes; it may run
                    // past the end of the first copy into the second,
                    // which maps the same pages (len ≤ size).
                    let rec = unsafe {
                        std::slice::from_raw_parts(data.add(off + HEADER as usize), len as usize)
                    };
                    f(rec);
                    passed += 1;
                }
                cons += (HEADER + len + 7) & !7;
                if cons - published >= PUBLISH_BYTES {
                    self.consumer_pos().store(cons, Ordering::Release);
                    published = cons;
                }
                if cons - start >= limit {
                    more = cons < self.producer_pos().load(Ordering::Acquire);
                    break 'batches;
                }
            }
        }
        if cons != published {
            self.consumer_pos().store(cons, Ordering::Release);
        }
        (passed, more)
    }
}
