//! The bench's output: its tables go to stdout through [`outln!`], and its
//! progress to stderr, as a bar with an ETA on a terminal (indicatif) or
//! as plain lines elsewhere. One place so that a table line never tears
//! the bar, and so that a closed stdout (`vkernel bench | head`) ends the
//! run quietly instead of panicking in `println!`.

use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The bar on screen, if any: lines printed while it shows are printed
/// with it hidden.
static BAR: Mutex<Option<ProgressBar>> = Mutex::new(None);

fn bar() -> Option<ProgressBar> {
    BAR.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Prints one line on stdout (what [`outln!`] expands to). A reader that
/// went away ends the program with status 0, as `head` expects of it.
pub fn line(args: std::fmt::Arguments<'_>) {
    let write = || {
        let mut o = std::io::stdout().lock();
        o.write_fmt(args).and_then(|()| o.write_all(b"\n"))
    };
    let r = match bar() {
        Some(b) => b.suspend(write),
        None => write(),
    };
    if let Err(e) = r {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        // Another failure (a full disk) loses the line, not the run.
    }
}

/// `println!` for the bench's tables: see [`line`].
#[macro_export]
macro_rules! outln {
    () => {
        $crate::out::line(format_args!(""))
    };
    ($($t:tt)*) => {
        $crate::out::line(format_args!($($t)*))
    };
}

/// Progress through steps of known relative cost: a bar with percent
/// done and an ETA when stderr is a terminal, otherwise one line per step
/// (`vkernel bench: section 5 (12 s so far)`).
pub struct Progress {
    bar: Option<ProgressBar>,
    /// Without a terminal: a line per step (else nothing).
    lines: bool,
    what: &'static str,
    started: Instant,
    done: u64,
}

impl Progress {
    /// Progress of `what` (the line prefix, e.g. "vkernel bench") over
    /// steps whose weights add up to `total`.
    pub fn new(what: &'static str, total: u64) -> Progress {
        Progress::make(what, total, true)
    }

    /// A bar on a terminal as [`Progress::new`], and nothing elsewhere.
    pub fn bar_only(what: &'static str, total: u64) -> Progress {
        Progress::make(what, total, false)
    }

    fn make(what: &'static str, total: u64, lines: bool) -> Progress {
        let bar = std::io::IsTerminal::is_terminal(&std::io::stderr()).then(|| {
            let b = ProgressBar::with_draw_target(Some(total.max(1)), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{prefix} [{elapsed_precise}] [{bar:30}] {percent:>3}% ETA {eta}  {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            b.set_style(style);
            b.set_prefix(what);
            b.enable_steady_tick(Duration::from_millis(200));
            b
        });
        *BAR.lock().unwrap_or_else(|e| e.into_inner()) = bar.clone();
        Progress {
            bar,
            lines,
            what,
            started: Instant::now(),
            done: 0,
        }
    }

    /// A step named `label` starts; it weighs `weight` of the total.
    /// Returns a guard that counts it done when dropped.
    pub fn step(&mut self, label: &str, weight: u64) -> Step<'_> {
        match &self.bar {
            Some(b) => b.set_message(label.to_string()),
            None if !self.lines => {}
            None => eprintln!(
                "{}: {label} ({:.0} s so far)",
                self.what,
                self.started.elapsed().as_secs_f64()
            ),
        }
        Step { p: self, weight }
    }

    /// `n` more of the total are done (for steps too many to name).
    pub fn advance(&mut self, n: u64) {
        self.done += n;
        if let Some(b) = &self.bar {
            b.set_position(self.done);
        }
    }

    /// Removes the bar (the run's last lines follow).
    pub fn finish(self) {}
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
        *BAR.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// One step in progress: see [`Progress::step`].
pub struct Step<'a> {
    p: &'a mut Progress,
    weight: u64,
}

impl Drop for Step<'_> {
    fn drop(&mut self) {
        self.p.done += self.weight;
        if let Some(b) = &self.p.bar {
            b.set_position(self.p.done);
        }
    }
}
