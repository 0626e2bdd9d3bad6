//! Kernel timestamps (`bpf_ktime_get_ns`, CLOCK_MONOTONIC) to wall-clock.

/// realtime − monotonic, in nanoseconds, measured at construction.
#[derive(Clone, Copy, Debug)]
pub struct ClockOffset {
    offset_ns: i128,
}

fn now(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec; both clocks always exist on Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
}

/// Monotonic clock now, in the kernel's `bpf_ktime_get_ns` units.
pub fn monotonic_ns() -> u64 {
    now(libc::CLOCK_MONOTONIC) as u64
}

impl ClockOffset {
    /// Samples realtime/monotonic/realtime several times and keeps the
    /// tightest bracket, so the offset is good to a microsecond or so.
    pub fn measure() -> Self {
        let mut best = (i128::MAX, 0i128);
        for _ in 0..16 {
            let r1 = now(libc::CLOCK_REALTIME);
            let m = now(libc::CLOCK_MONOTONIC);
            let r2 = now(libc::CLOCK_REALTIME);
            let width = r2 - r1;
            if width < best.0 {
                best = (width, (r1 + r2) / 2 - m);
            }
        }
        Self { offset_ns: best.1 }
    }

    pub fn to_wall_ns(&self, mono_ns: u64) -> u64 {
        (mono_ns as i128 + self.offset_ns).max(0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converted_monotonic_now_is_close_to_system_time_now() {
        let off = ClockOffset::measure();
        let wall = off.to_wall_ns(monotonic_ns()) as i128;
        let sys = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i128;
        assert!((wall - sys).abs() < 50_000_000, "off by {} ns", wall - sys);
    }
}
