//! What another user's program tries on a machine host shared by several
//! users (tests/shared_host.rs runs it as `nobody`). Each role attaches to
//! the host at PATH, makes one process, tries one thing, and prints one
//! line: what happened.
//!
//! - `setpid PATH ID`: registers itself under logical id ID (hex);
//!   prints `registered` or `refused PID` (who ID names instead).
//! - `clear PATH ID`: removes the registration of ID; `cleared` or `kept PID`.
//! - `destroy PATH PID`: Destroy; `ok` or the error.
//! - `ks-destroy PATH PID`: asks this host's kernel server to destroy PID;
//!   `ok`, `status N` or the error.
//! - `join PATH GROUP PID` / `leave PATH GROUP PID`: JoinGroup/LeaveGroup
//!   of PID (or `self`); `ok` or the error.
//! - `principal PATH N TO`: SetPrincipal(N), then one Send to TO, which
//!   answers with the principal it saw in word 1: `seen as P`.
//! - `forward PATH VICTIM`: prints its pid, receives one Send and forwards
//!   it to the kernel server rewritten as a destroy of VICTIM; prints
//!   `forwarded` or the error (and then replies).

use std::io::Write;

use vkernel::kernel_server::{field, DESTROY_PROCESS};
use vkernel::{Kernel, Message, Pid, Process, Scope};

fn hex(s: &str) -> u32 {
    u32::from_str_radix(s, 16).unwrap_or(0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize| args.get(i).map(String::as_str).unwrap_or("");
    let k = match Kernel::attach(arg(2)) {
        Ok(k) => k,
        Err(e) => return println!("cannot attach: {e}"),
    };
    let p = match k.create_process() {
        Ok(p) => p,
        Err(e) => return println!("cannot create a process: {e}"),
    };
    let pid_arg = |s: &str| if s == "self" { p.pid() } else { Pid(hex(s)) };
    let out = match arg(1) {
        "setpid" => {
            p.set_pid(hex(arg(3)), p.pid(), Scope::Any);
            match p.get_pid(hex(arg(3)), Scope::Local) {
                Ok(x) if x == p.pid() => "registered".to_string(),
                Ok(x) => format!("refused {x}"),
                Err(e) => e.to_string(),
            }
        }
        "clear" => {
            p.set_pid(hex(arg(3)), Pid::NONE, Scope::Any);
            match p.get_pid(hex(arg(3)), Scope::Local) {
                Ok(x) if x.is_none() => "cleared".to_string(),
                Ok(x) => format!("kept {x}"),
                Err(e) => e.to_string(),
            }
        }
        "destroy" => result(p.destroy(Pid(hex(arg(3))))),
        "ks-destroy" => {
            let mut m = Message::with_code(DESTROY_PROCESS);
            m.set_word(field::PID, hex(arg(3)));
            match p.send(&mut m, k.kernel_server()) {
                Ok(_) if m.word(field::STATUS) == 0 => "ok".to_string(),
                Ok(_) => format!("status {}", m.word(field::STATUS)),
                Err(e) => e.to_string(),
            }
        }
        "join" => result(p.join_group(Pid(hex(arg(3))), pid_arg(arg(4)))),
        "leave" => result(p.leave_group(Pid(hex(arg(3))), pid_arg(arg(4)))),
        "principal" => {
            p.set_principal(hex(arg(3)));
            let mut m = Message::with_code(1);
            match p.send(&mut m, Pid(hex(arg(4)))) {
                Ok(_) => format!("seen as {}", m.word(1)),
                Err(e) => e.to_string(),
            }
        }
        "forward" => forward(&k, &p, Pid(hex(arg(3)))),
        _ => "usage: shared_host_role setpid|clear|destroy|ks-destroy|join|leave|principal|forward PATH ...".to_string(),
    };
    println!("{out}");
    let _ = std::io::stdout().flush();
}

fn result(r: Result<(), vkernel::IpcError>) -> String {
    r.map_or_else(|e| e.to_string(), |()| "ok".to_string())
}

fn forward(k: &Kernel, p: &Process, victim: Pid) -> String {
    println!("{}", p.pid());
    let _ = std::io::stdout().flush();
    let mut m = Message::zero();
    let from = match p.receive(&mut m) {
        Ok(i) => i.from,
        Err(e) => return e.to_string(),
    };
    let mut req = Message::with_code(DESTROY_PROCESS);
    req.set_word(field::PID, victim.0);
    match p.forward(&req, from, k.kernel_server()) {
        Ok(()) => "forwarded".to_string(),
        Err(e) => {
            let _ = p.reply(&Message::zero(), from);
            e.to_string()
        }
    }
}
