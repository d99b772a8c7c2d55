//! The machine a logical host runs on and the calling thread: what a
//! server reports as its load (a team server's LOAD answer, the kernel
//! server's) and what a benchmark pins and times.

pub use crate::sys::{load_average, online_cpus, pin_to_cpu, thread_cpu_time};
