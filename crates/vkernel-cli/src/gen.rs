//! `vkernel man` and `vkernel completions`: manual pages and shell
//! completion scripts generated from the command-line definition.

use std::path::PathBuf;

use clap::Command;
use clap_complete::Shell;

/// Arguments of `vkernel man`.
#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// Write vkernel.1 and one vkernel-COMMAND.1 per command into DIR
    /// (created if missing), e.g. /usr/local/share/man/man1. Without it:
    /// vkernel.1 to stdout (`vkernel man | man -l -`).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

/// Arguments of `vkernel completions`.
///
/// Install e.g. `vkernel completions bash >
/// /usr/local/share/bash-completion/completions/vkernel`, `vkernel
/// completions zsh > /usr/local/share/zsh/site-functions/_vkernel`,
/// `vkernel completions fish >
/// /usr/local/share/fish/vendor_completions.d/vkernel.fish` (or `source
/// <(vkernel completions bash)` in a shell).
#[derive(clap::Args, Debug)]
pub struct CompletionsArgs {
    /// The shell.
    shell: Shell,
}

/// Runs `vkernel man`.
pub fn man(a: ManArgs, root: Command) -> Result<(), String> {
    match a.out {
        Some(dir) => {
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            clap_mangen::generate_to(root, &dir).map_err(|e| format!("{}: {e}", dir.display()))
        }
        None => {
            let mut out = std::io::stdout().lock();
            clap_mangen::Man::new(root)
                .render(&mut out)
                .map_err(|e| format!("stdout: {e}"))
        }
    }
}

/// Runs `vkernel completions`.
pub fn completions(a: CompletionsArgs, mut root: Command) -> Result<(), String> {
    clap_complete::generate(a.shell, &mut root, "vkernel", &mut std::io::stdout());
    Ok(())
}
