//! The host's microsecond clock for the engine.
//!
//! Every engine call reads the clock once, so a remote exchange reads it
//! four times on its critical path. Through the vDSO `clock_gettime` costs
//! about 24 ns here; where the Linux kernel itself keeps time with an
//! invariant TSC (clocksource `tsc`, which it only selects once it has
//! found the counter synchronized across CPUs and stable), reading the
//! counter directly costs about 8 ns. Elsewhere the clock is `Instant`.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use vkernel_proto::Micros;

/// Microseconds since a host's start.
pub(crate) struct Clock {
    epoch: Instant,
    tsc: Option<Tsc>,
}

/// A calibrated TSC: µs = (ticks - base) * mult >> SHIFT.
#[derive(Clone, Copy)]
struct Tsc {
    base: u64,
    mult: u64,
}

const SHIFT: u32 = 32;

impl Clock {
    /// A clock starting at zero now.
    pub(crate) fn new() -> Clock {
        let mult = tsc_mult();
        let epoch = Instant::now();
        Clock {
            epoch,
            tsc: mult.map(|mult| Tsc {
                base: read_tsc(),
                mult,
            }),
        }
    }

    /// Microseconds since [`Clock::new`].
    pub(crate) fn now(&self) -> Micros {
        match self.tsc {
            Some(t) => {
                ((u128::from(read_tsc().saturating_sub(t.base)) * u128::from(t.mult)) >> SHIFT)
                    as Micros
            }
            None => self.epoch.elapsed().as_micros() as Micros,
        }
    }

    /// True if the clock reads the TSC.
    #[cfg(test)]
    pub(crate) fn uses_tsc(&self) -> bool {
        self.tsc.is_some()
    }
}

#[cfg(target_arch = "x86_64")]
fn read_tsc() -> u64 {
    // SAFETY: RDTSC exists on every x86-64 CPU and has no memory effects;
    // the intrinsic is `unsafe` only because it is an intrinsic.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
fn read_tsc() -> u64 {
    0
}

/// µs per tick (scaled by 2^SHIFT), measured once per OS process, or
/// `None` if the TSC is not the kernel's clocksource.
fn tsc_mult() -> Option<u64> {
    static MULT: OnceLock<Option<u64>> = OnceLock::new();
    *MULT.get_or_init(|| {
        if !cfg!(target_arch = "x86_64") || std::env::var_os("VKERNEL_NO_TSC").is_some() {
            return None;
        }
        let src = std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .ok()?;
        let flags = std::fs::read_to_string("/proc/cpuinfo").ok()?;
        if src.trim() != "tsc" || !flags.contains("constant_tsc") || !flags.contains("nonstop_tsc")
        {
            return None;
        }
        calibrate(Duration::from_millis(5))
    })
}

/// Ticks per µs against the monotonic clock over `span`.
fn calibrate(span: Duration) -> Option<u64> {
    let (t0, c0) = (Instant::now(), read_tsc());
    while t0.elapsed() < span {
        std::hint::spin_loop();
    }
    let (us, ticks) = (
        t0.elapsed().as_secs_f64() * 1e6,
        read_tsc().wrapping_sub(c0),
    );
    if ticks == 0 || us <= 0.0 {
        return None;
    }
    let mult = us / ticks as f64 * (1u64 << SHIFT) as f64;
    // A counter slower than 10 MHz or faster than 100 GHz is not a TSC.
    (mult.is_finite() && mult > (1u64 << SHIFT) as f64 / 1e5 && mult < (1u64 << SHIFT) as f64 * 0.1)
        .then_some(mult as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_follows_the_monotonic_clock() {
        let c = Clock::new();
        let t = Instant::now();
        let a = c.now();
        std::thread::sleep(Duration::from_millis(30));
        let b = c.now();
        let real = t.elapsed().as_micros() as Micros;
        assert!(b >= a, "{a} then {b}");
        // Within 5 % (plus scheduling slack) of what Instant measured.
        let d = b - a;
        assert!(
            d * 100 >= real * 95 && d <= real + real / 20 + 2_000,
            "clock advanced {d} us while Instant saw {real} us (tsc: {})",
            c.uses_tsc()
        );
    }

    #[test]
    fn tsc_reads_advance_and_calibrate() {
        if !cfg!(target_arch = "x86_64") {
            return;
        }
        let a = read_tsc();
        let b = read_tsc();
        assert!(b >= a);
        // Calibration works wherever RDTSC counts (even if the kernel does
        // not use it as its clocksource).
        assert!(calibrate(Duration::from_millis(2)).is_some());
    }
}
