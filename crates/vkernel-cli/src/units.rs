//! Values with units, on the command line and in the configuration file:
//! sizes (parse-size, through `vkernel_disk::backing::parse_size`) and
//! durations (humantime, through `vkernel::net::parse_duration`), both
//! refusing a bare number; and how `check-config` prints them.

use std::fmt;
use std::time::Duration;

use clap::Command;

/// A size in bytes, given with its unit (`64KiB`, `1M`, `512B`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size(pub u64);

impl Size {
    /// The value parser of every size option.
    pub fn parse(s: &str) -> Result<Size, String> {
        vkernel_disk::backing::parse_size(s)
            .map(Size)
            .map_err(|e| e.to_string())
    }

    /// The size as a `usize`, saturated (memory and buffer sizes).
    pub fn to_usize(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

impl fmt::Display for Size {
    /// The largest binary unit that divides the size exactly: `64 KiB`,
    /// `1536 B`, so what is printed reads back as the same number.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
        let (mut n, mut u) = (self.0, 0);
        while n != 0 && n % 1024 == 0 && u + 1 < UNITS.len() {
            n /= 1024;
            u += 1;
        }
        write!(f, "{n} {}", UNITS[u])
    }
}

/// A duration as `check-config` prints it: humantime's format (`1m 30s`,
/// `200ms`; `0s`).
pub fn show_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// The long help's note on values with units (also in the man pages).
pub const VALUES: &str = "\
Values with units: a bare number other than 0 is refused. A SIZE is a
number and its unit: 512B, 64KiB, 1M, 1.5G; K, M, G and T are powers of
1024 (1K = 1KB = 1KiB = 1024 bytes). A duration is humantime's: 200us,
5ms, 3s, 1m, 1h 30m.";

/// Adds [`VALUES`] to the long help of the top level and of every command
/// that takes a size or a duration (those that start a host all do),
/// after their own notes.
pub fn explain(root: Command) -> Command {
    let root = with_values(root);
    let names: Vec<String> = root
        .get_subcommands()
        .filter(|c| {
            c.get_name() == "check-config"
                || c.get_arguments().any(|a| {
                    a.get_id() == "host_timeout"
                        || a.get_value_names()
                            .is_some_and(|v| v.iter().any(|n| n == "SIZE"))
                })
        })
        .map(|c| c.get_name().to_string())
        .collect();
    names
        .iter()
        .fold(root, |root, name| root.mut_subcommand(name, with_values))
}

fn with_values(c: Command) -> Command {
    let own = c
        .get_after_long_help()
        .or_else(|| c.get_after_help())
        .map(|s| format!("{s}\n\n"))
        .unwrap_or_default();
    c.after_long_help(format!("{own}{VALUES}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print_in_the_largest_exact_unit_and_read_back() {
        for (bytes, shown) in [
            (0, "0 B"),
            (1536, "1536 B"),
            (64 << 10, "64 KiB"),
            (256 << 20, "256 MiB"),
            (3 << 30, "3 GiB"),
            (1 << 40, "1 TiB"),
        ] {
            assert_eq!(Size(bytes).to_string(), shown);
            assert_eq!(Size::parse(shown), Ok(Size(bytes)), "{shown}");
        }
        let e = Size::parse("65536").unwrap_err();
        assert!(e.contains("needs a unit: e.g. 65536B, 64KiB"), "{e}");
        assert_eq!(Size::parse("0"), Ok(Size(0)));
        assert_eq!(Size::parse("64k"), Ok(Size(65536)));
    }

    #[test]
    fn durations_print_with_units() {
        assert_eq!(show_duration(Duration::from_secs(90)), "1m 30s");
        assert_eq!(show_duration(Duration::from_millis(200)), "200ms");
        assert_eq!(show_duration(Duration::ZERO), "0s");
    }
}
